"""Bytes against the theory: what each strategy must move per optimizer step, by collective kind.

Pure arithmetic over the model's parameter shapes (the meta-device build of launcher/plan/fit.py),
counted the way the worker measures them (jobs/anatomy.py, nccl-tests' sizes: the all-reduced
buffer, the all-gathered output, the reduce-scattered input), in the dtype that travels
(jobs.spec.precision_plan):

- **ddp**: the gradients all-reduced once per step, in their dtype (fp32: autocast keeps fp32
  parameters, so fp32 gradients).
- **fsdp** (full) and **fsdp_offload**: each unit's parameters all-gathered in forward, and again in
  backward (resharded after forward); the root's own parameters (embeddings, head) are kept after
  forward (jobs.parallel.apply_fsdp), so once. Every micro-step gathers. Gradients reduce-scattered
  once per step. FSDP2 pads each parameter's dim 0 to a multiple of the shard count, so the padded
  sizes travel.
- **zero2** (grad_op): parameters gathered once per micro-step (kept after forward).
- **hsdp** (hybrid): fsdp within a node (shard group = the node's tasks), then each rank's gradient
  shard all-reduced across the nodes.
- **fsdp_noshard** (none): a shard group of one: nothing gathered, gradients all-reduced over every
  rank.

Gathers travel in ``param_dtype`` (fp32 unless ``precision.mode=params``), reductions in
``reduce_dtype`` (else ``param_dtype``, else fp32). DDP with ``broadcast_buffers`` (its default)
broadcasts the model's buffers (BatchNorm's running statistics) from rank 0 before the first forward
of each optimizer step (a forward under ``no_sync`` clears the flag, so accumulation adds none): that
is expected traffic, counted. FSDP units resharded after forward are those ``reshard_after_forward``
resolves to (contract/tuning.py). Not counted: BatchNorm's fp32 units under a low ``param_dtype``,
the optimizer's and health checks' scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.parallel import ParallelDims
from contract.spec import Layout, PrecisionSpec, Strategy, StrategySpec, WrapPolicy, precision_plan
from contract.tuning import reshards_after_forward

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TOLERANCE = 0.10  # measured bytes further than this from the theory are a finding


@dataclass(frozen=True)
class Param:
    shape: tuple[int, ...]
    in_unit: bool  # inside an FSDP unit (a block); False: the root's own parameter


def _padded(shape: tuple[int, ...], shards: int) -> int:
    """Elements FSDP2 moves for one parameter: dim 0 padded to a multiple of the shard count."""
    if not shape:
        return shards
    return math.ceil(shape[0] / shards) * shards * math.prod(shape[1:])


def bytes_per_step(params: list[Param], strategy: StrategySpec, precision: PrecisionSpec, layout: Layout,
                   accum_steps: int = 1, buffer_bytes: int = 0) -> dict[str, int]:
    """Bytes per optimizer step by collective kind (kinds that move nothing are left out);
    ``buffer_bytes``: the model's buffers (DDP broadcasts them)."""
    if layout.world_size <= 1:
        return {}
    plan = precision_plan(strategy.name, precision)
    if strategy.name is Strategy.ddp:
        out = {"all_reduce": sum(math.prod(p.shape) for p in params) * 4}
        if strategy.broadcast_buffers and buffer_bytes:
            out["broadcast"] = buffer_bytes
        return out
    gather = DTYPE_BYTES[plan.param_dtype or "fp32"]
    reduce = DTYPE_BYTES[plan.reduce_dtype or plan.param_dtype or "fp32"]
    dims = ParallelDims.of(strategy, layout)
    shards = dims.dp_shard
    if shards == 1:
        return {"all_reduce": sum(math.prod(p.shape) for p in params) * reduce}
    padded = sum(_padded(p.shape, shards) for p in params)
    # Units re-gather in backward only when resharded after forward; without units (wrap=none)
    # everything is the root's, kept after forward.
    reshard = reshards_after_forward(strategy, shards)
    regathered = sum(_padded(p.shape, shards) for p in params if p.in_unit) if (
        reshard and strategy.wrap is WrapPolicy.block) else 0
    out = {"all_gather": (padded + regathered) * gather * accum_steps, "reduce_scatter": padded * reduce}
    if dims.hybrid:  # each replica's shard all-reduced across the replicas
        out["all_reduce"] = padded // shards * reduce
    return out


def mismatch(measured: float | None, theory: float | None) -> float | None:
    """Measured over theory minus one; None where either is missing (or both are zero: agreement)."""
    if measured is None or theory is None:
        return None
    if not theory:
        return 0.0 if not measured else math.inf
    return measured / theory - 1


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
