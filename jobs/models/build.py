"""Building a model from a ModelSpec: the registry of project models, ``_target_`` models and
``model=hf``, and the one materialisation every build goes through.

Deferred initialisation. ``build_model`` always constructs a project model's skeleton on the meta
device, then (unless the ambient default device is itself meta) materialises it with
``to_empty`` and runs :func:`~jobs.models.init.init_weights`. A worker that builds under
``torch.device("meta")``, shards the model, calls ``to_empty(device=...)`` and then
``init_weights`` therefore runs the very same init code in the same order, and gets the same
weights as an eager build under the same ``torch.manual_seed`` (for unsharded parameters; DTensor
parameters draw from DTensor's own sharded RNG streams).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from contract.catalog import BERT_SIZES, GPT_SIZES, RESNET_DEPTHS, padded_vocab
from contract.choices import InputKind
from contract.errors import ConfigError
from contract.modelspec import ModelSpec
from jobs.models.bert import Bert, BertConfig
from jobs.models.gpt import GPT, GPTConfig
from jobs.models.init import init_weights
from jobs.models.instantiate import instantiate
from jobs.models.resnet import ResNet
from jobs.models.small import CNN, MLP


def require_input(spec: ModelSpec, kind: InputKind) -> None:
    """Refuse a spec whose model.input is not the input kind the model takes."""
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


def on_meta(factory: Callable[[], Any]) -> Any:
    """``factory()`` on the meta device: a build that allocates nothing, for checks before launch."""
    with torch.device("meta"):
        return factory()


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


def _build_gpt(sizes: tuple[int, int, int], spec: ModelSpec) -> nn.Module:
    require_input(spec, InputKind.tokens)
    n_layer, n_head, d_model = sizes
    params = _params(spec, {"n_layer": n_layer, "n_head": n_head, "d_model": d_model,
                            "dropout": 0.0, "bias": True})
    # The position table is exactly seq_len long: gpt2-* match GPT-2's counts at seq_len=1024. The
    # vocabulary rows padded up to model.vocab_multiple (resolved: contract.tuning.resolved_model).
    vocab = padded_vocab(spec.vocab_size, spec.vocab_multiple or 1)
    cfg = GPTConfig(vocab_size=vocab, block_size=spec.seq_len, **params)
    return _materialize(lambda: GPT(cfg))


def _build_bert(sizes: tuple[int, int, int], spec: ModelSpec) -> nn.Module:
    require_input(spec, InputKind.tokens)
    n_layer, n_head, d_model = sizes
    # BERT's 512-row position table is kept for every seq_len up to 512 (so bert-base keeps its
    # published count) and grown beyond that.
    params = _params(spec, {"n_layer": n_layer, "n_head": n_head, "d_model": d_model, "d_ff": 0,
                            "dropout": 0.0, "max_positions": max(512, spec.seq_len)})
    cfg = BertConfig(vocab_size=spec.vocab_size, **params)
    return _materialize(lambda: Bert(cfg))


def _build_resnet(depth: int, spec: ModelSpec) -> nn.Module:
    require_input(spec, InputKind.image)
    params = _params(spec, {"zero_init_residual": False})
    return _materialize(lambda: ResNet(depth, num_classes=spec.num_classes, **params))


def _build_mlp(spec: ModelSpec) -> nn.Module:
    require_input(spec, InputKind.image)
    params = _params(spec, {"hidden": 256, "n_layer": 2})
    return _materialize(lambda: MLP(spec.image_size, spec.num_classes, **params))


def _build_cnn(spec: ModelSpec) -> nn.Module:
    require_input(spec, InputKind.image)
    params = _params(spec, {"width": 32, "n_layer": 3})
    return _materialize(lambda: CNN(spec.num_classes, **params))


REGISTRY: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    **{name: functools.partial(_build_gpt, sizes) for name, sizes in GPT_SIZES.items()},
    **{name: functools.partial(_build_bert, sizes) for name, sizes in BERT_SIZES.items()},
    **{f"resnet{depth}": functools.partial(_build_resnet, depth) for depth in RESNET_DEPTHS},
}


def _build_hf(spec: ModelSpec) -> nn.Module:
    from jobs.models.hf import build_hf

    require_input(spec, InputKind.tokens)
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
