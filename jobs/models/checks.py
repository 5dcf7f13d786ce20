"""Checking before submission: :func:`check_buildable`, the launcher's refusal, with the fix, of a
model the ranks could not build (the checks that need no import are ModelSpec.validate's)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from jobs.models.build import REGISTRY, require_input
from jobs.models.instantiate import InstantiationError, instantiate, locate
from jobs.spec import HF_INSTALL, ConfigError, InputKind, LMHead, ModelSpec, import_problem

_TARGET_FIX = ("set model._target_ to an nn.Module subclass, or a function returning one, importable on the "
               "nodes (e.g. torch.nn.Linear, torchvision.models.resnet50, transformers.GPT2LMHeadModel).")


def check_buildable(spec: ModelSpec) -> None:
    """Refuse, before anything is submitted, a model the ranks could not build; raise ConfigError.

    Runs after composition, on the launcher's host (which needs the same packages as the nodes):
    it imports torch and, for transformers models, transformers, and builds the model on the meta
    device (no memory, no weights read), so a bad dotted path, a ``_target_`` that is not a model
    (``os.path.join``), wrong params, an architecture transformers does not know, a config that
    does not build, a vocabulary or position count that disagrees with model.vocab_size /
    model.seq_len, or an input kind the model does not take are all caught here with the fix.
    """
    target = spec.target_path
    if target:
        _check_target(spec, target)
    elif spec.name == "hf":
        _check_hf(spec)
    else:
        _check_named(spec)


def _on_meta(factory: Callable[[], Any]) -> Any:
    with torch.device("meta"):
        return factory()


def _check_target(spec: ModelSpec, target: str) -> None:
    import inspect

    setting = "model._target_" if spec._target_ else "model.target"
    try:
        fn = locate(target)
    except InstantiationError as exc:
        if isinstance(exc.__cause__, AttributeError) or not isinstance(exc.__cause__, ImportError):
            raise ConfigError(setting, target, f"does not import here: {exc}", _TARGET_FIX) from exc
        problem = import_problem(target.rpartition(".")[0]) or f"{exc}"
        raise ConfigError(setting, target, f"does not import: {problem}.", "install that package where the "
                          "launcher and the ranks run, or name a class of a package installed there.") from exc
    is_class = inspect.isclass(fn)
    if is_class and not issubclass(fn, nn.Module):
        raise ConfigError(setting, target, f"is a class, {fn.__module__}.{fn.__qualname__}, but not a "
                          "torch.nn.Module subclass.", _TARGET_FIX)
    if not callable(fn):
        raise ConfigError(setting, target, f"is a {type(fn).__name__}, not a class or a function.", _TARGET_FIX)
    try:
        model = _on_meta(lambda: instantiate({"_target_": target, **spec.params}))
    except InstantiationError as exc:
        if is_class:
            raise ConfigError("model.params", dict(spec.params), f"building {target} with them (on the meta "
                              f"device) failed: {exc}", f"give model.params the keyword arguments "
                              f"{fn.__qualname__} takes.") from exc
        raise ConfigError(setting, target, "is not an nn.Module class, and calling it with model.params (on the "
                          f"meta device) failed: {exc}", _TARGET_FIX) from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(setting, target, f"returned a {type(model).__name__}, not a torch.nn.Module.", _TARGET_FIX)
    from jobs.models.hf import is_hf_model

    if is_hf_model(model):
        if InputKind(spec.input) is not InputKind.tokens:
            raise ConfigError("model.input", InputKind(spec.input).value, f"{target} is a transformers model, "
                              "which takes token ids.", "set model.input=tokens.")
        _check_sizes(spec, model.config)


def _check_named(spec: ModelSpec) -> None:
    builder = REGISTRY.get(spec.name)
    if builder is None:
        raise ConfigError("model.name", spec.name, "is not a model this project builds.",
                          f"use one of {', '.join(sorted(REGISTRY))}, model=hf, or model=custom with model._target_.")
    try:
        _on_meta(lambda: builder(spec))
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError("model.params", dict(spec.params), f"model {spec.name!r} cannot be built with them: {exc}",
                          "drop or correct the offending model.params key.") from exc


def _check_sizes(spec: ModelSpec, cfg: Any) -> None:
    from jobs.models.hf import positions_of

    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int) and vocab != spec.vocab_size:
        raise ConfigError("model.vocab_size", spec.vocab_size, f"differs from the model's vocabulary, {vocab}: the "
                          "data draws token ids below model.vocab_size.", f"set model.vocab_size={vocab}.")
    positions = positions_of(cfg)
    if positions is not None and positions < spec.seq_len:
        raise ConfigError("model.seq_len", spec.seq_len, f"exceeds the model's {positions} positions.",
                          f"set model.seq_len={positions} or less.")


def _check_hf(spec: ModelSpec) -> None:
    """A model=hf spec that transformers can build, refused with its fix before anything runs."""
    transformers = _import_transformers()
    require_input(spec, InputKind.tokens)
    _check_arch(spec, transformers)
    cfg = _hf_config(spec)
    _check_head(spec, cfg)
    _check_hf_sizes(spec, cfg)
    _check_weights(spec)
    _build_hf_on_meta(spec, cfg)


def _import_transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError("model", "hf", "builds Hugging Face models and needs the transformers package, which "
                          "does not import here.", f"{HF_INSTALL} (where the launcher and the ranks run).") from exc
    return transformers


def _hf_source(spec: ModelSpec) -> tuple[str, Any]:
    """The setting the model's config comes from, and its value."""
    if spec.arch:
        return "model.arch", spec.arch
    key = "config_path" if spec.config_path else "pretrained_path"
    return f"model.{key}", getattr(spec, key)


def _hf_settings(spec: ModelSpec) -> tuple[str, Any]:
    """The setting whose values transformers read into the config, and its value: model.config over
    model.arch's defaults, else the directory the config comes from."""
    return ("model.config", dict(spec.config)) if spec.arch else _hf_source(spec)


def _check_arch(spec: ModelSpec, transformers) -> None:
    """model.arch names an architecture of this transformers, and its sizes are in range."""
    import difflib

    from jobs.models.hf import size_problem

    known = list(transformers.CONFIG_MAPPING.keys())
    if spec.arch and spec.arch not in known:
        close = difflib.get_close_matches(spec.arch, known, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError("model.arch", spec.arch, f"is not an architecture transformers "
                          f"{transformers.__version__} knows.", f"{hint}Use a model_type such as gpt2, llama, "
                          "qwen2, mistral or bert (the keys of transformers.CONFIG_MAPPING).")
    problem = size_problem(spec) if spec.arch else None
    if problem:
        raise ConfigError(*problem)


def _hf_config(spec: ModelSpec):
    """transformers' config of the spec: not an encoder-decoder, and no key its class does not have."""
    from jobs.models.hf import hf_config, unknown_config_keys

    try:
        cfg = hf_config(spec)
    except Exception as exc:  # a bad override value, an unreadable config.json
        raise ConfigError(*_hf_settings(spec), f"transformers cannot make a config of it: {type(exc).__name__}: {exc}",
                          "correct the value (see the architecture's config class in the transformers docs).") from exc
    if getattr(cfg, "is_encoder_decoder", False):
        raise ConfigError(*_hf_source(spec), f"is an encoder-decoder ({cfg.model_type}): "
                          "its forward needs decoder inputs, which the benchmark's data does not give.",
                          "use a decoder (gpt2, llama, qwen2, mistral, ...) or an encoder (bert, roberta, ...).")
    unknown = unknown_config_keys(spec) if spec.arch else None
    if unknown:
        key, close, class_name = unknown
        hint = f"did you mean {' or '.join(f'model.config.{c}' for c in close)}? " if close else ""
        raise ConfigError(f"model.config.{key}", spec.config[key], f"{class_name} (model.arch={spec.arch}) has no "
                          f"setting {key!r}: transformers would keep it and build the model without it.",
                          f"{hint}Use a setting of {class_name} (its documentation, or "
                          f"sorted({class_name}().to_dict())).")
    return cfg


def _check_head(spec: ModelSpec, cfg) -> None:
    """transformers has a model of the asked head (causal or masked LM) for this model_type."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    from jobs.models.hf import pick_head

    head = pick_head(cfg, LMHead(spec.head))
    mapping = MODEL_FOR_MASKED_LM_MAPPING_NAMES if head is LMHead.masked_lm else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if cfg.model_type not in mapping:
        other = LMHead.causal_lm if head is LMHead.masked_lm else LMHead.masked_lm
        others = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if head is LMHead.masked_lm else MODEL_FOR_MASKED_LM_MAPPING_NAMES
        fix = (f"set model.head={other.value}." if cfg.model_type in others
               else "use a language-model architecture such as gpt2, llama, qwen2 or bert.")
        raise ConfigError("model.head", LMHead(spec.head).value, f"transformers has no {head.value} model for "
                          f"model_type {cfg.model_type!r}.", fix)


def _check_hf_sizes(spec: ModelSpec, cfg) -> None:
    """Sizes in range, the data's shapes within the model's, and head counts the first forward accepts."""
    from jobs.models.hf import size_problem

    problem = size_problem(spec, cfg) if spec.arch else None
    if problem:
        raise ConfigError(*problem)
    _check_sizes(spec, cfg)
    # Construction accepts head counts that only the first forward refuses (a forward on meta
    # tensors stops earlier, at the masks' data-dependent checks), so they are checked here.
    heads, kv_heads = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise ConfigError("model.config.num_key_value_heads", kv_heads, f"num_attention_heads={heads} is not a multiple "
                          f"of num_key_value_heads={kv_heads} (the {cfg.model_type} default where not set).",
                          f"set model.config.num_key_value_heads to a divisor of {heads} (e.g. {heads}: "
                          "multi-head attention).")


def _check_weights(spec: ModelSpec) -> None:
    """model.pretrained_path holds weights that from_pretrained reads."""
    if spec.pretrained_path:
        names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
        if not any(os.path.isfile(os.path.join(spec.pretrained_path, n)) for n in names):
            raise ConfigError("model.pretrained_path", spec.pretrained_path, f"holds none of {', '.join(names)}.",
                              "write the directory with save_pretrained, or use model.config_path for a config alone.")


def _build_hf_on_meta(spec: ModelSpec, cfg) -> None:
    from jobs.models.hf import build_hf

    try:
        _on_meta(lambda: build_hf(spec))
    except Exception as exc:
        raise ConfigError(*_hf_settings(spec), f"transformers cannot build a {cfg.model_type} model from it: {type(exc).__name__}: {exc}",
                          "correct the sizes (e.g. hidden_size divisible by num_attention_heads).") from exc
