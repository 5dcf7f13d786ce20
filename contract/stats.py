"""Statistics of step times: percentiles, spread, scaling, and whether a warm-up still settles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
