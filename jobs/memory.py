"""Memory of a rank: the host's resident set (read from /proc/self/status), the device
allocator's peaks, the exact bytes of parameters, gradients and optimizer state, and the unsharded
gradients FSDP holds under ``no_sync`` (room for them, and their release)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from contract.metrics import MODEL_STATE_BYTES

if TYPE_CHECKING:
    import torch
    from torch import nn

GIB = 1024**3

def reset_peak_memory(device) -> None:
    """Reset the device's peak counters and the host's peak RSS (both are read on GPU too)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        # Linux: writing 5 resets VmHWM (peak resident set) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(device) -> dict[str, float]:
    import torch

    # Host RSS on GPU too: CPU offload moves the parameters and optimizer state there.
    out = {"peak_rss_gib": _vm_hwm_bytes() / GIB}
    if device.type == "cuda":
        out.update(peak_mem_allocated_gib=torch.cuda.max_memory_allocated(device) / GIB,
                   peak_mem_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB)
    return out


def _proc_status_bytes(field: str) -> int | None:
    """A ``VmRSS:``/``VmHWM:`` line of /proc/self/status in bytes; None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS:") or 0


def setup_memory(device, rss_before_bytes: int) -> dict[str, float]:
    """Memory the model setup (build, shard, materialise) took: host RSS growth to its peak since
    :func:`reset_peak_memory`, and on GPU the allocator's peak. Read before the window's reset."""
    import torch

    out = {"setup_rss_growth_gib": max(0, _vm_hwm_bytes() - rss_before_bytes) / GIB}
    if device.type == "cuda":
        out["setup_peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    return out


def _vm_hwm_bytes() -> int:
    found = _proc_status_bytes("VmHWM:")
    if found is not None:
        return found
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def local_bytes(tensor) -> int:
    """Bytes of ``tensor`` on this rank: FSDP2 parameters are DTensors, of which only the local shard counts."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def model_state_bytes(model, optimizer, grad_bytes: int | None = None) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (exact, from tensors).

    ``grad_bytes``: gradient bytes read while gradients existed (the step loop frees them after
    every optimizer step); None counts the gradients present now.
    """
    import torch

    params = list(model.parameters())
    optim = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                optim += local_bytes(value)
    param_b = sum(local_bytes(p) for p in params)
    grad_b = grad_bytes if grad_bytes is not None else sum(local_bytes(p.grad) for p in params if p.grad is not None)
    return {"param_bytes": param_b, "grad_bytes": grad_b, "optim_state_bytes": optim,
            MODEL_STATE_BYTES: param_b + grad_b + optim}


# ---- FSDP's unsharded gradients, held by a backward under no_sync (the straggler probe's) --------

def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    """The FSDPParam records of every FSDP unit in ``model`` (torch's private state: read through
    getattr, so a torch that moves it yields nothing rather than failing)."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state else None
        yield from getattr(group, "fsdp_params", None) or []


def release_unsynced_grads(model: nn.Module) -> None:
    """Drop the unsharded gradients a backward under ``no_sync`` leaves behind.

    With gradient sync off, FSDP2 skips the reduce-scatter and keeps every gradient unsharded
    (on the unsharded parameter, or as its accumulated gradient) for a later synced backward;
    ``optimizer.zero_grad`` sees only the sharded parameters and frees none of it. A backward that
    is never followed by a synced one (the straggler probe) must drop them itself, or each rank
    keeps world-size times its sharded gradients (GPU review 3, G2). No-op for DDP."""
    for param in _fsdp_params(model):
        unsharded = getattr(param, "_unsharded_param", None)
        if unsharded is not None:
            unsharded.grad = None
        if getattr(param, "unsharded_accumulated_grad", None) is not None:
            param.unsharded_accumulated_grad = None


def room_for_unsynced_grads(model: nn.Module, device: torch.device) -> bool:
    """Whether every rank's ``device`` has free memory for the whole model's unsharded gradients,
    which a backward under FSDP2's ``no_sync`` holds until its end (always True off CUDA, and for
    DDP, whose gradients are whole anyway).

    Sync point (FSDP on CUDA only): one all-reduce of one integer, so that every rank takes the
    same decision: a pass under FSDP all-gathers parameters, and a rank that skipped it while its
    peers ran it would leave them waiting in that collective."""
    if device.type != "cuda" or next(_fsdp_params(model), None) is None:
        return True
    import torch

    needed = sum(p.numel() * p.element_size() for p in model.parameters())  # global numel under DTensor
    free_bytes, _ = torch.cuda.mem_get_info(device)
    room = torch.tensor([int(needed * 1.1 < free_bytes)])  # a CPU tensor: the gloo side of the group
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(room, op=torch.distributed.ReduceOp.MIN)
    return bool(room.item())
