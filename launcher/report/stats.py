"""The statistics behind every claim: estimates from independent runs, intervals, verdicts.

Pure functions over report rows (launcher/report/rows.py); no I/O.

* **The unit of noise is an independent run** (a separate launch: its own processes, placement
  and memory layout; on Slurm its own array task). A configuration measured in ``n >= 2`` runs
  gets the mean of its run values, the standard error ``stdev / sqrt(n)`` and ``n - 1`` degrees
  of freedom. Each run's value already averages its measured windows, so the spread between runs
  contains the spread inside them: this is the two-level model read at its top level. Windows
  inside one run share its process and neighbours and are never the noise of a claim.
* **A noise floor** (launcher/report/noisefloor.py), measured by running one configuration many times on
  the same cluster, stands in for a configuration measured once: the standard error of one run is
  the floor's between-run coefficient of variation times its value, with the floor's degrees of
  freedom. Without either, nothing is claimed.
* **Verdicts**, A against B, as a ratio A/B with Welch's 95% interval (standard errors in
  quadrature, Welch-Satterthwaite degrees of freedom, Student's t):
  ``higher``/``lower`` only when the interval excludes 1 AND the change is at least the minimum
  effect (criterion.rs's noise threshold); ``same`` when the whole interval lies within the
  minimum effect; otherwise ``inconclusive``, with the number of runs per side that would decide
  it at the noise seen (benchstat's "~" that says what to do).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract import metrics
from launcher.report.rows import num, throughput

HIGHER, LOWER, SAME, INCONCLUSIVE = "higher", "lower", "same", "inconclusive"
# The smallest change worth a claim, per claimed metric (users asked "is it 5% faster?"; the
# registry, contract/metrics.py, says why each band is what it is).
MIN_EFFECT: dict[str, float] = {claim: m.min_effect or 0.0 for claim, m in metrics.claimed().items()}
# Beyond this many runs per side, "runs needed" is reported as "more than".
MAX_RUNS_NEEDED = 100

# Two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the next lower row).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
        19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052,
        28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df: float) -> float:
    """Student's t two-sided 95% quantile; fractional degrees of freedom round down (wider)."""
    if df < 1:
        return math.inf
    if math.isinf(df):
        return 1.960
    k = int(df)
    if k > 120:
        return 1.960
    return _T95[max(d for d in _T95 if d <= k)]


def _reader(metric: metrics.Metric) -> Callable[[dict[str, Any]], float | None]:
    # Throughput decides whether a run has a result at all (rows.throughput); the others are read
    # as the registry says, stand-in included.
    if metric.claim == "throughput":
        return throughput
    return lambda row: num(metric.read(row))


# The metrics a claim can be about (the registry's claimed ones): how to read each from a run's row.
METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    claim: _reader(m) for claim, m in metrics.claimed().items()}


@dataclass(frozen=True)
class Floor:
    """A cluster's measured between-run noise: per metric, the coefficient of variation of one
    run's value, and its degrees of freedom (launcher/report/noisefloor.py keeps it)."""

    cv: dict[str, float]
    df: int
    where: str  # which cluster, from which sweep and when, for the report


@dataclass
class Estimate:
    """A configuration's mean of one metric and its standard error (None: no noise estimate)."""

    mean: float
    se: float | None
    df: float | None
    n: int  # the runs measured
    source: str  # "runs" | "floor" | "none"
    values: list[float] = field(default_factory=list)

    @property
    def half_width(self) -> float | None:
        return None if self.se is None or self.df is None else t95(self.df) * self.se

    @property
    def sd(self) -> float | None:
        """The standard deviation of one run's value."""
        return None if self.se is None else self.se * math.sqrt(self.n)

    def noise_text(self, floor: Floor | None = None) -> str:
        if self.source == "runs":
            return f"{self.n} runs"
        if self.source == "floor" and floor is not None:
            return f"noise floor ({floor.where})"
        return "1 run, no noise estimate"


def run_values(row: dict[str, Any], metric: str) -> list[float]:
    """The metric's value in every run of a row (a grouped row holds its runs in ``_members``)
    that has a result: failed, cancelled and diverged runs are never counted."""
    read = METRICS[metric]
    return [v for m in row.get("_members", [row]) if throughput(m) and (v := read(m)) is not None]


def estimate(row: dict[str, Any], metric: str = "throughput", floor: Floor | None = None) -> Estimate | None:
    """The estimate of ``metric`` for a row from its independent runs, or from the floor."""
    cv = floor.cv.get(metric) if floor is not None else None
    return estimate_of(run_values(row, metric), cv, floor.df if floor is not None else 0)


def estimate_of(values: list[float], floor_cv: float | None = None, floor_df: int = 0) -> Estimate | None:
    """The estimate from independent runs' values; one run borrows a noise floor's coefficient of
    variation (``floor_cv`` with ``floor_df`` degrees of freedom) where there is one."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) >= 2:
        return Estimate(mean, statistics.stdev(values) / math.sqrt(len(values)), len(values) - 1, len(values), "runs",
                        values)
    if floor_cv is not None and floor_df >= 1:
        return Estimate(mean, floor_cv * abs(mean), floor_df, 1, "floor", values)
    return Estimate(mean, None, None, 1, "none", values)


def welch_interval(a: Estimate, b: Estimate) -> tuple[float, float] | None:
    """Welch's 95% interval of mean(A) - mean(B), in their unit; None without a noise estimate."""
    if a.se is None or b.se is None or a.df is None or b.df is None:
        return None
    hw = t95(_welch_df(a, b)) * math.sqrt(a.se**2 + b.se**2)
    d = a.mean - b.mean
    return d - hw, d + hw


@dataclass
class Diff:
    """A against B: the ratio, its 95% interval (None without noise) and the verdict."""

    ratio: float
    low: float | None
    high: float | None
    verdict: str  # HIGHER | LOWER | SAME | INCONCLUSIVE
    runs_needed: int | None = None  # per side, to decide an inconclusive verdict (None: too many / unknown)
    min_effect: float = 0.0

    @property
    def claimed(self) -> bool:
        return self.verdict in (HIGHER, LOWER)

    def why_inconclusive(self) -> str:
        if self.low is None:
            return "no noise estimate (one run per side and no noise floor): set runs=3 or more"
        if self.runs_needed is None:
            return f"the noise is too large to decide within {MAX_RUNS_NEEDED} runs per side"
        return f"about {self.runs_needed} runs per side would decide it (runs={self.runs_needed})"


def difference(a: Estimate, b: Estimate, min_effect: float) -> Diff:
    """Welch's interval for mean(A) - mean(B), as a ratio to B: 1 + interval / mean(B)."""
    ratio = a.mean / b.mean
    interval = welch_interval(a, b)
    if interval is None:
        return Diff(ratio, None, None, INCONCLUSIVE, None, min_effect)
    # A throughput or a memory peak is never negative: a very noisy interval is cut at zero.
    low, high = max(0.0, 1 + interval[0] / b.mean), 1 + interval[1] / b.mean
    change = abs(ratio - 1)
    if (low > 1 or high < 1) and change >= min_effect:
        return Diff(ratio, low, high, HIGHER if low > 1 else LOWER, None, min_effect)
    if low >= 1 - min_effect and high <= 1 + min_effect:
        return Diff(ratio, low, high, SAME, None, min_effect)
    return Diff(ratio, low, high, INCONCLUSIVE, runs_needed(a, b, min_effect), min_effect)


def _welch_df(a: Estimate, b: Estimate) -> float:
    assert a.se is not None and b.se is not None and a.df and b.df
    se2 = a.se**2 + b.se**2
    if se2 == 0:
        return math.inf
    return se2**2 / ((a.se**4 / a.df if a.se else 0.0) + (b.se**4 / b.df if b.se else 0.0))


def runs_needed(a: Estimate, b: Estimate, min_effect: float) -> int | None:
    """The runs per side at which, with the spread and the difference seen now, the interval would
    either exclude 1 beyond the minimum effect or fit inside it; None beyond MAX_RUNS_NEEDED.
    Always more than either side has: the runs already there did not decide it (Welch's degrees of
    freedom, which the verdict used, are fewer than this pooled estimate's when the spreads differ)."""
    if a.sd is None or b.sd is None:
        return None
    change = abs(a.mean / b.mean - 1)
    room = change if change >= min_effect else min_effect - change
    rel_sd = math.sqrt(a.sd**2 + b.sd**2) / b.mean
    for n in range(max(2, a.n + 1, b.n + 1), MAX_RUNS_NEEDED + 1):
        if t95(2 * n - 2) * rel_sd / math.sqrt(n) < room:
            return n
    return None


def ci_text(row: dict[str, Any], floor: Floor | None = None) -> str:
    """The table's "±95% CI" cell: the half-width of the throughput interval as a share of the mean."""
    e = estimate(row, "throughput", floor)
    if e is None or e.half_width is None or not e.mean:
        return "-"
    return f"±{e.half_width / e.mean:.1%}"
