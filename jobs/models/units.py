"""Blocks: the per-block units for per-block FSDP wrapping and activation checkpointing, and the
tensor-parallel plan each model family declares beside them.

:func:`shard_units` names the units (``fully_shard`` on each unit, then on the root). The worker
applies ``checkpoint_wrapper`` by replacing each unit in its parent container, through
:func:`replace_units`, before sharding. :func:`tp_plan` reads a family's tensor-parallel plan
(declared, not yet run: StrategySpec refuses strategy.tp > 1).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from jobs.models.flops import param_count
from jobs.models.init import unwrap


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
    model = unwrap(model)
    own = getattr(model, "shard_units", None)
    if callable(own):
        return list(own())
    return _repeated_units(model)


def units_text(model: nn.Module) -> str:
    """Which units FSDP wraps (and checkpointing replaces), for the run's ``shard_units`` tag:
    ``12 x Block (the model's shard_units())``, or the heuristic's, or none (the root alone)."""
    units = shard_units(model)
    if not units:
        return "none: the whole model is one FSDP unit (no shard_units(), no repeated blocks)"
    counts: dict[str, int] = {}
    for unit in units:
        counts[_class_name(unit)] = counts.get(_class_name(unit), 0) + 1
    how = ("the model's shard_units()" if callable(getattr(unwrap(model), "shard_units", None))
           else "repeated blocks found by jobs/models/units.py")
    return ", ".join(f"{n} x {name}" for name, n in counts.items()) + f" ({how})"


def _class_name(unit: nn.Module) -> str:
    """A unit's own class, through checkpoint_wrapper and fully_shard's FSDP<Class> subclass."""
    inner = getattr(unit, "_checkpoint_wrapped_module", unit)
    name = type(inner).__name__
    parents = {c.__name__ for c in type(inner).__mro__[1:]}
    return name[4:] if name.startswith("FSDP") and name[4:] in parents else name


def tp_plan(model: nn.Module) -> dict[str, str] | None:
    """The model family's tensor-parallel plan, as transformers writes one: a module path (``*``
    for each block's index) -> how its weight splits over the tensor-parallel group (``colwise``:
    by output features; ``rowwise``: by input features, outputs summed; ``colwise_stacked``: by
    output features within each of the stacked chunks, e.g. a fused q/k/v). Declared by the model
    (``tp_plan()``, beside its ``shard_units()``); None for a family that declares none (ResNet,
    the MLP and the CNN, a ``_target_`` model without one)."""
    own = getattr(unwrap(model), "tp_plan", None)
    return own() if callable(own) else None


def replace_units(model: nn.Module, fn: Callable[[nn.Module], nn.Module]) -> list[nn.Module]:
    """Replace every shard unit ``u`` in its parent container with ``fn(u)``; return the new units.

    This is how the worker applies activation checkpointing, e.g.
    ``replace_units(model, checkpoint_wrapper)``, before per-block ``fully_shard``. Afterwards
    ``shard_units(model)`` returns the replacements.
    """
    model = unwrap(model)
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
