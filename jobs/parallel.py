"""Data-parallel wrappers: one ``apply_*`` per strategy, explicit primitives in, module out.

Nothing here reads a config object or the environment: the worker decides the arguments.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from jobs.spec import Sharding

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    return None if name is None else _DTYPES[name]


def apply_ddp(
    model: nn.Module,
    device: torch.device,
    *,
    bucket_cap_mb: float,
    gradient_as_bucket_view: bool,
    static_graph: bool,
    find_unused_parameters: bool,
    broadcast_buffers: bool,
) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
        find_unused_parameters=find_unused_parameters,
        broadcast_buffers=broadcast_buffers,
    )


def fsdp_mesh(device_type: str, sharding: Sharding, num_nodes: int, tasks_per_node: int):
    """The device mesh a sharding mode needs.

    full / grad_op: 1-D over every rank. hybrid: 2-D (replicate across nodes, shard within a
    node). none: 2-D (replicate over every rank, shard over 1), i.e. FSDP2 running as DDP.
    """
    from torch.distributed.device_mesh import init_device_mesh

    world = num_nodes * tasks_per_node
    if sharding is Sharding.hybrid:
        return init_device_mesh(device_type, (num_nodes, tasks_per_node), mesh_dim_names=("replicate", "shard"))
    if sharding is Sharding.none:
        return init_device_mesh(device_type, (world, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))


def apply_fsdp(
    model: nn.Module,
    mesh,
    *,
    units: Sequence[nn.Module],
    reshard_after_forward: bool,
    param_dtype: Optional[torch.dtype],
    reduce_dtype: Optional[torch.dtype],
    cpu_offload: bool,
    prefetch: int,
) -> nn.Module:
    """FSDP2: shard each unit (block), then the root; returns the same module, now an FSDPModule."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    low_precision = param_dtype is not None and param_dtype != torch.float32
    if low_precision:
        # BatchNorm's running statistics and affine parameters must stay fp32: with a bf16
        # param_dtype FSDP2 fails with "expected scalar type BFloat16 but found Float". Each
        # BatchNorm becomes its own unit with an fp32 policy that hands bf16 back to the next layer.
        bn_policy = MixedPrecisionPolicy(
            param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=param_dtype
        )
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward,
                            mp_policy=bn_policy, offload_policy=offload)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp,
                    offload_policy=offload)
    # The root's parameters (embeddings, head) are used last in backward: keeping them gathered
    # after forward avoids an immediate re-all-gather (torchtitan does the same).
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)
    if prefetch > 0 and len(units) > 1:
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(list(units[i + 1 : i + 1 + prefetch]))
            unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - prefetch) : i])))
    return model
