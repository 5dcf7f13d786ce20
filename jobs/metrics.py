"""Measurement: memory, model-state bytes, cross-rank reduction and the summary schema.

Every name carries its unit. Reductions across ranks: throughput is summed (each rank's own
samples over its own time), step time is the slowest rank's per step (a synchronous step ends
when the last rank ends), memory is the maximum over ranks (the rank that runs out first).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

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


def mfu(flops_per_sample: float | None, samples_per_s_per_device: float, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s per device over the device's peak (None
    when unknown, or when above 1: see :func:`mfu_checked` for the reason)."""
    return mfu_checked(flops_per_sample, samples_per_s_per_device, peak_flops_per_s)[0]


def mfu_checked(flops_per_sample: float | None, samples_per_s_per_device: float,
                peak_flops_per_s: float | None) -> tuple[float | None, str | None]:
    """(MFU or None, why it is None). An MFU above 100% is never reported: it means the peak is
    wrong for this device or math mode (e.g. TF32 on while the fp32 peak was used) or the FLOP
    count is, and either way the number would mislead."""
    if not flops_per_sample:
        return None, "no FLOP count for this model"
    if not peak_flops_per_s:
        return None, "no peak FLOP/s known for this device and precision"
    value = flops_per_sample * samples_per_s_per_device / peak_flops_per_s
    if value > 1.0:
        return None, (f"computed MFU {value:.2f} exceeds 1: the device peak ({peak_flops_per_s / 1e12:.1f} TFLOP/s) "
                      f"or the model's FLOP count is wrong for this run")
    return value, None


# Dense peak FLOP/s per device and math mode (vendor datasheets, without sparsity), matched on
# the name torch.cuda.get_device_name() reports. Matching follows torchtitan's get_peak_flops:
# family first ("H100"), then the variant ("NVL", "PCIe"), else the SXM part, because the SXM
# H100 reports itself as "NVIDIA H100 80GB HBM3" with no "SXM". A device not listed gets no MFU:
# never another GPU's figures. "tf32": None marks a GPU without TF32 units (fp32 math always).
_T = 1e12
_H100_SXM: dict[str, float | None] = {"fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T}
_H100_PCIE: dict[str, float | None] = {"fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T, "fp16": 756 * _T}
_H100_NVL: dict[str, float | None] = {"fp32": 60 * _T, "tf32": 417.5 * _T, "bf16": 835 * _T, "fp16": 835 * _T}
_A100: dict[str, float | None] = {"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T}
# (name tokens that must all appear, case-insensitive; first match wins, most specific first)
PEAK_FLOPS_PER_S: list[tuple[tuple[str, ...], dict[str, float | None]]] = [
    (("GH200",), _H100_SXM),  # Grace Hopper: the H100 SXM's tensor cores (before "H200")
    (("H200", "NVL"), _H100_NVL),
    (("H200",), _H100_SXM),  # same compute as the H100 SXM, more memory
    (("H100", "NVL"), _H100_NVL),
    (("H100", "PCIe"), _H100_PCIE),
    (("H100",), _H100_SXM),  # "NVIDIA H100 80GB HBM3" = SXM5
    (("H800", "PCIe"), _H100_PCIE),
    (("H800",), _H100_SXM),  # export H100: same compute, less NVLink
    (("H20",), {"fp32": 44 * _T, "tf32": 74 * _T, "bf16": 148 * _T, "fp16": 148 * _T}),
    (("B200",), {"bf16": 2250 * _T, "fp16": 2250 * _T}),  # torchtitan's figure; fp32/tf32 not listed
    (("A100",), _A100),
    (("A800",), _A100),
    (("A10G",), {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T}),  # AWS: A10 figures
    (("A10",), {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T}),
    (("A30",), {"fp32": 10.3 * _T, "tf32": 82 * _T, "bf16": 165 * _T, "fp16": 165 * _T}),
    (("L40S",), {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T}),
    (("L40",), {"fp32": 90.5 * _T, "tf32": 90.5 * _T, "bf16": 181 * _T, "fp16": 181 * _T}),
    (("L4",), {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T}),
    (("V100S",), {"fp32": 16.4 * _T, "tf32": None, "fp16": 130 * _T}),
    (("V100", "PCIE"), {"fp32": 14 * _T, "tf32": None, "fp16": 112 * _T}),
    (("V100",), {"fp32": 15.7 * _T, "tf32": None, "fp16": 125 * _T}),  # SXM2
    (("T4",), {"fp32": 8.1 * _T, "tf32": None, "fp16": 65 * _T}),
    (("MI300X",), {"fp32": 163.4 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T}),
    (("MI325X",), {"fp32": 163.4 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T}),
]


def _matches(device_name: str, tokens: tuple[str, ...]) -> bool:
    # Whole words only, "-" splitting them ("A100-SXM4-80GB"): "L40" is not "L40S", "H20" not "H200".
    words = set(device_name.upper().replace("-", " ").replace("_", " ").split())
    return all(t.upper() in words for t in tokens)


def device_peaks(device_name: str) -> dict[str, float | None] | None:
    for tokens, table in PEAK_FLOPS_PER_S:
        if _matches(device_name, tokens):
            return table
    return None


def fp32_math(matmul_allow_tf32: bool, cudnn_allow_tf32: bool, float32_matmul_precision: str,
              has_conv: bool) -> str:
    """The math fp32 ops run in, hence which peak an fp32 run's MFU divides by: "tf32" when the
    model's main op class may use TF32 (convolutions: cudnn.allow_tf32, on by default; matmuls:
    cuda.matmul.allow_tf32 or float32_matmul_precision "high"/"medium", off by default), else
    "fp32". A model with both counts as TF32 if either may: the higher peak, the lower MFU."""
    matmul_tf32 = matmul_allow_tf32 or float32_matmul_precision in ("high", "medium")
    return "tf32" if matmul_tf32 or (has_conv and cudnn_allow_tf32) else "fp32"


def peak_flops_for(device_name: str, precision: str, math: str | None = None) -> float | None:
    """Peak FLOP/s of ``device_name`` for ``precision`` (fp32 | bf16 | fp16); ``math`` ("fp32" |
    "tf32", from :func:`fp32_math`) picks the fp32 column. None when not known."""
    table = device_peaks(device_name)
    if table is None:
        return None
    key = precision
    if precision == "fp32" and math == "tf32":
        # A GPU without TF32 units (V100, T4) runs fp32 math whatever the flags say.
        key = "fp32" if table.get("tf32", 0.0) is None else "tf32"
    return table.get(key)


def read_setting(getter: Callable[[], Any]) -> Any:
    """A torch math setting, or None where torch refuses to say (torch 2.9+ raises on reading a
    setting once its legacy and new APIs were mixed): a tag is never worth failing a job."""
    try:
        return getter()
    except (RuntimeError, AttributeError):
        return None


def precision_settings(torch) -> dict[str, str]:
    """The fp32 math settings in force (tags): they decide the fp32 peak (M4). "unknown" where
    torch refuses to read one (G7)."""
    matmul = read_setting(lambda: bool(torch.backends.cuda.matmul.allow_tf32))
    cudnn = read_setting(lambda: bool(torch.backends.cudnn.allow_tf32))
    precision = read_setting(torch.get_float32_matmul_precision)
    return {"cuda_matmul_allow_tf32": "unknown" if matmul is None else str(matmul),
            "cudnn_allow_tf32": "unknown" if cudnn is None else str(cudnn),
            "float32_matmul_precision": precision or "unknown"}


# ---- memory --------------------------------------------------------------------------------

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
            "model_state_bytes": param_b + grad_b + optim}


# ---- reduction -----------------------------------------------------------------------------

def gather_ranks(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (one collective, after measuring)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def summarize(per_rank: list[dict[str, Any]], *, samples_per_step: int, tokens_per_sample: int, repeats: int) -> dict[str, float]:
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
    out: dict[str, float] = {
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
        if key.endswith(("_gib", "_bytes")) or key.startswith(("comm_", "memcpy_", "fp16_")):
            out[key] = max(r[key] for r in per_rank)
    return out


# ---- per-step records ------------------------------------------------------------------------

def step_records(histories: list[dict[str, Any]], lo: int, hi: int) -> list[dict[str, float]]:
    """Per-step records for steps lo..hi-1 from every rank's portable history: the mean loss over
    ranks and the slowest rank's step time (a synchronous step ends when the last rank ends)."""
    out = []
    for step in range(lo, hi):
        idx = [h["steps"].index(step) for h in histories]
        pairs = list(zip(histories, idx, strict=True))
        out.append({"step": step, "loss": sum(h["losses"][i] for h, i in pairs) / len(pairs),
                    "step_time_ms": 1e3 * max(h["step_time_s"][i] for h, i in pairs)})
    return out


def mean_losses(histories: list[dict[str, Any]], total_steps: int) -> list[float]:
    """Loss per step averaged over ranks; rank 0's own when not every rank ran every step (a
    resume on a different layout: the old ranks' steps live only in rank 0's restored history)."""
    if all(h["steps"] == list(range(total_steps)) for h in histories):
        return [sum(h["losses"][i] for h in histories) / len(histories) for i in range(total_steps)]
    return histories[0]["losses"]


def skipped_steps(history: dict[str, Any]) -> dict[str, int]:
    """fp16 steps the GradScaler skipped (inf/NaN gradients), inside and before the measured window."""
    flags = history.get("skipped") or []
    pairs = list(zip(flags, history["measured"], strict=False))  # no flags without a scaler
    return {"fp16_skipped_steps": sum(1 for s, m in pairs if s and m),
            "fp16_skipped_steps_warmup": sum(1 for s, m in pairs if s and not m)}


# ---- interference, stragglers, steady state, cost --------------------------------------------

def foreign_cpu_share(windows: list[dict[str, Any] | None]) -> float | None:
    """The largest share, over hosts, of the host's job cores' time that other processes used
    during the measured window (jobs/interference.py samples it; None without a full sample).

    Per host: the cores are the union of its ranks' affinity sets; the busy time is read from the
    first rank's sample (one consistent reading of every core); our time is the sum of the host's
    ranks' own CPU time. ``max(0, busy - ours) / (window_s * cores)``.
    """
    by_host: dict[str, list[dict[str, Any]]] = {}
    for w in windows:
        if w is None:
            return None  # a rank without a window: the comparison would miss its time
        by_host.setdefault(w["host"], []).append(w)
    shares = []
    for ranks in by_host.values():
        cores = sorted(set().union(*(set(r["cpus"]) for r in ranks)))
        ref = ranks[0]
        busy_s = sum(ref["busy_ticks_delta"].get(c, 0) for c in cores) / ref["ticks_per_s"]
        ours_s = sum(r["own_cpu_delta_s"] for r in ranks)
        capacity_s = ref["window_s"] * len(cores)
        if capacity_s <= 0:
            continue
        shares.append(max(0.0, busy_s - ours_s) / capacity_s)
    return max(shares) if shares else None


STRAGGLER_LIMIT = 1.10  # a rank this much slower than the median rank is named a straggler


def stragglers(rank_medians_s: Sequence[float], hosts: Sequence[str]) -> tuple[dict[str, float], dict[str, str]]:
    """(summary, tags) from each rank's median step time: ``step_time_rank_spread`` = slowest
    rank's median over the median of the ranks' medians; tag ``slowest_rank`` ("<rank> on
    <host>"), and ``straggler_rank`` when the slowest is more than 10% above the median."""
    if not rank_medians_s:
        return {}, {}
    middle = statistics.median(rank_medians_s)
    slowest = max(range(len(rank_medians_s)), key=lambda r: rank_medians_s[r])
    spread = rank_medians_s[slowest] / middle if middle > 0 else math.nan
    tags = {"slowest_rank": f"{slowest} on {hosts[slowest]}"}
    if spread > STRAGGLER_LIMIT:
        tags["straggler_rank"] = tags["slowest_rank"]
    return {"step_time_rank_spread": spread}, tags


# Steady-state rule: the warm-up is still settling while the median of its last WARMUP_K step
# times is more than WARMUP_FALL_RATIO below the median of the WARMUP_K before them. Medians of
# three ignore one outlier on either side (a GC pause, a page fault), and comparing two adjacent
# groups needs no model of the decay.
WARMUP_K = 3
WARMUP_FALL_RATIO = 1.10


def still_falling(step_times_s: Sequence[float], k: int = WARMUP_K, ratio: float = WARMUP_FALL_RATIO) -> bool:
    """Whether step times still trend down: median(previous k) > ratio x median(last k). False
    with fewer than 2k times (too short to tell: the configured warm-up stands)."""
    if len(step_times_s) < 2 * k:
        return False
    last = statistics.median(step_times_s[-k:])
    before = statistics.median(step_times_s[-2 * k:-k])
    return before > ratio * last


def cost_per_1m(throughput_per_s: float, *, devices: int, nodes: int, cost_per_device_hour: float | None,
                cost_per_node_hour: float | None) -> float | None:
    """What a million samples (or tokens: pass the token throughput) cost: the job's price per
    hour (devices x cost_per_device_hour, else nodes x cost_per_node_hour) over its throughput
    per hour, times 1e6. None without a price or a throughput."""
    if cost_per_device_hour is not None:
        per_hour = devices * cost_per_device_hour
    elif cost_per_node_hour is not None:
        per_hour = nodes * cost_per_node_hour
    else:
        return None
    if not throughput_per_s or throughput_per_s <= 0:
        return None
    return per_hour / (throughput_per_s * 3600.0) * 1e6


# ---- energy and the measured matmul peak (GPU ranks; NVML samples from jobs/interference.py) ----

# nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver was loaded, an unsigned 64-bit
# counter (Volta and later; older GPUs raise NVMLError_NotSupported).
ENERGY_COUNTER_MODULUS_MJ = 2**64


def energy_from_counter_j(start_mj: int | None, end_mj: int | None) -> float | None:
    """Joules between two readings of NVML's total-energy counter; None when either is missing.

    A reading below the first is the counter wrapping at 2**64 mJ, not a reset: the driver cannot
    be reloaded while this process holds a CUDA context on the device, which it does throughout.
    """
    if start_mj is None or end_mj is None:
        return None
    delta_mj = end_mj - start_mj
    if delta_mj < 0:
        delta_mj += ENERGY_COUNTER_MODULUS_MJ
    return delta_mj / 1e3


def energy_from_power_j(times_s: Sequence[float], power_w: Sequence[float]) -> float | None:
    """Joules from power samples by the trapezoid rule over their times (seconds, increasing).
    None with fewer than two samples: one reading says nothing about how long it held."""
    if len(times_s) != len(power_w):
        raise ValueError(f"{len(times_s)} sample times but {len(power_w)} power readings")
    if len(times_s) < 2:
        return None
    return sum(0.5 * (power_w[i] + power_w[i - 1]) * (times_s[i] - times_s[i - 1]) for i in range(1, len(times_s)))


def energy_figures(per_device: list[dict[str, Any] | None], samples_in_window: float
                   ) -> tuple[dict[str, float], dict[str, str]]:
    """(summary, tags) from each rank's device energy over the measured window.

    ``per_device``: one entry per rank (each rank has its own GPU: jobs.dist.check_unique_gpus),
    ``{"energy_j", "window_s", "method"}`` or ``{"missing": why}``; ``samples_in_window``: samples
    every rank together trained in the window.

    - ``energy_j``: joules of all the job's devices over the window (their sum);
    - ``energy_j_per_sample``: that sum over the samples (the energy the job spent per sample);
    - ``power_w_mean``: the mean over devices of each device's mean power (its joules over its
      window), i.e. what one device drew on average.

    A device without a figure gives no summary at all (a sum over the others would understate the
    job's energy); the tag ``energy_missing`` says which rank and why. Tag ``energy_method`` says
    how the joules were obtained (counter, power samples, or both across devices).
    """
    missing = [f"rank {r}: {d.get('missing') if d else 'no NVML sample'}"
               for r, d in enumerate(per_device) if not d or d.get("energy_j") is None]
    if missing or not per_device:
        return {}, {"energy_missing": "; ".join(missing)[:500] or "no devices"}
    if samples_in_window <= 0:
        return {}, {"energy_missing": "no samples in the measured window"}
    devices = [d for d in per_device if d]
    total_j = sum(d["energy_j"] for d in devices)
    powers = [d["energy_j"] / d["window_s"] for d in devices if d["window_s"] > 0]
    summary = {"energy_j": total_j, "energy_j_per_sample": total_j / samples_in_window}
    if len(powers) == len(devices):
        summary["power_w_mean"] = statistics.fmean(powers)
    return summary, {"energy_method": ",".join(sorted({d["method"] for d in devices}))}


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of one (m x k) @ (k x n) matmul: m*n*k multiply-adds, two FLOPs each."""
    return 2 * m * n * k


def matmul_tflops(n: int, iterations: int, elapsed_s: float) -> float:
    """TFLOP/s of ``iterations`` square n x n matmuls that took ``elapsed_s`` together."""
    if elapsed_s <= 0 or iterations <= 0:
        raise ValueError(f"need a positive time and iteration count, got {elapsed_s} s, {iterations} iterations")
    return matmul_flops(n, n, n) * iterations / elapsed_s / 1e12


def measured_peak(per_rank: list[dict[str, Any] | None]) -> tuple[float | None, str | None]:
    """(mean measured matmul TFLOP/s over the job's devices, or None and why). The mean over
    devices matches the per-device throughput it divides (the job's mean per device); a device
    without a measurement leaves the figure out rather than averaging the others."""
    missing = [f"rank {r}: {p.get('missing') if p else 'not measured'}"
               for r, p in enumerate(per_rank) if not p or not p.get("measured_matmul_tflops")]
    if missing or not per_rank:
        return None, "; ".join(missing)[:500] or "no devices"
    return statistics.fmean(p["measured_matmul_tflops"] for p in per_rank if p), None


# ---- system metrics of the job's own GPUs (logged by rank 0 as MLflow "system/" metrics) ------

SYSTEM_MAX_POINTS = 300  # per device and series: enough for a plot, small in the gather and the store


def thin(items: Sequence[Any], max_points: int = SYSTEM_MAX_POINTS) -> list[Any]:
    """At most ``max_points`` items, evenly spaced, the first and last always kept."""
    if len(items) <= max_points:
        return list(items)
    if max_points < 2:
        return [items[-1]] if max_points == 1 else []
    step = (len(items) - 1) / (max_points - 1)
    return [items[round(i * step)] for i in range(max_points)]


def system_metric_prefix(node_id: int, device_index: int) -> str:
    """``system/node<N>/gpu<I>_``: MLflow's system-metrics view shows keys under ``system/``; the
    node's id and the device's index on that node name each of the job's GPUs once."""
    return f"system/node{node_id}/gpu{device_index}_"


# (series in a sample, metric name suffix with its unit)
SYSTEM_SERIES = (("util_percent", "utilization_percent"), ("mem_used_gib", "memory_used_gib"),
                 ("power_w", "power_w"))


def system_records(per_rank: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One record per device and sample, step-indexed from the window's first sample:
    ``{"step": i, "time": unix_s, "system/node<N>/gpu<I>_utilization_percent": ..., ...}``.

    ``per_rank``: each rank's ``{"node_id", "device_index", "samples": [{"unix_s", "util_percent",
    "mem_used_gib", "power_w"}, ...]}`` (a series NVML could not read is absent from its samples),
    or None for a rank without a GPU sampler."""
    out = []
    for entry in per_rank:
        if not entry:
            continue
        prefix = system_metric_prefix(entry["node_id"], entry["device_index"])
        for i, sample in enumerate(entry["samples"]):
            rec: dict[str, Any] = {"step": i, "time": sample["unix_s"]}
            for field, name in SYSTEM_SERIES:
                if sample.get(field) is not None:
                    rec[prefix + name] = sample[field]
            if len(rec) > 2:
                out.append(rec)
    return out
