"""The device's matmul peak, measured on the node before the measured window (CUDA ranks only).

MFU against a datasheet peak says how far a run is from a number the device may never reach on
this node (power cap, clocks, a PCIe part reporting an SXM name); MFU against a peak measured on
the same device, in the same dtype and math mode, says how far the model is from what this
device actually does on one large dense matmul. Both are reported (jobs.worker._mfu).

The measurement runs during setup, before the model is built, outside every timed region: a few
untimed warm-ups (clocks ramp, cuBLAS picks its kernel), then ``iterations`` back-to-back matmuls
between two CUDA events. The buffers are freed and the allocator's cache emptied afterwards, so
the window's memory figures do not see them.
"""

from __future__ import annotations

from typing import Any

from jobs import metrics

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


def measure(device, precision: str, n: int = DEFAULT_N, warmup: int = WARMUP_ITERATIONS,
            iterations: int = TIMED_ITERATIONS) -> dict[str, Any]:
    """``{"measured_matmul_tflops", "n", "iterations", "dtype", "tf32"}`` for this rank's device,
    or ``{"missing": why}`` (CPU ranks, too little free memory, a CUDA error). Never raises: the
    figure is optional, the benchmark is not."""
    if getattr(device, "type", "cpu") != "cuda":
        return {"missing": f"{getattr(device, 'type', device)} ranks: no matmul peak is measured off CUDA"}
    import torch

    try:
        dtype = getattr(torch, dtype_name(precision))
        free_bytes, _ = torch.cuda.mem_get_info(device)
        size = size_that_fits(free_bytes, torch.tensor([], dtype=dtype).element_size(), n)
        if not size:
            return {"missing": f"too little free device memory ({free_bytes / metrics.GIB:.2f} GiB) for the matmul"}
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
        return {"measured_matmul_tflops": metrics.matmul_tflops(size, iterations, elapsed_s), "n": size,
                "iterations": iterations, "dtype": dtype_name(precision),
                # fp32 matmuls run in TF32 when allowed: the measured peak is the math in force.
                "tf32": bool(precision == "fp32" and (torch.backends.cuda.matmul.allow_tf32
                                                      or torch.get_float32_matmul_precision() != "highest"))}
    except Exception as exc:  # an optional figure must not fail the job
        return {"missing": f"matmul measurement failed: {type(exc).__name__}: {exc}"[:300]}
