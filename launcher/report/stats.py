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
  effect (criterion.rs's noise threshold); ``same`` ("no change") when equivalence is shown by two
  one-sided tests (TOST): the ``1 - 2 alpha`` interval (90%) lies wholly inside the margin of
  ±minimum effect; otherwise ``inconclusive``, with the number of runs per side that would decide
  it at the noise seen (benchstat's "~" that says what to do).
* **Two sweeps** (``--compare``, ``runs=auto`` with ``baseline=``) also differ by a drift shared by
  every run of a sweep (the machine's state moves between them), which more runs inside either
  sweep never shrink. The sweep is the unit of that term: the variance of the ratio of the two
  sweeps' means is ``se_A^2 + se_B^2`` of their runs plus ``tau^2``, the variance of the log ratio
  of two sweeps' means that their runs do not explain, with ``tau``'s own degrees of freedom in
  Welch-Satterthwaite's. ``tau`` (:func:`sweep_drift`) pools a stated default allowance, counted as
  ``DRIFT_DEFAULT_ENTRIES`` A/A entries of ``DRIFT_DEFAULT_CV``, with the cluster's recorded A/A
  entries (launcher/report/noisefloor.py): ``tau^2 = (k0 tau0^2 + k tau_rec^2) / (k0 + k)`` at
  ``k0 + k`` degrees of freedom (a variance estimated from ``k`` entries under a scaled inverse
  chi-square prior worth ``k0``). A thin record is held near the default and gives wide
  intervals; a long one outweighs it. Where the drift alone is wider than the change could be, the
  verdict says that no number of runs decides it.
* **Repeated looks** (``runs=auto``): a comparison is judged at every planned look with that look's
  share of alpha, and its verdict is its first decided look (launcher/report/sequential.py, the
  method and why its false-claim rate stays at 5% however many looks there are).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract import metrics
from launcher.report import sequential
from launcher.report.rows import num, throughput
from launcher.report.sequential import ALPHA, Looks

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


def t_two_sided(alpha: float, df: float) -> float:
    """Student's t two-sided ``1 - alpha`` quantile: the table above at 5% (the figures every report
    printed so far), computed for the levels of sequential looks and TOST."""
    return t95(df) if alpha == 0.05 else sequential.t_two_sided(alpha, df)


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


@dataclass(frozen=True)
class Drift:
    """A cluster's measured sweep-to-sweep drift: per metric, the coefficient of variation that two
    sweeps of the same settings, run one after the other, differ by beyond their runs' own spread
    (launcher/report/noisefloor.py keeps it from recorded A/A pairs). A comparison of two sweeps
    pools it with the default allowance (sweep_drift) and adds that to the noise of every difference
    it judges, at its degrees of freedom."""

    cv: dict[str, float]
    df: int
    where: str
    # Per metric, where a metric's entries are fewer than ``df`` (a metric the record lacks).
    dfs: dict[str, int] = field(default_factory=dict)
    recorded: int = 0  # the cluster's own A/A entries pooled in (sweep_drift); 0: none

    def df_of(self, metric: str) -> int:
        return self.dfs.get(metric, self.df)

    def text(self) -> str:
        """Which drift, per metric, and what it rests on: for the output of a comparison."""
        return ", ".join(f"{m} {v:.1%}" for m, v in sorted(self.cv.items())) + f" ({self.where})"


# The drift a comparison of two sweeps allows for where its cluster has no A/A record, and how many
# A/A entries that allowance counts as in a record's stead. 10% is about twice the drift of the
# unflagged entries recorded on this machine (tests/data/sweep_drift.json: throughput 4.8%, step time
# 4.3%, peak memory 6.6%, from 2 entries) and above the largest throughput shift of the quiet A/A
# pairs of 2026-11-26 (+11.8%, runs' noise included); 4 entries are one A/A pair of the default grid.
# docs/deciding.md says what these give on the recorded noise (bench/sweep_aa.py).
DRIFT_DEFAULT_CV = 0.10
DRIFT_DEFAULT_ENTRIES = 4


def sweep_drift(recorded: Drift | None) -> Drift:
    """The drift a comparison of two sweeps judges against, per claimed metric: the default allowance
    (DRIFT_DEFAULT_CV as DRIFT_DEFAULT_ENTRIES A/A entries) pooled with the cluster's recorded A/A
    entries, ``tau^2 = (k0 tau0^2 + k tau_rec^2) / (k0 + k)`` with ``k0 + k`` degrees of freedom.
    A thin record moves it little and leaves few degrees of freedom (wide intervals); a long one
    outweighs the default. Never None: two sweeps always differ by some drift."""
    k0, cv0 = DRIFT_DEFAULT_ENTRIES, DRIFT_DEFAULT_CV
    cv, dfs = {}, {}
    for metric in METRICS:
        k = recorded.df if recorded is not None and metric in recorded.cv else 0
        tau = recorded.cv[metric] if recorded is not None and k else 0.0
        cv[metric] = math.sqrt((k0 * cv0**2 + k * tau**2) / (k0 + k))
        dfs[metric] = k0 + k
    k = min(dfs.values()) - k0
    where = (f"the default {cv0:.0%} as {k0} A/A entries pooled with {k} recorded ({recorded.where}); {k0 + k} df"
             if recorded is not None and k else
             f"no A/A record on this cluster: the default allowance {cv0:.0%} as {k0} A/A entries, {k0} df")
    return Drift(cv, min(dfs.values()), where, dfs, k)


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


def run_values(row: dict[str, Any], metric: str, upto_round: int | None = None) -> list[float]:
    """The metric's value in every run of a row (a grouped row holds its runs in ``_members``)
    that has a result: failed, cancelled and diverged runs are never counted. ``upto_round``: only
    the runs a sequential sweep had at that look (a row's ``round``, 1 when it has none)."""
    read = METRICS[metric]
    return [v for m in row.get("_members", [row]) if throughput(m) and (v := read(m)) is not None
            and (upto_round is None or int(m.get("round") or 1) <= upto_round)]


def estimate(row: dict[str, Any], metric: str = "throughput", floor: Floor | None = None,
             upto_round: int | None = None) -> Estimate | None:
    """The estimate of ``metric`` for a row from its independent runs, or from the floor."""
    cv = floor.cv.get(metric) if floor is not None else None
    return estimate_of(run_values(row, metric, upto_round), cv, floor.df if floor is not None else 0)


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


def welch_interval(a: Estimate, b: Estimate, alpha: float = ALPHA, drift_se: float = 0.0,
                   drift_df: int = 0) -> tuple[float, float] | None:
    """Welch's ``1 - alpha`` interval of mean(A) - mean(B), in their unit; None without a noise estimate.
    ``drift_se``: a third, independent term of noise (the sweep-to-sweep drift, with ``drift_df``
    degrees of freedom), added in quadrature and to the Welch-Satterthwaite degrees of freedom."""
    if a.se is None or b.se is None or a.df is None or b.df is None:
        return None
    hw = t_two_sided(alpha, _welch_df(a, b, drift_se, drift_df)) * math.sqrt(a.se**2 + b.se**2 + drift_se**2)
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
    # Equivalence (TOST): the 1 - 2 alpha interval that "no change" rests on.
    eq_low: float | None = None
    eq_high: float | None = None
    n_a: int = 0  # the runs each side had at the look that gave the verdict
    n_b: int = 0
    look: int = 1  # which planned look gave it (1 of 1 for fixed runs)
    looks: int = 1
    grew_until: int = 1  # the last look at which either side had new runs
    alpha: float = ALPHA  # that look's level
    undecidable: str | None = None  # why no number of runs would decide it (the drift between sweeps)

    @property
    def claimed(self) -> bool:
        return self.verdict in (HIGHER, LOWER)

    @property
    def decided(self) -> bool:
        return self.verdict != INCONCLUSIVE

    def runs_text(self, flip: bool = False) -> str:
        """How many runs the verdict used, and at which look: ``3 + 5 runs, look 2 of 4 at 0.91%``
        (``flip``: B's runs first, as a comparison of B against A lists them)."""
        at = f", look {self.look} of {self.looks} at {self.alpha:.2%}" if self.looks > 1 else ""
        first, second = (self.n_b, self.n_a) if flip else (self.n_a, self.n_b)
        return f"{first} + {second} runs{at}"

    def why_inconclusive(self) -> str:
        if self.low is None:
            return "no noise estimate (one run per side and no noise floor): set runs=3 or more"
        if self.undecidable:
            return f"cannot decide: {self.undecidable}"
        if self.runs_needed is None:
            return f"the noise is too large to decide within {MAX_RUNS_NEEDED} runs per side"
        return f"about {self.runs_needed} runs per side would decide it (runs={self.runs_needed})"


def difference(a: Estimate, b: Estimate, min_effect: float, alpha: float = ALPHA, drift_cv: float = 0.0,
               drift_df: int = 0) -> Diff:
    """Welch's interval for mean(A) - mean(B), as a ratio to B: 1 + interval / mean(B); a
    difference at level ``alpha`` (two-sided), equivalence within ±min_effect by TOST at ``alpha``.
    ``drift_cv``: the drift between the two sides' sweeps, as the standard deviation of the log
    ratio of their means (0: the same sweep), with ``drift_df`` degrees of freedom."""
    ratio = a.mean / b.mean
    drift_se = _drift_se(a, drift_cv)
    found_at = welch_interval(a, b, alpha, drift_se, drift_df)
    tost = welch_interval(a, b, 2 * alpha, drift_se, drift_df)
    if found_at is None or tost is None:
        return Diff(ratio, None, None, INCONCLUSIVE, None, min_effect, n_a=a.n, n_b=b.n, alpha=alpha)
    # A throughput or a memory peak is never negative: a very noisy interval is cut at zero.
    (low, high), (eq_low, eq_high) = ((max(0.0, 1 + lo / b.mean), 1 + hi / b.mean) for lo, hi in (found_at, tost))
    change = abs(ratio - 1)
    found = Diff(ratio, low, high, INCONCLUSIVE, None, min_effect, eq_low, eq_high, a.n, b.n, alpha=alpha)
    if (low > 1 or high < 1) and change >= min_effect:
        found.verdict = HIGHER if low > 1 else LOWER
    elif eq_low >= 1 - min_effect and eq_high <= 1 + min_effect:
        found.verdict = SAME
    else:
        found.undecidable = undecidable(a, b, min_effect, alpha, drift_cv=drift_cv, drift_df=drift_df)
        if not found.undecidable:
            found.runs_needed = runs_needed(a, b, min_effect, alpha, drift_cv=drift_cv, drift_df=drift_df)
    return found


def _drift_se(a: Estimate, drift_cv: float) -> float:
    # The drift moves the ratio of the means by a factor exp(N(0, drift_cv^2)); in the unit of
    # mean(A) - mean(B) that is drift_cv * mean(A) (the delta method: Var(A/B) = (A/B)^2 drift_cv^2).
    return drift_cv * abs(a.mean)


def sequential_difference(row_a: dict[str, Any], row_b: dict[str, Any], metric: str, min_effect: float,
                          looks: Looks, floor: Floor | None = None, drift: Drift | None = None) -> Diff | None:
    """A against B judged at every planned look with that look's alpha (launcher/report/sequential.py):
    the first decided look gives the verdict, else the last look's. None when a side has no result.
    ``drift``: A and B come from two sweeps; their measured drift is part of the noise."""
    drift_cv = drift.cv.get(metric, 0.0) if drift is not None else 0.0
    drift_df = drift.df_of(metric) if drift is not None else 0
    found, seen, grew = None, (0, 0), 1
    for look in range(1, looks.taken + 1):
        upto = look if looks.sequential else None
        ea, eb = estimate(row_a, metric, floor, upto), estimate(row_b, metric, floor, upto)
        if ea is None or eb is None:
            continue  # a side without a run at this look (its first runs failed)
        found = difference(ea, eb, min_effect, looks.alpha_at(look), drift_cv, drift_df)
        grew = look if (ea.n, eb.n) != seen else grew
        seen = (ea.n, eb.n)
        found.look, found.looks, found.grew_until = look, looks.rounds, grew
        if found.decided:
            return found
    if found is not None and looks.sequential and found.low is not None:
        # A baseline's runs (round 0: all there before this sweep began) do not grow with its rounds.
        fixed_b = all(int(m.get("round") or 1) == 0 for m in row_b.get("_members", [row_b]))
        now_a, now_b = estimate(row_a, metric, floor), estimate(row_b, metric, floor)
        last = looks.alpha_at(looks.rounds)
        found.undecidable = undecidable(now_a, now_b, min_effect, last, fixed_b, drift_cv, drift_df)
        found.runs_needed = None if found.undecidable else runs_needed(now_a, now_b, min_effect, last, fixed_b,
                                                                       drift_cv, drift_df)
    return found


def stop_reason(d: Diff, looks: Looks) -> str | None:
    """Why no more runs come to a comparison; None while a ``runs=auto`` sweep would add runs to it
    (undecided, below runs_max, and decidable within runs_max at the noise seen)."""
    if not looks.sequential:
        return "fixed runs"
    if d.decided:
        return "decided"
    if d.low is None:
        return "no noise estimate"
    runs_max = looks.schedule[-1]
    if d.undecidable:  # more runs cannot narrow what decides it: it stops at once, however many looks are left
        return f"stopped early: cannot decide: {d.undecidable}"
    if d.look >= looks.rounds and d.grew_until >= looks.rounds:
        return f"runs_max={runs_max} reached"
    # A first look's spread rests on runs_min runs per side, too few to say that runs_max cannot
    # decide it (three runs' standard deviation is known only within a factor of about three, and
    # one outlier among them reads as "no difference, wide spread"): that stop waits for the second.
    if (d.runs_needed is None or d.runs_needed > runs_max) and d.look > 1:
        needed = f"about {d.runs_needed}" if d.runs_needed else f"more than {MAX_RUNS_NEEDED}"
        # Its runs stopped growing at that look (later looks saw the same runs).
        at = f" at look {d.grew_until}" if d.grew_until < d.look else ""
        return f"stopped early{at}: {needed} runs per side would decide it, beyond runs_max={runs_max}"
    if d.look >= looks.rounds:
        return f"runs_max={runs_max} reached"
    return looks.ended


def _welch_df(a: Estimate, b: Estimate, drift_se: float = 0.0, drift_df: int = 0) -> float:
    assert a.se is not None and b.se is not None and a.df and b.df
    se2 = a.se**2 + b.se**2 + drift_se**2
    if se2 == 0:
        return math.inf
    return se2**2 / ((a.se**4 / a.df if a.se else 0.0) + (b.se**4 / b.df if b.se else 0.0)
                     + (drift_se**4 / drift_df if drift_se and drift_df else 0.0))


def runs_needed(a: Estimate | None, b: Estimate | None, min_effect: float, alpha: float = ALPHA,
                fixed_b: bool = False, drift_cv: float = 0.0, drift_df: int = 0) -> int | None:
    """The runs per side at which, with the spread and the difference seen now, the interval would
    either exclude 1 beyond the minimum effect or fit inside it; None beyond MAX_RUNS_NEEDED.
    Always more than either side has: the runs already there did not decide it (Welch's degrees of
    freedom, which the verdict used, are fewer than this pooled estimate's when the spreads differ).
    ``fixed_b``: B's runs are all there is (a baseline sweep): only A grows, and B's own standard
    error stays; then None also where no number of A's runs would decide it. ``drift_cv``: the
    drift between two sweeps (with ``drift_df`` degrees of freedom), which more runs never shrink."""
    if a is None or b is None or a.sd is None or b.sd is None:
        return None
    room, level = _room(a, b, min_effect, alpha)
    for n in range(max(2, a.n + 1, 2 if fixed_b else b.n + 1), MAX_RUNS_NEEDED + 1):
        n_b = b.n if fixed_b else n
        within = math.sqrt(a.sd**2 / n + b.sd**2 / n_b)
        if _half_width(within, n + n_b - 2, a, drift_cv, drift_df, level) < room * b.mean:
            return n
    return None


def undecidable(a: Estimate | None, b: Estimate | None, min_effect: float, alpha: float = ALPHA,
                fixed_b: bool = False, drift_cv: float = 0.0, drift_df: int = 0) -> str | None:
    """Why no number of runs would decide A against B, or None: with A's runs (and B's, unless
    ``fixed_b``) grown without end their standard errors vanish, and what is left, the drift between
    two sweeps (and a fixed baseline's own runs), is still wider than the change could be told from."""
    if a is None or b is None or a.sd is None or b.sd is None or not b.mean or not (drift_cv or fixed_b):
        return None
    room, level = _room(a, b, min_effect, alpha)
    b_se, b_df = (b.sd / math.sqrt(b.n), b.n - 1) if fixed_b else (0.0, 0)
    if _half_width(b_se, b_df, a, drift_cv, drift_df, level) < room * b.mean:
        return None
    drift_se = _drift_se(a, drift_cv)
    if drift_se >= b_se:
        return (f"drift between sweeps dominates (±{drift_cv:.1%} between two sweeps, {drift_df} df: at this level "
                f"wider than the {room:.1%} that would decide it, whatever the runs; record A/A pairs on this cluster)")
    return (f"the baseline's {b.n} runs are too spread ({b_se / b.mean:.1%} standard error) to decide it, "
            "whatever this sweep's runs")


def _room(a: Estimate, b: Estimate, min_effect: float, alpha: float) -> tuple[float, float]:
    """How narrow the interval must get to decide, and at which level: a difference needs the
    ``1 - alpha`` interval clear of 1, "no change" the ``1 - 2 alpha`` one inside the margin."""
    change = abs(a.mean / b.mean - 1)
    return (change, alpha) if change >= min_effect else (min_effect - change, 2 * alpha)


def _half_width(within_se: float, within_df: int, a: Estimate, drift_cv: float, drift_df: int, level: float) -> float:
    """The half-width of the ``1 - level`` interval of mean(A) - mean(B): the runs' standard error
    (``within_df``: the pooled degrees of freedom) and the drift's, in quadrature, with
    Welch-Satterthwaite's degrees of freedom (without drift: the runs' own)."""
    drift_se = _drift_se(a, drift_cv)
    se2 = within_se**2 + drift_se**2
    if se2 == 0:
        return 0.0
    parts = [se**4 / df for se, df in ((within_se, within_df), (drift_se, drift_df)) if se and df]
    return t_two_sided(level, se2**2 / sum(parts) if parts else math.inf) * math.sqrt(se2)


def ci_text(row: dict[str, Any], floor: Floor | None = None) -> str:
    """The table's "±95% CI" cell: the half-width of the throughput interval as a share of the mean."""
    e = estimate(row, "throughput", floor)
    if e is None or e.half_width is None or not e.mean:
        return "-"
    return f"±{e.half_width / e.mean:.1%}"
