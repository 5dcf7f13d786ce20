"""Every check of a transformers model before submission, in one place: model=hf from its
architecture or a directory, and a ``_target_`` that returns a transformers model.

These import transformers (and torch). The checks that need neither, decided from the config alone
on the launcher's host (the package installed at all, one architecture source, model.config's
vocabulary and position counts against model.vocab_size and model.seq_len), are
``ModelSpec.validate``'s, which runs first, at composition.
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Any

from contract.choices import HF_INSTALL, HF_POSITION_KEYS, InputKind, LMHead
from contract.errors import ConfigError
from contract.modelspec import ModelSpec
from jobs.models.build import on_meta, require_input

# Keys the shipped model=hf config (launcher/conf/model/hf.yaml) sets for every architecture: they
# apply where the architecture's config class has them (GPT-2 has neither: its MLP width is n_inner).
GENERIC_CONFIG_KEYS = ("intermediate_size", "num_key_value_heads")
# Integer settings whose name says they count or size something: 0 or less builds a model without
# layers (range(-1) is empty) or fails deep inside transformers.
_SIZE_WORDS = ("size", "layer", "head", "dim", "position", "embd", "inner", "n_ctx")


def check_hf(spec: ModelSpec) -> None:
    """A model=hf spec that transformers can build, refused with its fix before anything runs."""
    transformers = _import_transformers()
    require_input(spec, InputKind.tokens)
    _check_arch(spec, transformers)
    cfg = _hf_config(spec, transformers)
    _check_head(spec, cfg)
    _check_hf_sizes(spec, cfg)
    _check_weights(spec)
    _build_hf_on_meta(spec, cfg)


def check_hf_target(spec: ModelSpec, target: str, cfg: Any) -> None:
    """A transformers model built from ``model._target_``: token input, and sizes the data fits."""
    if InputKind(spec.input) is not InputKind.tokens:
        raise ConfigError("model.input", InputKind(spec.input).value, f"{target} is a transformers model, "
                          "which takes token ids.", "set model.input=tokens.")
    _check_data_fits(spec, cfg)


def _positions_of(cfg: Any) -> int | None:
    """The config's maximum sequence length, under whichever name it uses (None: it has none)."""
    for key in HF_POSITION_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _check_data_fits(spec: ModelSpec, cfg: Any) -> None:
    """A config that does not come from model.config (a directory's, a _target_ model's) against the
    data's vocabulary and sequence length."""
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int) and vocab != spec.vocab_size:
        raise ConfigError("model.vocab_size", spec.vocab_size, f"differs from the model's vocabulary, {vocab}: the "
                          "data draws token ids below model.vocab_size.", f"set model.vocab_size={vocab}.")
    positions = _positions_of(cfg)
    if positions is not None and positions < spec.seq_len:
        raise ConfigError("model.seq_len", spec.seq_len, f"exceeds the model's {positions} positions.",
                          f"set model.seq_len={positions} or less.")


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
    known = list(transformers.CONFIG_MAPPING.keys())
    if spec.arch and spec.arch not in known:
        close = difflib.get_close_matches(spec.arch, known, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError("model.arch", spec.arch, f"is not an architecture transformers "
                          f"{transformers.__version__} knows.", f"{hint}Use a model_type such as gpt2, llama, "
                          "qwen2, mistral or bert (the keys of transformers.CONFIG_MAPPING).")
    if spec.arch:
        _check_size_values(spec)


def _hf_config(spec: ModelSpec, transformers):
    """transformers' config of the spec: not an encoder-decoder, and no key its class does not have."""
    from jobs.models.hf import hf_config

    try:
        cfg = hf_config(spec)
    except Exception as exc:  # a bad override value, an unreadable config.json
        raise ConfigError(*_hf_settings(spec), f"transformers cannot make a config of it: {type(exc).__name__}: {exc}",
                          "correct the value (see the architecture's config class in the transformers docs).") from exc
    if getattr(cfg, "is_encoder_decoder", False):
        raise ConfigError(*_hf_source(spec), f"is an encoder-decoder ({cfg.model_type}): "
                          "its forward needs decoder inputs, which the benchmark's data does not give.",
                          "use a decoder (gpt2, llama, qwen2, mistral, ...) or an encoder (bert, roberta, ...).")
    if spec.arch:
        _check_config_keys(spec, transformers.CONFIG_MAPPING[spec.arch])
    return cfg


def _config_keys(config_class: Any) -> set[str]:
    """Every setting a transformers config class defines: its defaults, its constructor's named
    arguments and its aliases (GPT-2's hidden_size -> n_embd)."""
    params = inspect.signature(config_class.__init__).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    return set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {})) | named


def _check_config_keys(spec: ModelSpec, config_class: Any) -> None:
    """Every model.config key is a setting of the config class: transformers would set any other
    silently and ignore it."""
    known = _config_keys(config_class)
    for key in spec.config:
        if key in known or key in GENERIC_CONFIG_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        class_name = config_class.__name__
        hint = f"did you mean {' or '.join(f'model.config.{c}' for c in close)}? " if close else ""
        raise ConfigError(f"model.config.{key}", spec.config[key], f"{class_name} (model.arch={spec.arch}) has no "
                          f"setting {key!r}: transformers would keep it and build the model without it.",
                          f"{hint}Use a setting of {class_name} (its documentation, or "
                          f"sorted({class_name}().to_dict())).")


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
    if spec.arch:
        _check_size_values(spec, cfg)
    else:
        # With model.arch, hf_config writes model.vocab_size and model.seq_len into the config, and
        # ModelSpec.validate refused a model.config that disagrees with them: only a directory's
        # config can differ from the data here.
        _check_data_fits(spec, cfg)
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
        on_meta(lambda: build_hf(spec))
    except Exception as exc:
        raise ConfigError(*_hf_settings(spec), f"transformers cannot build a {cfg.model_type} model from it: {type(exc).__name__}: {exc}",
                          "correct the sizes (e.g. hidden_size divisible by num_attention_heads).") from exc


def _check_size_values(spec: ModelSpec, cfg: Any = None) -> None:
    """The first size in model.config that cannot make a model: a count or size of 0 or less, or
    attention heads that do not divide the hidden size (of the built config ``cfg``, else of
    model.config alone)."""
    for key, value in spec.config.items():
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if is_int and value <= 0 and any(word in key for word in _SIZE_WORDS):
            raise ConfigError(f"model.config.{key}", value, "is a count or a size, and must be 1 or more.",
                              f"set model.config.{key} to a positive integer.")
    given = spec.config  # before the config is built (its constructor may refuse with less to go on)
    hidden = getattr(cfg, "hidden_size", None) if cfg is not None else given.get("hidden_size", given.get("n_embd"))
    heads = (getattr(cfg, "num_attention_heads", None) if cfg is not None
             else given.get("num_attention_heads", given.get("n_head")))
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads and "head_dim" not in spec.config:
        divisors = [d for d in range(1, hidden + 1) if hidden % d == 0]
        near = [d for d in (max((d for d in divisors if d < heads), default=None),
                            min((d for d in divisors if d > heads), default=None)) if d is not None]
        raise ConfigError("model.config.num_attention_heads", heads, f"does not divide hidden_size={hidden}: the "
                          f"heads would split {hidden} channels into {heads} parts of {hidden / heads:.2f}.",
                          f"hidden_size must be divisible by num_attention_heads: set model.config.num_attention_heads "
                          f"to {' or '.join(map(str, near))}, or model.config.hidden_size to a multiple of {heads}.")
