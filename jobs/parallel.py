"""Data-parallel wrappers: one ``apply_*`` per strategy, one :func:`parallelize` that dispatches.

Nothing here reads a config object or the environment: the worker decides the arguments.

Build order (M1 of the GPU review): DDP models are built directly on their device. FSDP models
are built on the meta device, sharded, and only then materialised (:func:`materialize`: sharded
parameters on the device, or on the CPU under offload; buffers always on the device) and
initialised, so no rank ever holds the unsharded model. :func:`exact_sharded_init` makes that
initialisation draw exactly the numbers an eager build draws, from the device's generator, so DDP,
FSDP and offload start from the same weights for the same seed. A user's ``_target_`` model is the
exception: its constructor is its initialisation, which nothing can replay, so it is built eagerly
on the host and sharded as built (jobs.models.build_for).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from contract.parallel import ParallelDims
from contract.spec import (
    BatchNormUnits,
    Layout,
    PrecisionPlan,
    PrecisionSpec,
    Sharding,
    Strategy,
    StrategySpec,
    precision_plan,
)
from jobs import compiling
from jobs.compiling import CompilePlan
from jobs.shards import shard_of

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else _DTYPES[name]


# ---- precision (the plan itself is jobs.spec.precision_plan: the launcher reads it too) ----------

def make_grad_scaler(device_type: str, *, offload: bool = False):
    """fp16 loss scaling. The plain GradScaler serves FSDP2 too: DTensor gradients are unscaled
    shard by shard and DTensor all-reduces the found-inf flag over the mesh (PyTorch's own FSDP2
    grad-scaler test uses it); ShardedGradScaler exists for FSDP1's flat parameters.

    Under CPU offload the gradients are host tensors: the scale and found-inf state then live on
    the host too. Left on the GPU (the loss's device, where it would start), unscaling copies them
    to the host with ``non_blocking=True`` into pinned buffers that the CPU kernels read and write
    unsynchronised, so a late copy can overwrite a detected inf and apply a bad step (GPU review
    3, G3; pytorch#176429 fixed the same race in FSDP1's scaler)."""
    scaler = torch.amp.GradScaler(device_type)
    if offload and device_type == "cuda":
        # torch's own lazy initialiser, called early with the host as the device (torch 2.6-2.13).
        scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    return scaler


def bf16_refusal(device_name: str, capability: tuple | None) -> str | None:
    """Why bf16 cannot run on this CUDA device (compute capability below 8.0), or None."""
    if capability is None or tuple(capability) >= (8, 0):
        return None
    return (f"precision=bf16 on {device_name} (compute capability {capability[0]}.{capability[1]}): bf16 needs "
            f"an Ampere or newer GPU (8.0+); on older GPUs it is emulated, and any figure measured is meaningless. "
            f"Fix: use precision=fp16 (with loss scaling) or fp32 on this GPU.")


# ---- DDP ---------------------------------------------------------------------------------------

def ddp_buffer_kwargs(sync_buffers: bool, ddp_init=None) -> dict:
    """DDP's buffer-sync flag under the name the installed torch takes without a warning.

    torch 2.13 deprecates ``broadcast_buffers`` for ``forward_sync_buffers`` (which still syncs
    buffers once at construction; every rank builds identical buffers here, so that changes nothing).
    """
    if ddp_init is None:
        from torch.nn.parallel import DistributedDataParallel

        ddp_init = DistributedDataParallel.__init__
    if "forward_sync_buffers" in inspect.signature(ddp_init).parameters:
        return {"forward_sync_buffers": sync_buffers}
    return {"broadcast_buffers": sync_buffers}


def apply_ddp(
    model: nn.Module,
    device: torch.device,
    *,
    bucket_cap_mb: float,
    gradient_as_bucket_view: bool,
    static_graph: bool,
    find_unused_parameters: bool,
    broadcast_buffers: bool,
) -> nn.parallel.DistributedDataParallel:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
        find_unused_parameters=find_unused_parameters,
        **ddp_buffer_kwargs(broadcast_buffers),
    )


# ---- FSDP --------------------------------------------------------------------------------------

def fsdp_mesh(device_type: str, dims: ParallelDims):
    """The device mesh of a cell's parallel layout (contract/parallel.py): full / grad_op 1-D over
    every rank; hybrid 2-D (replicate across nodes, shard within a node); none 2-D (replicate over
    every rank, shard over 1), i.e. FSDP2 running as DDP."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, dims.mesh_shape(), mesh_dim_names=dims.mesh_dims)


def batchnorms(model: nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def apply_fsdp(
    model: nn.Module,
    mesh,
    *,
    units: Sequence[nn.Module],
    reshard_after_forward: bool,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    cpu_offload: bool,
    prefetch: int,
    batchnorm: BatchNormUnits = BatchNormUnits.unit,
) -> nn.Module:
    """FSDP2: shard each unit (block), then the root; returns the same module, now an FSDPModule.

    BatchNorm under a low-precision ``param_dtype``: its running statistics and affine parameters
    must stay fp32 (a bf16 BatchNorm fails with "expected scalar type BFloat16 but found Float").
    ``batchnorm=unit``: each BatchNorm is its own fp32 unit whose input is cast up and output cast
    back (one collective per BatchNorm). ``grouped``: every BatchNorm in ONE fp32 unit that leaves
    inputs alone (BatchNorm takes low-precision input with fp32 parameters and statistics natively):
    one all-gather for all of them, no activation-sized casts.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    shard = functools.partial(fully_shard, mesh=mesh, reshard_after_forward=reshard_after_forward,
                              offload_policy=offload)
    norms = batchnorms(model) if param_dtype not in (None, torch.float32) else []
    if norms and BatchNormUnits(batchnorm) is BatchNormUnits.grouped:
        shard(norms, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                                    cast_forward_inputs=False))
    else:
        bn_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                         output_dtype=param_dtype)
        for module in norms:
            shard(module, mp_policy=bn_policy)
    sharded: list[FSDPModule] = [shard(unit, mp_policy=mp) for unit in units]  # the same modules, now FSDPModules
    # The root's parameters (embeddings, head) are used last in backward: keeping them gathered
    # after forward avoids an immediate re-all-gather (torchtitan does the same).
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)
    if prefetch > 0 and len(sharded) > 1:
        for i, unit in enumerate(sharded):
            unit.set_modules_to_forward_prefetch(list(sharded[i + 1 : i + 1 + prefetch]))
            unit.set_modules_to_backward_prefetch(list(reversed(sharded[max(0, i - prefetch) : i])))
    return model


@contextlib.contextmanager
def exact_sharded_init(draw_device: torch.device | None = None) -> Iterator[None]:
    """Random in-place inits of DTensor parameters draw the FULL tensor, then keep the local shard.

    The draws are then exactly an eager build's (same generator, same sequence), so FSDP starts
    from DDP's weights under the same seed; peak extra memory is one full parameter at a time,
    never the whole model. Deterministic ops (zero_, fill_, mul_ ...) run shard-wise as usual.
    ``draw_device``: where the full tensor is drawn (default: where the shard lives). Offload keeps
    its shards on the CPU but draws on the compute device, from the generator DDP's eager build
    draws from (R6 of the GPU review); the shard is then copied to the host.
    """
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    random_ops = {torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default}

    class _FullDraw(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            target = args[0] if args else None
            if func in random_ops and isinstance(target, DTensor):
                local = target._local_tensor
                full = torch.empty(target.shape, dtype=local.dtype, device=draw_device or local.device)
                func(full, *args[1:], **kwargs)
                local.copy_(shard_of(full, target.device_mesh, target.placements))
                return target
            return func(*args, **kwargs)

    with _FullDraw():
        yield


def materialize(model: nn.Module, device: torch.device, *, offload: bool = False) -> None:
    """Allocate a sharded meta model's storage and initialise it exactly (jobs.models.materialize,
    the same function an eager build runs): sharded parameters on ``device``, or on the CPU under
    offload, where offload keeps them; buffers on ``device`` in both cases, where the forward
    reads them (FSDP moves states to the device only inside fully_shard, and skips meta ones: R1
    of the GPU review); every random draw on ``device`` (R6)."""
    from jobs.models import build

    with exact_sharded_init(draw_device=device):
        build.materialize(model, device, param_device=torch.device("cpu") if offload else device)


# ---- one dispatch --------------------------------------------------------------------------------

@dataclass
class Parallelized:
    model: nn.Module  # the wrapped model (under FSDP with compile, its units and outer regions compiled)
    no_sync: Callable[[], AbstractContextManager]  # skips gradient communication (accumulation micro-steps)
    autocast_dtype: torch.dtype | None
    scaler: object  # torch.amp.GradScaler or None
    plan: PrecisionPlan
    compile_plan: CompilePlan = CompilePlan("off")
    compile_backend: Any = "inductor"

    def step_forward(self, loss: Callable) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The step's forward and loss, ``(x, y) -> loss``, compiled as :attr:`compile_plan` says
        (jobs/compiling.py: the loss always inside a compiled graph)."""
        return compiling.forward_loss(self.model, loss, self.compile_plan, self.compile_backend)


@contextlib.contextmanager
def _fsdp_no_sync(model) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def parallelize(model: nn.Module, strategy: StrategySpec, precision: PrecisionSpec, *, device: torch.device,
                dims: ParallelDims | None = None, compile: bool = False, compile_backend: Any = "inductor",
                reshard_after_forward: bool | None = None, channels_last: bool = False) -> Parallelized:
    """Wrap ``model`` for ``strategy``: DDP expects it built on ``device``; FSDP expects it on
    meta (or anywhere: a materialised model is sharded as is) and materialises it after sharding.
    ``dims``: the cell's parallel layout (contract/parallel.py), which gives FSDP its mesh.
    ``compile``: DDP's model is compiled with the loss, whole (:meth:`Parallelized.step_forward`);
    FSDP's units and outer regions are compiled here, before sharding (jobs/compiling.py).
    ``compile_backend``: inductor, or a trace-only backend (bench/census.py counts the graphs).
    ``reshard_after_forward``: FSDP's, resolved (contract/tuning.py; None: not under grad_op).
    ``channels_last``: the weights of 4-D convolutions in the channels-last memory format under DDP.
    FSDP2 refuses non-contiguous parameters ("FSDP does not support non-contiguous parameters yet",
    torch 2.13), so under FSDP only the input is channels-last: a convolution runs channels-last
    when its input or its weight is (torch's suggest_memory_format), and reads the gathered
    contiguous weight in that format."""
    from jobs.models.units import replace_units, shard_units

    plan = precision_plan(strategy.name, precision)
    if channels_last and strategy.name is Strategy.ddp:
        # Before wrapping: DDP's buckets follow the parameters' layout.
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if reshard_after_forward is None:
        reshard_after_forward = strategy.sharding is not Sharding.grad_op
    if strategy.name is Strategy.ddp:
        model = apply_ddp(
            model, device, bucket_cap_mb=strategy.bucket_cap_mb, gradient_as_bucket_view=strategy.gradient_as_bucket_view,
            static_graph=strategy.static_graph, find_unused_parameters=strategy.find_unused_parameters,
            broadcast_buffers=strategy.broadcast_buffers,
        )
        no_sync = model.no_sync
        compile_plan = CompilePlan("whole", single_graph=dims is None or dims.world_size == 1) if compile \
            else CompilePlan("off")
    else:
        on_meta = any(p.is_meta for p in model.parameters())
        compile_plan = CompilePlan("off")
        if compile:
            # Before sharding, so that FSDP's hooks go on the compiled modules, outside their graphs.
            compile_plan = CompilePlan("regions", units=compiling.compile_units(model, replace_units,
                                                                                backend=compile_backend),
                                       regions=compiling.compile_regions(model, backend=compile_backend))
        mesh = fsdp_mesh(device.type, dims or ParallelDims.of(strategy, Layout()))  # None: one rank
        model = apply_fsdp(
            model, mesh, units=shard_units(model) if strategy.wrap.value == "block" else [],
            reshard_after_forward=reshard_after_forward,
            param_dtype=torch_dtype(plan.param_dtype), reduce_dtype=torch_dtype(plan.reduce_dtype),
            cpu_offload=strategy.cpu_offload, prefetch=strategy.prefetch, batchnorm=precision.batchnorm,
        )
        if on_meta:
            materialize(model, device, offload=strategy.cpu_offload)
        # Bound now, to the FSDP module itself: not to whatever `model` names after compiling.
        no_sync = functools.partial(_fsdp_no_sync, model)
    scaler = make_grad_scaler(device.type, offload=strategy.cpu_offload) if plan.grad_scaler else None
    return Parallelized(model, no_sync, torch_dtype(plan.autocast), scaler, plan, compile_plan, compile_backend)


# torch.optim's flags for each optimizer_impl (contract.spec.OptimizerImpl, resolved).
_IMPL_FLAGS: dict[str, dict[str, Any]] = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False, "fused": False}}


def build_optimizer(model: nn.Module, name, lr: float, impl: str = "foreach") -> torch.optim.Optimizer:
    """AdamW or SGD (momentum 0.9) stepping the way ``impl`` says: fused, foreach or for_loop.

    Chosen, never left to torch's default: that default is foreach for plain tensors and a
    per-parameter loop for FSDP's DTensor parameters (torch.optim's _default_to_fused_or_foreach),
    which made FSDP's optimizer step slower than DDP's for no reason of the strategy's."""
    flags = _IMPL_FLAGS[getattr(impl, "value", impl)]
    if flags.get("fused"):
        refusal = fused_refusal(model, getattr(name, "value", name))
        if refusal:
            raise ValueError(refusal)
    if getattr(name, "value", name) == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, **flags)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, **flags)


def optimizer_for(model: nn.Module, name, lr: float, impl: str, *, auto: bool) -> tuple[torch.optim.Optimizer, str]:
    """(optimizer, the implementation it steps with): ``impl`` as resolved (contract/tuning.py). Where
    ``auto`` chose fused and this torch has no such kernel for these parameters, foreach instead (a
    fused setting the user asked for is refused: :func:`build_optimizer`)."""
    if auto and impl == "fused" and fused_refusal(model, getattr(name, "value", name)):
        impl = "foreach"
    return build_optimizer(model, name, lr, impl), impl


def fused_refusal(model: nn.Module, optimizer: str) -> str | None:
    """Why a fused ``optimizer`` cannot step these parameters on this torch, or None."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in model.parameters()}
    supported = set(_get_fused_kernels_supported_devices())
    if not devices <= supported:
        return (f"optimizer_impl=fused: torch {torch.__version__} has fused optimizer kernels for "
                f"{', '.join(sorted(supported))}, and the parameters live on {', '.join(sorted(devices))}. "
                "Fix: use optimizer_impl=foreach (or auto).")
    if optimizer == "sgd" and any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return ("optimizer_impl=fused with optimizer=sgd: torch has no fused SGD kernel for FSDP's sharded "
                "(DTensor) parameters. Fix: use optimizer_impl=foreach (or auto), or optimizer=adamw.")
    return None

