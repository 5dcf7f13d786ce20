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

Blocks. :func:`shard_units` names the per-block units for per-block FSDP wrapping
(``fully_shard`` on each unit, then on the root) and for activation checkpointing. The worker
applies ``checkpoint_wrapper`` by replacing each unit in its parent container, through
:func:`replace_units`, before sharding.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from jobs.models.bert import Bert, BertConfig
from jobs.models.gpt import GPT, GPTConfig
from jobs.models.resnet import RESNET_LAYOUTS, ResNet
from jobs.models.small import CNN, MLP
from jobs.spec import InputKind, ModelSpec

__all__ = [
    "REGISTRY",
    "build_model",
    "flops_per_sample",
    "init_weights",
    "param_count",
    "replace_units",
    "shard_units",
]


# --------------------------------------------------------------------------------------------
# Building


def _require_input(spec: ModelSpec, kind: InputKind) -> None:
    if InputKind(spec.input) is not kind:
        raise ValueError(
            f"model {spec.name!r} takes {kind.value} input but model.input={InputKind(spec.input).value}; "
            f"set model.input={kind.value}."
        )


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
    device = torch.get_default_device()
    with torch.device("meta"):
        model = factory()
    if device.type != "meta":
        model.to_empty(device=device)
        init_weights(model)
    return model


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


def _import_target(path: str) -> Callable[..., nn.Module]:
    """Resolve a dotted path such as ``torch.nn.Linear`` (nested attributes allowed)."""
    parts = path.split(".")
    error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError as exc:
            error = error or exc
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ValueError(f"model.target={path!r}: {exc}.") from exc
        return obj
    raise ValueError(f"model.target={path!r} is not an importable dotted path ({error}).")


def build_model(spec: ModelSpec) -> nn.Module:
    """The model `spec` describes, on the ambient default device (meta included).

    With ``spec.target`` set, the class at that dotted path is called with ``**spec.params`` as is
    (its parameters are initialised by its own constructor). Otherwise ``spec.name`` is looked up
    in REGISTRY and ``spec.params`` override the named model's defaults (e.g. ``n_layer=2``).
    """
    if spec.target:
        return _import_target(spec.target)(**spec.params)
    builder = REGISTRY.get(spec.name)
    if builder is None:
        raise ValueError(
            f"unknown model name {spec.name!r}; valid names: {', '.join(sorted(REGISTRY))} "
            "(or set model.target to an importable nn.Module class)."
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
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def init_weights(model: nn.Module) -> None:
    """(Re)initialise every parameter and buffer, deterministically under torch.manual_seed.

    Calls ``reset_parameters()`` on every module that has one (PyTorch's per-layer defaults; for
    BatchNorm this also resets the running statistics), in ``modules()`` order, and then the
    project model's ``custom_init()`` (its family's published init), which overrides them.
    Meant for after ``to_empty()``, whose memory is uninitialised.
    """
    model = _unwrap(model)
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
    ResNet Basic/Bottleneck blocks inside layer1..layer4, the MLP's and CNN's blocks. Any other
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
      * ResNet, CNN: 3 * 2 * (convolution + fc MACs at spec.image_size), computed from the layer
        shapes; BatchNorm, ReLU, pooling and residual additions are left out, as in the published
        figures (ResNet-50 at 224 = 4.09 GMACs).
      * MLP: 3 * 2 * sum(in_features * out_features) over its Linear layers.
    """
    model = _unwrap(model)
    if isinstance(model, (GPT, Bert)):
        return model.train_flops_per_sample(spec.seq_len, param_count(model))
    if isinstance(model, (ResNet, CNN, MLP)):
        return 3.0 * 2.0 * model.forward_macs(spec.image_size)
    return None
