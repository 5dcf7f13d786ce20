"""Measurement: memory, model-state bytes, cross-rank reduction and the summary schema.

Every name carries its unit. Reductions across ranks: throughput is summed (each rank's own
samples over its own time), step time is the slowest rank's per step (a synchronous step ends
when the last rank ends), memory is the maximum over ranks (the rank that runs out first).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence

GIB = 1024**3


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation over mean; 0 for a single value."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else math.nan


def scaling_efficiency(per_device: float, base_per_device: float) -> float:
    """Per-device throughput relative to the smallest cell of the same configuration (1.0 = linear)."""
    return per_device / base_per_device if base_per_device else math.nan


def mfu(flops_per_sample: Optional[float], samples_per_s_per_device: float, peak_flops_per_s: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s per device over the device's peak."""
    if not flops_per_sample or not peak_flops_per_s:
        return None
    return flops_per_sample * samples_per_s_per_device / peak_flops_per_s


# Dense peak FLOP/s per device and dtype (vendor datasheets, without sparsity). MFU is reported
# only for devices listed here; CPUs have no meaningful single figure and get none.
PEAK_FLOPS_PER_S: Dict[str, Dict[str, float]] = {
    "H100 SXM": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "H200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},
    "L40S": {"fp32": 91.6e12, "bf16": 362e12, "fp16": 362e12},
}


def peak_flops_for(device_name: str, precision: str) -> Optional[float]:
    # fp32 matmuls on Ampere+ run as TF32 only when enabled; we compare against plain fp32.
    for key, table in PEAK_FLOPS_PER_S.items():
        if all(part in device_name for part in key.split()):
            return table.get(precision)
    return None


# ---- memory --------------------------------------------------------------------------------

def reset_peak_memory(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        # Linux: writing 5 resets VmHWM (peak resident set) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(device) -> Dict[str, float]:
    import torch

    if device.type == "cuda":
        return {
            "peak_mem_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "peak_mem_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        }
    return {"peak_rss_gib": _vm_hwm_bytes() / GIB}


def _vm_hwm_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def local_bytes(tensor) -> int:
    """Bytes of ``tensor`` on this rank: FSDP2 parameters are DTensors, of which only the local shard counts."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def model_state_bytes(model, optimizer, grad_bytes: Optional[int] = None) -> Dict[str, int]:
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
            "model_state_bytes": param_b + grad_b + optim}


# ---- reduction -----------------------------------------------------------------------------

def gather_ranks(obj: Any) -> List[Any]:
    """Every rank's ``obj``, in rank order, on every rank (one collective, after measuring)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def summarize(per_rank: List[Dict[str, Any]], *, samples_per_step: int, tokens_per_sample: int, repeats: int) -> Dict[str, float]:
    """Reduce per-rank measurements of the measured window into the job's summary metrics.

    Each rank entry holds ``step_time_s`` and ``data_time_s`` (lists over measured steps),
    memory figures and model-state bytes.
    """
    world = len(per_rank)
    n_steps = len(per_rank[0]["step_time_s"])
    # The job's step time is the slowest rank's, step by step.
    slowest = [max(r["step_time_s"][i] for r in per_rank) for i in range(n_steps)]
    window = max(1, n_steps // repeats)
    windows = [range(i * window, (i + 1) * window) for i in range(repeats)]
    # Global throughput per window: sum over ranks of the rank's samples over its own time.
    per_window = [
        sum(samples_per_step * len(w) / sum(r["step_time_s"][i] for i in w) for r in per_rank) for w in windows
    ]
    throughput = statistics.fmean(per_window)
    out: Dict[str, float] = {
        "world_size": world,
        "measured_steps": n_steps,
        "throughput_samples_per_s": throughput,
        "throughput_samples_per_s_per_device": throughput / world,
        "throughput_cv": coefficient_of_variation(per_window),
        "step_time_ms_p50": 1e3 * percentile(slowest, 50),
        "step_time_ms_p90": 1e3 * percentile(slowest, 90),
        "step_time_ms_max": 1e3 * max(slowest),
        "data_time_share": max(sum(r["data_time_s"]) / sum(r["step_time_s"]) for r in per_rank),
    }
    if tokens_per_sample > 1:
        out["throughput_tokens_per_s"] = throughput * tokens_per_sample
        out["throughput_tokens_per_s_per_device"] = throughput * tokens_per_sample / world
    for key in per_rank[0]:
        # Memory and communication: the worst rank is the one that limits the job.
        if key.endswith(("_gib", "_bytes")) or key.startswith("comm_"):
            out[key] = max(r[key] for r in per_rank)
    return out
