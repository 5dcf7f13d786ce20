"""The device's peak FLOP/s and model FLOPs utilisation: the datasheet's peak (contract/gpus.py, the
one GPU table), the math mode fp32 ops run in, and the matmul peak measured on the device
(jobs/matmul_peak.py times it)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from contract.gpus import device_peaks
from contract.metrics import MEASURED_MATMUL_TFLOPS


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
               for r, p in enumerate(per_rank) if not p or not p.get(MEASURED_MATMUL_TFLOPS)]
    if missing or not per_rank:
        return None, "; ".join(missing)[:500] or "no devices"
    return statistics.fmean(p[MEASURED_MATMUL_TFLOPS] for p in per_rank if p), None
