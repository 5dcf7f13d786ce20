"""The fabric probe's contract: what a probe job is asked (its spec and message sizes), and its
figures as nccl-tests' doc/PERFORMANCE.md defines them, with the latency and bandwidth fit. Standard
library only: the ranks compute them (jobs/fabric.py), the launcher plans the job and reads them.

* ``time_us``: the average time of one operation (the loop's time over ``iters``), averaged over the
  scope's ranks (nccl-tests' default, ``-a 1``);
* ``algbw_gb_per_s = S / t``, S the size of the whole array in bytes (for all-gather and
  reduce-scatter the gathered or scattered whole: count per rank x ranks), GB = 1e9 bytes;
* ``busbw_gb_per_s = algbw x 2(n-1)/n`` for all-reduce and ``x (n-1)/n`` for all-gather and
  reduce-scatter: comparable with the hardware's link bandwidth whatever the number of ranks.

Per collective and scope, :func:`fit` gives ``t = alpha + S f / beta`` (f the bus factor above):
``alpha`` the latency (us), ``beta`` the bus bandwidth (GB/s) of a large message, and the fit's error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.metrics import FABRIC_COLLECTIVES as COLLECTIVES
from contract.metrics import FABRIC_SCOPES as SCOPES
from contract.spec import Layout

__all__ = ["COLLECTIVES", "SCOPES", "Fit", "ProbeSpec", "bus_factor", "fit", "fits", "plan", "point", "sizes",
           "whole_count"]

RESULT_FILE = "fabric.json"  # what the probe's rank 0 writes into its folder
GB = 1e9  # nccl-tests' GB/s
KIB, MIB = 1024, 1024**2
ELEMENT_BYTES = 4  # float32, nccl-tests' default type


@dataclass
class ProbeSpec:
    """What one probe job measures; the launcher writes it as probe.json beside the result."""

    out_dir: str
    layout: Layout
    sizes_bytes: list[int] = field(default_factory=list)
    iters: int = 5
    warmup_iters: int = 1
    emulate_nodes: bool = False  # the local cluster's nodes: groups of processes on this machine
    collective_timeout_s: float = 300.0


def plan(gpu: bool, full: bool) -> tuple[list[int], int, int]:
    """(message sizes, iterations, warm-up iterations) of a probe. By default a few seconds on CPU:
    steps of 4 from 1 KiB to 4 MiB (CPU) or 256 MiB (GPU), 5 iterations after 1; ``full``: every
    power of two to 64 MiB (CPU) or 1 GiB (GPU), nccl-tests' 20 iterations after 5."""
    if full:
        return sizes(KIB, (1024 if gpu else 64) * MIB, 2), 20, 5
    return sizes(KIB, (256 if gpu else 4) * MIB, 4), 5, 1


def sizes(smallest: int, largest: int, factor: int) -> list[int]:
    """``smallest``, ``smallest * factor``, ... up to ``largest`` (included when on the way)."""
    out, size = [], smallest
    while size <= largest:
        out.append(size)
        size *= factor
    return out


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth (doc/PERFORMANCE.md, "Summary")."""
    share = (ranks - 1) / ranks
    return 2 * share if collective == "all_reduce" else share


def whole_count(size_bytes: int, ranks: int) -> int:
    """Elements of the whole array: a multiple of ``ranks`` (each rank's part of an all-gather or
    reduce-scatter is equal), at least one per rank; nccl-tests rounds the same way."""
    per_rank = max(1, size_bytes // ELEMENT_BYTES // ranks)
    return per_rank * ranks


def point(collective: str, scope: str, ranks: int, size_bytes: int, time_s: float) -> dict[str, Any]:
    """One line of nccl-tests' table: size, count, time, algbw, busbw."""
    algbw = size_bytes / time_s / GB
    return {"collective": collective, "scope": scope, "ranks": ranks, "size_bytes": size_bytes,
            "count": size_bytes // ELEMENT_BYTES, "time_us": time_s * 1e6, "algbw_gb_per_s": algbw,
            "busbw_gb_per_s": algbw * bus_factor(collective, ranks)}


@dataclass(frozen=True)
class Fit:
    latency_us: float
    bandwidth_gb_per_s: float | None  # None: time did not grow with size (all latency, or noise)
    fit_error: float  # root mean square of (fitted - measured) / measured over the sizes


def fit(collective: str, ranks: int, points: Sequence[tuple[int, float]]) -> Fit:
    """Least squares of ``t = alpha + x / beta`` over (size bytes, time s) points, x = size x bus factor.

    Weighted by 1/t^2, i.e. on relative errors: the times span four orders of magnitude, and plain
    least squares would let the largest message alone decide the latency. A negative intercept is
    not a latency: then alpha = 0 and beta is fitted alone."""
    f = bus_factor(collective, ranks)
    xs, ts = [s * f for s, _ in points], [t for _, t in points]
    ws = [1 / t**2 for t in ts]
    sw, sx, st = sum(ws), _dot(ws, xs), _dot(ws, ts)
    sxx, sxt = _dot(ws, xs, xs), _dot(ws, xs, ts)
    det = sw * sxx - sx * sx
    alpha, slope = ((st * sxx - sx * sxt) / det, (sw * sxt - sx * st) / det) if det > 0 else (st / sw, 0.0)
    if alpha < 0:
        alpha, slope = 0.0, sxt / sxx
    predicted = [alpha + slope * x for x in xs]
    error = math.sqrt(sum(((p - t) / t) ** 2 for p, t in zip(predicted, ts, strict=True)) / len(ts))
    return Fit(latency_us=alpha * 1e6, bandwidth_gb_per_s=(1 / slope / GB) if slope > 0 else None, fit_error=error)


def _dot(ws: Sequence[float], *columns: Sequence[float]) -> float:
    return sum(w * math.prod(vals) for w, *vals in zip(ws, *columns, strict=True))


def fits(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One fit per (collective, scope) of ``points`` (:func:`point`'s dicts)."""
    out = []
    for scope in SCOPES:
        for collective in COLLECTIVES:
            mine = [p for p in points if p["collective"] == collective and p["scope"] == scope]
            if len(mine) < 2:
                continue
            found = fit(collective, mine[0]["ranks"], [(p["size_bytes"], p["time_us"] / 1e6) for p in mine])
            out.append({"collective": collective, "scope": scope, "ranks": mine[0]["ranks"],
                        "latency_us": found.latency_us, "bandwidth_gb_per_s": found.bandwidth_gb_per_s,
                        "fit_error": found.fit_error,
                        "busbw_gb_per_s_peak": max(p["busbw_gb_per_s"] for p in mine)})
    return out
