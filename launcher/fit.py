"""Fit before launch: each cell's model built on the meta device (no memory, no weights), and the
bytes of parameters, gradients and optimizer state its busiest rank will hold under its strategy.

The prediction follows what the worker measures (jobs.metrics.model_state_bytes, max over ranks):
FSDP2 shards every parameter along dim 0 in ``torch.chunk`` pieces over the shard group, so a rank
holds ceil(dim0 / shards) rows of it, and its gradients and optimizer state follow the shard.
AdamW keeps two fp32 moments per element plus a one-element ``step``; SGD (momentum 0.9) one buffer.

Why this is exact, not an estimate (tests/test_fit.py measures it on real gloo ranks for every
project model under ddp, fsdp, zero2, fsdp_noshard and hsdp, and agrees to the byte):

- Uneven shards: rank 0 always holds the full ceil-sized chunk of every parameter, so the busiest
  rank's sum is the sum of the per-parameter ceilings (an odd vocabulary such as GPT-2's 50257 rows
  included). The measurement counts a DTensor's local tensor, which excludes the padding FSDP2
  allocates for the short last chunk; so does the prediction.
- Tied weights (GPT's embedding and head, transformers' tie_weights): ``module.parameters()``
  yields a shared parameter once, in the meta build as in the wrapped model.
- BatchNorm running statistics are buffers, not parameters: neither side counts them.
- Gradients: the worker reads them on its first step while they exist (the step loop frees them
  after every step); every parameter of the project models gets one, sharded like the parameter.
- AdamW's ``step`` is a 0-dim fp32 tensor per parameter (4 bytes, not sharded); zero2 (grad_op)
  differs from full only in resharding after forward, which nothing here holds between steps;
  fsdp_noshard is a shard group of 1; hsdp shards over a node's tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.spec import Layout, ModelSpec, Optimizer, Sharding, Strategy, StrategySpec

GIB = 1024**3


@dataclass(frozen=True)
class StateBytes:
    """Per rank (the busiest one): what it holds between steps."""

    params: int
    grads: int
    optimizer: int
    param_count: int  # the whole model's

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def parameter_shapes(model: ModelSpec) -> list[tuple[tuple[int, ...], int]]:
    """(shape, bytes per element) of every parameter, from a meta-device build of the model."""
    import torch

    from jobs.models import build_model

    with torch.device("meta"):
        module = build_model(model)
    return [(tuple(p.shape), p.element_size()) for p in module.parameters()]


def shard_count(strategy: StrategySpec, layout: Layout) -> int:
    """Over how many ranks each parameter is split."""
    if strategy.name is Strategy.ddp or strategy.sharding is Sharding.none:
        return 1
    if strategy.sharding is Sharding.hybrid:
        return layout.tasks_per_node
    return layout.world_size


def _rows_on_busiest_rank(shape: tuple[int, ...], shards: int) -> int:
    """Elements of the largest dim-0 chunk (torch.chunk: ceil-sized pieces, the first ones full)."""
    if not shape:
        return 1
    rows = math.ceil(shape[0] / shards)
    return rows * math.prod(shape[1:])


def predict(shapes: list[tuple[tuple[int, ...], int]], strategy: StrategySpec, layout: Layout,
            optimizer: Optimizer) -> StateBytes:
    shards = shard_count(strategy, layout)
    params = sum(_rows_on_busiest_rank(shape, shards) * size for shape, size in shapes)
    elements = sum(_rows_on_busiest_rank(shape, shards) for shape, _ in shapes)
    if optimizer is Optimizer.adamw:
        optim = 2 * 4 * elements + 4 * len(shapes)  # exp_avg, exp_avg_sq (fp32) and a scalar step each
    else:
        optim = 4 * elements  # momentum buffer
    return StateBytes(params=params, grads=params, optimizer=optim,
                      param_count=sum(math.prod(shape) for shape, _ in shapes))


def human(n_bytes: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{n_bytes:.0f} B"
