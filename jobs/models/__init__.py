"""The benchmark's models: build one from a ModelSpec, find its blocks, count its parameters and FLOPs.

Every project model's ``forward(x)`` returns logits. Token models (``gpt_tiny``, ``gpt2-*``,
``bert-*``) take int64 [B, T] and return [B, T, vocab_size]; image models (``mlp``, ``cnn``,
``resnet*``) take float [B, 3, H, W] and return [B, num_classes]. The loop's loss is
``F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())`` for both.

Deferred initialisation. ``build_model`` always constructs a project model's skeleton on the meta
device, then (unless the ambient default device is itself meta) materialises it with
``to_empty`` and runs :func:`init_weights`. A worker that builds under ``torch.device("meta")``,
shards the model, calls ``to_empty(device=...)`` and then ``init_weights`` therefore runs the very
same init code in the same order, and gets the same weights as an eager build under the same
``torch.manual_seed`` (for unsharded parameters; DTensor parameters draw from DTensor's own
sharded RNG streams).

Models users bring. ``model._target_`` (alias ``model.target``) names any importable nn.Module
class or function returning one, called with ``model.params``; ``_target_`` dicts inside the params
are instantiated first, recursively (:mod:`jobs.models.instantiate`, Hydra's semantics without
Hydra). ``model=hf`` builds a Hugging Face transformers model from a config
(:mod:`jobs.models.hf`). A transformers model, however built, is wrapped in
:class:`~jobs.models.hf.HFLogits`: forward returns ``.logits``, its blocks are the model's
``_no_split_modules``, and :func:`init_weights` runs transformers' own initialisation.
:func:`check_buildable` is the launcher's pre-submission check of all this.

Blocks. :func:`shard_units` names the per-block units for per-block FSDP wrapping
(``fully_shard`` on each unit, then on the root) and for activation checkpointing. The worker
applies ``checkpoint_wrapper`` by replacing each unit in its parent container, through
:func:`replace_units`, before sharding.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from jobs.models.bert import Bert, BertConfig
from jobs.models.gpt import GPT, GPTConfig
from jobs.models.instantiate import InstantiationError, instantiate, locate
from jobs.models.resnet import RESNET_LAYOUTS, ResNet
from jobs.models.small import CNN, MLP
from jobs.spec import HF_INSTALL, ConfigError, InputKind, LMHead, ModelSpec, import_problem

__all__ = [
    "REGISTRY",
    "build_for",
    "build_model",
    "check_buildable",
    "flops_per_sample",
    "init_weights",
    "materialize",
    "param_count",
    "place_buffers",
    "replace_units",
    "replays_init",
    "shard_units",
]


# --------------------------------------------------------------------------------------------
# Building


def _require_input(spec: ModelSpec, kind: InputKind) -> None:
    if InputKind(spec.input) is not kind:
        raise ConfigError("model.input", InputKind(spec.input).value, f"model {spec.name!r} takes {kind.value} input.",
                          f"set model.input={kind.value}.")


def _params(spec: ModelSpec, defaults: dict[str, Any]) -> dict[str, Any]:
    """`defaults` overridden by spec.params; a key the model does not take is an error."""
    unknown = sorted(set(spec.params) - set(defaults))
    if unknown:
        raise ValueError(
            f"model {spec.name!r} does not take params {unknown}; it takes {sorted(defaults)} "
            "(vocab_size, seq_len, image_size and num_classes are model.* fields, not params)."
        )
    return {**defaults, **spec.params}


def _materialize(factory: Callable[[], nn.Module]) -> nn.Module:
    """Build on meta, then materialise on the ambient default device and run init_weights.

    Going through meta even for an eager build means the weights come from init_weights alone,
    so a meta build + to_empty + init_weights reproduces them exactly; it also initialises every
    parameter once instead of twice.
    """
    # The device a `with torch.device(...)` block asks for. Not torch.get_default_device(): before
    # torch 2.8 it ignores such blocks (pytorch#131328) and says "cpu" inside `torch.device("meta")`.
    device = torch.empty(()).device
    with torch.device("meta"):
        model = factory()
    if device.type != "meta":
        materialize(model, device)
    return model


def materialize(model: nn.Module, device: torch.device, *, param_device: torch.device | None = None) -> None:
    """Allocate a meta model's storage and run :func:`init_weights`: the one materialisation of
    every build, eager or sharded, on CPU or GPU (jobs.parallel.materialize wraps it for sharded
    models). Parameters go to ``param_device`` (default ``device``; CPU offload keeps them on the
    host), buffers always to ``device``, where the forward reads them."""
    model.to_empty(device=param_device or device)
    place_buffers(model, device)
    with torch.no_grad():
        init_weights(model)


def place_buffers(model: nn.Module, device: torch.device) -> None:
    """Give every buffer not on ``device`` fresh (uninitialised) storage there; a buffer shared by
    several modules stays shared. For a model about to be initialised: values are not copied."""
    moved: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is None or buffer.device == device:
                continue
            if id(buffer) not in moved:
                moved[id(buffer)] = torch.empty_like(buffer, device=device)
            module._buffers[name] = moved[id(buffer)]


def replays_init(spec: ModelSpec) -> bool:
    """Whether :func:`init_weights` reproduces everything the model's constructor initialises, so
    that it may be built on meta and initialised after sharding: project models and ``model=hf``,
    whose construction is itself meta + init_weights. A ``_target_`` model's constructor is its
    initialisation (nn.MultiheadAttention's in-projection, raw nn.Parameters, custom inits), which
    no ``reset_parameters()`` replays: R4 of the GPU review."""
    return not spec.target_path


def build_for(spec: ModelSpec, device: torch.device, *, sharded: bool) -> nn.Module:
    """The model for jobs.parallel.parallelize, the same initial weights for every strategy.

    Project and transformers models: on ``device`` when not sharded (DDP), on meta when sharded
    (materialised after sharding). A ``_target_`` model: built eagerly on the host, from the
    seeded CPU generator, under every strategy, then moved to ``device`` (DDP) or sharded as built
    (FSDP's fully_shard moves each unit to the device as it shards it; offload keeps the shards on
    the host). It is held whole on the host once, never on the device.
    """
    if not replays_init(spec):
        with torch.device("cpu"):
            model = build_model(spec)
        return model if sharded else model.to(device)
    with torch.device("meta" if sharded else device):
        return build_model(spec)


_GPT_SIZES = {  # name -> (n_layer, n_head, d_model)
    "gpt_tiny": (2, 4, 128),
    "gpt2-small": (12, 12, 768),  # 124M
    "gpt2-medium": (24, 16, 1024),  # 355M
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),  # 1.56B
}

_BERT_SIZES = {  # name -> (n_layer, n_head, d_model)
    "bert-base": (12, 12, 768),  # 110M
    "bert-tiny": (2, 2, 128),  # Google's BERT-Tiny (L-2, H-128, A-2)
}


def _build_gpt(sizes: tuple[int, int, int], spec: ModelSpec) -> nn.Module:
    _require_input(spec, InputKind.tokens)
    n_layer, n_head, d_model = sizes
    params = _params(spec, {"n_layer": n_layer, "n_head": n_head, "d_model": d_model,
                            "dropout": 0.0, "bias": True})
    # The position table is exactly seq_len long: gpt2-* match GPT-2's counts at seq_len=1024.
    cfg = GPTConfig(vocab_size=spec.vocab_size, block_size=spec.seq_len, **params)
    return _materialize(lambda: GPT(cfg))


def _build_bert(sizes: tuple[int, int, int], spec: ModelSpec) -> nn.Module:
    _require_input(spec, InputKind.tokens)
    n_layer, n_head, d_model = sizes
    # BERT's 512-row position table is kept for every seq_len up to 512 (so bert-base keeps its
    # published count) and grown beyond that.
    params = _params(spec, {"n_layer": n_layer, "n_head": n_head, "d_model": d_model, "d_ff": 0,
                            "dropout": 0.0, "max_positions": max(512, spec.seq_len)})
    cfg = BertConfig(vocab_size=spec.vocab_size, **params)
    return _materialize(lambda: Bert(cfg))


def _build_resnet(depth: int, spec: ModelSpec) -> nn.Module:
    _require_input(spec, InputKind.image)
    params = _params(spec, {"zero_init_residual": False})
    return _materialize(lambda: ResNet(depth, num_classes=spec.num_classes, **params))


def _build_mlp(spec: ModelSpec) -> nn.Module:
    _require_input(spec, InputKind.image)
    params = _params(spec, {"hidden": 256, "n_layer": 2})
    return _materialize(lambda: MLP(spec.image_size, spec.num_classes, **params))


def _build_cnn(spec: ModelSpec) -> nn.Module:
    _require_input(spec, InputKind.image)
    params = _params(spec, {"width": 32, "n_layer": 3})
    return _materialize(lambda: CNN(spec.num_classes, **params))


REGISTRY: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    **{name: functools.partial(_build_gpt, sizes) for name, sizes in _GPT_SIZES.items()},
    **{name: functools.partial(_build_bert, sizes) for name, sizes in _BERT_SIZES.items()},
    **{f"resnet{depth}": functools.partial(_build_resnet, depth) for depth in RESNET_LAYOUTS},
}


def _build_hf(spec: ModelSpec) -> nn.Module:
    from jobs.models.hf import build_hf

    _require_input(spec, InputKind.tokens)
    return _materialize(lambda: build_hf(spec))


def build_model(spec: ModelSpec) -> nn.Module:
    """The model `spec` describes, on the ambient default device (meta included).

    With ``spec._target_`` (or its alias ``spec.target``) set, the object at that dotted path is
    called with ``spec.params`` as keyword arguments, after instantiating any ``_target_`` dict
    inside them (recursively); its parameters are initialised by its own constructor. A
    transformers model comes back wrapped in HFLogits (forward returns logits). ``spec.name=hf``
    builds a transformers model from a config (jobs.models.hf). Otherwise ``spec.name`` is looked
    up in REGISTRY and ``spec.params`` override the named model's defaults (e.g. ``n_layer=2``).
    """
    target = spec.target_path
    if target:
        model = instantiate({"_target_": target, **spec.params})
        if not isinstance(model, nn.Module):
            raise ValueError(f"model._target_={target!r} returned a {type(model).__name__}, not a torch.nn.Module.")
        from jobs.models.hf import is_hf_model, wrap_hf

        return wrap_hf(model) if is_hf_model(model) else model
    if spec.name == "hf":
        return _build_hf(spec)
    builder = REGISTRY.get(spec.name)
    if builder is None:
        raise ValueError(
            f"unknown model name {spec.name!r}; valid names: {', '.join(sorted(REGISTRY))} "
            "(or model=hf with model.arch, or set model._target_ to an importable nn.Module class)."
        )
    return builder(spec)


# --------------------------------------------------------------------------------------------
# Initialisation


def _unwrap(model: nn.Module) -> nn.Module:
    """The user model inside DDP / DataParallel and torch.compile wrappers.

    FSDP2's fully_shard changes the class in place (a subclass), so it needs no unwrapping.
    """
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(orig := getattr(model, "_orig_mod", None), nn.Module):
            model = orig
        else:
            return model


def init_weights(model: nn.Module) -> None:
    """(Re)initialise every parameter and buffer, deterministically under torch.manual_seed.

    Calls ``reset_parameters()`` on every module that has one (PyTorch's per-layer defaults; for
    BatchNorm this also resets the running statistics), in ``modules()`` order, and then the
    project model's ``custom_init()`` (its family's published init), which overrides them. A
    transformers model (HFLogits) is initialised by transformers instead, tied weights re-tied and
    ``model.pretrained_path``'s weights loaded. Meant for after ``to_empty()``, whose memory is
    uninitialised.
    """
    model = _unwrap(model)
    from jobs.models.hf import HFLogits

    if isinstance(model, HFLogits):  # transformers' own init covers every module (jobs.models.hf)
        model.init_weights()
        return
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    custom = getattr(model, "custom_init", None)
    if callable(custom):
        custom()


# --------------------------------------------------------------------------------------------
# Blocks


def _repeated_units(model: nn.Module) -> list[nn.Module]:
    """Heuristic blocks of a model that does not name its own.

    Candidates are the nn.ModuleList / nn.Sequential containers holding two or more entries of
    one type that own parameters (a Sequential of Linear, ReLU, Linear is not one). Candidates
    nested inside another candidate's entries are dropped, so the Linears inside repeated layers
    never win over the layers themselves. The entries are then grouped by type across containers
    and the most numerous type wins (ties: the one with more parameters): a single ModuleList of
    transformer layers gives its layers, and a torchvision ResNet gives the Bottlenecks of all four
    stages (layer1..layer4), not just the longest stage. No candidate: [].
    """
    candidates: list[tuple[str, list[nn.Module]]] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        entries = list(module)
        if (len(entries) >= 2 and len({type(e) for e in entries}) == 1
                and next(entries[0].parameters(), None) is not None):
            candidates.append((name, entries))

    def nested(inner: str, outer: str) -> bool:
        return inner != outer and (outer == "" or inner.startswith(outer + "."))

    outermost = [(n, e) for n, e in candidates if not any(nested(n, other) for other, _ in candidates)]
    by_type: dict[type, list[nn.Module]] = {}
    for _, entries in outermost:
        by_type.setdefault(type(entries[0]), []).extend(entries)
    if not by_type:
        return []
    return max(by_type.values(), key=lambda units: (len(units), sum(param_count(u) for u in units)))


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The per-block units for per-block FSDP wrapping and activation checkpointing.

    Project models name them (``shard_units()``): transformer layers (the ``blocks`` ModuleList),
    ResNet Basic/Bottleneck blocks inside layer1..layer4, the MLP's and CNN's blocks; a
    transformers model (HFLogits) its ``_no_split_modules`` (GPT2Block, LlamaDecoderLayer,
    BertLayer, ...; see HFLogits.shard_units for tied weights). Any other
    model gets the heuristic of :func:`_repeated_units`, else [].
    """
    model = _unwrap(model)
    own = getattr(model, "shard_units", None)
    if callable(own):
        return list(own())
    return _repeated_units(model)


def replace_units(model: nn.Module, fn: Callable[[nn.Module], nn.Module]) -> list[nn.Module]:
    """Replace every shard unit ``u`` in its parent container with ``fn(u)``; return the new units.

    This is how the worker applies activation checkpointing, e.g.
    ``replace_units(model, checkpoint_wrapper)``, before per-block ``fully_shard``. Afterwards
    ``shard_units(model)`` returns the replacements.
    """
    model = _unwrap(model)
    parent_of: dict[int, tuple[nn.Module, str]] = {}
    for parent in model.modules():
        for name, child in parent.named_children():
            parent_of.setdefault(id(child), (parent, name))
    replaced = []
    for unit in shard_units(model):
        if id(unit) not in parent_of:
            raise ValueError(f"shard unit {type(unit).__name__} has no parent module to be replaced in.")
        parent, name = parent_of[id(unit)]
        new = fn(unit)
        setattr(parent, name, new)
        replaced.append(new)
    return replaced


# --------------------------------------------------------------------------------------------
# Counting


def param_count(model: nn.Module) -> int:
    """Parameters, each shared (tied) one counted once; works on meta and on DTensor (global size)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_sample(model: nn.Module, spec: ModelSpec) -> float | None:
    """Training FLOPs (forward + backward) for one sample, or None for a model this cannot count.

    Per family (a multiply-accumulate is 2 FLOPs; backward costs twice the forward, gradients with
    respect to both inputs and weights, so training = 3 x forward):
      * GPT and BERT: 6 * N * T + 12 * n_layer * d_model * T^2, with T = spec.seq_len and N the
        parameters that take part in a matmul: all but the position (and token-type) tables; the
        tied token embedding counts, being the output projection (PaLM appendix B, Chinchilla,
        nanoGPT's estimate_mfu). Causal attention is not discounted.
      * transformers models (model=hf, or a _target_ returning one): the same formula, N all
        parameters but the non-token embedding tables, n_layer and d_model from the config's
        num_hidden_layers and hidden_size (HFLogits.train_flops_per_sample).
      * ResNet, CNN: 3 * 2 * (convolution + fc MACs at spec.image_size), computed from the layer
        shapes; BatchNorm, ReLU, pooling and residual additions are left out, as in the published
        figures (ResNet-50 at 224 = 4.09 GMACs).
      * MLP: 3 * 2 * sum(in_features * out_features) over its Linear layers.
    """
    model = _unwrap(model)
    from jobs.models.hf import HFLogits

    if isinstance(model, HFLogits):
        return model.train_flops_per_sample(spec.seq_len)
    if isinstance(model, (GPT, Bert)):
        return model.train_flops_per_sample(spec.seq_len, param_count(model))
    if isinstance(model, (ResNet, CNN, MLP)):
        return 3.0 * 2.0 * model.forward_macs(spec.image_size)
    return None


# --------------------------------------------------------------------------------------------
# Checking before submission


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
    _require_input(spec, InputKind.tokens)
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
