"""The device's matmul peak, measured on the node before the measured window (CUDA ranks only).

MFU against a datasheet peak says how far a run is from a number the device may never reach on
this node (power cap, clocks, a PCIe part reporting an SXM name); MFU against a peak measured on
the same device, in the same dtype and math mode, says how far the model is from what this
device actually does on one large dense matmul. Both are reported (jobs.summary.mfu_figures).

The measurement runs during setup, after the model is built and the setup's memory read, outside
every timed region: a few untimed warm-ups (clocks ramp, cuBLAS picks its kernel), then
``iterations`` back-to-back matmuls between two CUDA events. The buffers are freed and the
allocator's cache emptied afterwards, so the window's memory figures do not see them.

Math mode (R5 of the GPU review). An fp32 cell's datasheet MFU divides by the TF32 peak when the
model's main ops may use TF32 (:func:`math_mode`: cuDNN convolutions do by default, matmuls only
when allowed). The measured peak must be the same math, or the two MFUs of one fp32 ResNet row
are an order of magnitude apart: the matmul is timed with fp32 matmuls set for the duration to
what :func:`math_mode` says (:func:`matmul_tf32`), then restored, and the flags in force during
the timing are recorded with the figure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from contract.metrics import MEASURED_MATMUL_TFLOPS
from jobs import memory, peaks

DEFAULT_N = 8192
WARMUP_ITERATIONS = 3
TIMED_ITERATIONS = 10
# The three n x n buffers may take at most this share of the device's free memory; n halves
# until they fit (a small or busy device still gets a figure, with its n recorded).
MAX_FREE_MEMORY_SHARE = 0.5
MIN_N = 1024


def dtype_name(precision: str) -> str:
    """The torch dtype name a cell's precision (fp32 | bf16 | fp16) runs its matmuls in."""
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]


def size_that_fits(free_bytes: int, element_bytes: int, n: int = DEFAULT_N) -> int:
    """The largest n (halving from ``n``, at least MIN_N) whose three n x n buffers fit in
    MAX_FREE_MEMORY_SHARE of ``free_bytes``; 0 when not even MIN_N fits."""
    while n >= MIN_N:
        if 3 * n * n * element_bytes <= MAX_FREE_MEMORY_SHARE * free_bytes:
            return n
        n //= 2
    return 0


def math_mode(torch, model, precision: str) -> str:
    """The math a cell's main ops run in: its precision (bf16 | fp16), or for fp32 "tf32" / "fp32"
    from the TF32 settings in force and whether the model has convolutions (jobs.peaks.fp32_math).
    The one answer for the datasheet peak (jobs.summary.mfu_figures) and the measured one (:func:`measure`)."""
    if precision != "fp32":
        return precision
    has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    flags = peaks.precision_settings(torch)
    return peaks.fp32_math(flags["cuda_matmul_allow_tf32"] == "True", flags["cudnn_allow_tf32"] == "True",
                             flags["float32_matmul_precision"], has_conv)


@contextlib.contextmanager
def matmul_tf32(torch, allowed: bool) -> Iterator[None]:
    """fp32 matmuls in TF32 (``allowed``) or full fp32 for the block, then as they were.

    Set through ``torch.set_float32_matmul_precision`` alone, and only when the setting disagrees:
    writing the legacy ``matmul.allow_tf32`` flag after the precision API was used (by the user's
    code, or by this block) makes torch 2.9+ refuse to read the precision again ("mix of the
    legacy and new APIs"), which failed the job after it had measured (GPU review 3, G7)."""
    before = peaks.read_setting(torch.get_float32_matmul_precision)
    if before is None or (before in ("high", "medium")) == allowed:
        yield  # already that math (or unreadable: leave the user's setting alone)
        return
    torch.set_float32_matmul_precision("high" if allowed else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def measure(device, precision: str, math: str | None = None, n: int = DEFAULT_N, warmup: int = WARMUP_ITERATIONS,
            iterations: int = TIMED_ITERATIONS) -> dict[str, Any]:
    """``{"measured_matmul_tflops", "n", "iterations", "dtype", "math", "tf32", ...flags}`` for this
    rank's device, or ``{"missing": why}`` (CPU ranks, too little free memory, a CUDA error).
    ``math``: :func:`math_mode` of the cell (default: the precision; for fp32 the matmul settings
    as they are). Never raises: the figure is optional, the benchmark is not."""
    if getattr(device, "type", "cpu") != "cuda":
        return {"missing": f"{getattr(device, 'type', device)} ranks: no matmul peak is measured off CUDA"}
    import torch

    before = peaks.precision_settings(torch)
    matmul_tf32_before = before["cuda_matmul_allow_tf32"] == "True"
    if math is None:
        math = precision if precision != "fp32" else peaks.fp32_math(
            matmul_tf32_before, False, before["float32_matmul_precision"], False)
    # fp32 matmuls run in TF32 exactly when the cell's main ops do (an fp32 matmul otherwise).
    tf32 = precision == "fp32" and math == "tf32"
    try:
        with matmul_tf32(torch, tf32 or matmul_tf32_before):
            timed = _time_matmul(torch, device, precision, n, warmup, iterations)
            flags = peaks.precision_settings(torch)  # in force while timing
    except Exception as exc:  # an optional figure must not fail the job
        return {"missing": f"matmul measurement failed: {type(exc).__name__}: {exc}"[:300]}
    if "missing" in timed:
        return timed
    return {**timed, "math": math, "tf32": tf32, **{f"timed_{k}": v for k, v in flags.items()}}


def _time_matmul(torch, device, precision: str, n: int, warmup: int, iterations: int) -> dict[str, Any]:
    """The timing itself, in whatever math the matmul flags say (:func:`measure` sets them)."""
    dtype = getattr(torch, dtype_name(precision))
    free_bytes, _ = torch.cuda.mem_get_info(device)
    size = size_that_fits(free_bytes, torch.tensor([], dtype=dtype).element_size(), n)
    if not size:
        return {"missing": f"too little free device memory ({free_bytes / memory.GIB:.2f} GiB) for the matmul"}
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(warmup):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize(device)  # sync point: the warm-ups end before the timed region starts
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        torch.matmul(a, b, out=c)
    end.record()
    end.synchronize()  # sync point: the events' times are known only after the last matmul
    elapsed_s = start.elapsed_time(end) / 1e3
    del a, b, c
    torch.cuda.empty_cache()  # the window's reserved-memory peak must not include these buffers
    return {MEASURED_MATMUL_TFLOPS: peaks.matmul_tflops(size, iterations, elapsed_s), "n": size,
            "iterations": iterations, "dtype": dtype_name(precision)}
