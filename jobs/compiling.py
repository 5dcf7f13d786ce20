"""How the worker compiles (``train.compile``): each strategy's graphs as the best training loops
make them, the loss always inside a compiled graph.

- **DDP**: the wrapped model and the loss in ONE compiled function. At one rank there is nothing to
  overlap, so DDPOptimizer's split of the graph at the gradient buckets is off and the step is a
  single graph (model and loss fused: the logits are never upcast whole, torchtitan's and the tuned
  loop's way). With more ranks DDPOptimizer splits it, so that each bucket's all-reduce can start
  while backward runs.
- **FSDP**: FSDP2's hooks (all-gather before a unit, reduce-scatter after) are not traceable, and a
  whole-model compile around them runs the model's outer forward eager and recompiles each block
  per variant with dynamic shapes. So, as torchtitan's ``apply_compile``: each shard unit is compiled
  with static shapes BEFORE it is sharded (the hooks then sit on the compiled module, outside its
  graph); the model's own layers around the units (``compile_regions``: embeddings, final norm,
  head) are compiled as methods of their own; the loss is compiled on its own.

The recompile limit is raised with room to spare (:data:`RECOMPILE_LIMIT`): a ResNet-50's Bottleneck
has 8 static variants, exactly dynamo's default limit, and one more would run eager without a word.
:func:`graph_count` lets the worker see a recompile inside its measured window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

# Dynamo's default is 8 per code object: a ResNet-50 Bottleneck's variants (4 stages, with and
# without a downsample, stride) already reach it.
RECOMPILE_LIMIT = 64


@dataclass(frozen=True)
class CompilePlan:
    """What was compiled, for the cell's tuning tags: ``whole`` (one function: the model and the loss)
    or ``regions`` (units, outer regions, loss)."""

    scope: str  # whole | regions | off
    units: int = 0
    regions: tuple[str, ...] = ()
    single_graph: bool = False  # DDP at one rank: DDPOptimizer off

    def tags(self) -> dict[str, str]:
        if self.scope == "off":
            return {"compile.scope": "off"}
        return {"compile.scope": self.scope, "compile.units": str(self.units),
                "compile.regions": ",".join(self.regions) or "-",
                "compile.ddp_single_graph": str(self.single_graph).lower(),
                "compile.recompile_limit": str(RECOMPILE_LIMIT)}


def set_limits() -> None:
    """The recompile limit, under the name the installed torch has (``cache_size_limit`` before 2.6)."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


def compile_units(model: nn.Module, replace_units: Callable, *, backend="inductor") -> int:
    """Before sharding: every shard unit replaced by its compiled module (static shapes; the unit's
    own forward is one graph), so that FSDP's hooks, put on the compiled module, stay outside it.
    ``replace_units``: jobs.models.replace_units (passed in: this module imports no model code)."""
    set_limits()

    def compiled(unit: nn.Module) -> nn.Module:
        # An nn.Module compiles to an OptimizedModule (an nn.Module); torch's stub says a plain callable.
        return torch.compile(unit, backend=backend, dynamic=False)  # type: ignore[return-value]

    return len(replace_units(model, compiled))


def compile_regions(model: nn.Module, *, backend="inductor") -> tuple[str, ...]:
    """The model's outer layers (its ``compile_regions`` methods), each compiled as a function of its
    own; a model that names none keeps them eager (said in the tags: ``compile.regions=-``).
    ``model``: the model itself, not yet wrapped."""
    names = tuple(getattr(model, "compile_regions", ()))
    for name in names:
        setattr(model, name, torch.compile(getattr(model, name), backend=backend, dynamic=False))
    return names


def forward_loss(model: nn.Module, loss: Callable, plan: CompilePlan,
                 backend="inductor") -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The step's forward and loss as ``plan`` says: ``whole`` (DDP) one compiled function of the
    wrapped model and the loss; ``regions``, the (regionally compiled) model, then the compiled loss;
    ``off``, both as they are."""
    if plan.scope == "off":
        return lambda x, y: loss(model(x), y)
    set_limits()
    if plan.scope == "whole":
        if plan.single_graph:
            # One rank: no all-reduce to overlap, so DDPOptimizer's split buys nothing and costs a
            # graph boundary per bucket.
            torch._dynamo.config.optimize_ddp = False

        def step_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return loss(model(x), y)

        return torch.compile(step_forward, backend=backend)
    compiled_loss = torch.compile(loss, backend=backend, dynamic=False)
    return lambda x, y: compiled_loss(model(x), y)


def graph_count() -> int:
    """Graphs dynamo has compiled in this process so far (a rise inside the measured window is a
    recompile there)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))
