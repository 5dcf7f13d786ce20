"""Decisions under repeated looks: the error control of ``runs=auto`` (group-sequential, alpha spending).

Pure functions of numbers (stdlib only); launcher/report/stats.py applies them to report rows.

A sweep with ``runs=auto`` looks at its comparisons after every round of runs and stops adding
runs to a comparison once it is decided. Testing each look at 5% would let false claims grow with
the number of looks ("peeking"). Instead:

* **The looks are planned before the first run.** Round ``r`` brings every open configuration to
  ``n_r`` runs: ``runs_min``, then twice as many each round, up to ``runs_max``
  (:func:`schedule`; 3..12 gives 3, 6, 12: three looks).
* **Alpha is spent over the looks** with the Lan-DeMets spending function of Pocock's type,
  ``f(t) = alpha * ln(1 + (e - 1) t)`` at the information fraction ``t = n_r / runs_max``: look ``r``
  tests at ``alpha_r = f(t_r) - f(t_{r-1})``, and the ``alpha_r`` add up to ``alpha`` (5%). Pocock's
  shape spends more early than O'Brien-Fleming's, so large differences stop at the first round.
* **Union bound.** A false claim over the whole sequence is a false claim at some look, so its
  probability is at most the sum of the looks' levels, ``alpha``, however the looks' statistics are
  correlated and whichever comparisons stop when. A comparison's verdict is its first decided look
  (or its last look); a look at which no new run arrived still counts, which only wastes alpha.
* **Each look** is Welch's interval of the ratio of means (as every fixed-runs verdict):
  a difference is claimed when the two-sided ``1 - alpha_r`` interval excludes 1 and the change is
  at least the minimum effect; equivalence ("no change") is claimed by two one-sided tests
  (TOST) at ``alpha_r`` each: the ``1 - 2 alpha_r`` interval lies wholly inside the margin.

A sweep with fixed ``runs=N`` is the one-look case: ``alpha_1 = alpha``, its verdicts are as before.
bench/sequential_aa.py measures the false-claim rate of this rule against naive re-testing on
recorded run-to-run noise.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05  # the false-claim rate over a whole sequence of looks
# Runs per configuration double each round. Against growing by 1.5 (3, 5, 8, 12) it takes one round
# fewer to runs_max (on a cluster each round waits in the queue again) and spends the alpha over fewer
# looks: simulated on a 23% slowdown at 10% run-to-run spread (docs/deciding.md), 86% of comparisons
# end by 6 runs per side against 63%, for 6% more launches on average (python -m bench.schedules).
GROWTH = 2.0


def schedule(runs_min: int, runs_max: int) -> tuple[int, ...]:
    """Runs per configuration after each round: ``runs_min`` first, then about GROWTH times more
    (at least one more) each round, ending exactly at ``runs_max``."""
    n, out = runs_min, [runs_min]
    while n < runs_max:
        n = min(runs_max, max(n + 1, math.ceil(n * GROWTH)))
        out.append(n)
    return tuple(out)


def spent(t: float, alpha: float = ALPHA) -> float:
    """The alpha spent by information fraction ``t`` (Lan-DeMets, Pocock type): 0 at 0, alpha at 1."""
    return alpha * math.log(1 + (math.e - 1) * min(1.0, max(0.0, t)))


@dataclass(frozen=True)
class Looks:
    """The planned looks of a sweep: runs per configuration after each round, and the alpha."""

    schedule: tuple[int, ...]
    alpha: float = ALPHA
    # Why the sweep added no further round although comparisons were open (a wall-time budget).
    ended: str | None = None
    # The looks taken so far (the rounds that have run); None: all planned.
    done: int | None = None

    @classmethod
    def fixed(cls, runs: int = 1) -> Looks:
        """One look at the end: a sweep with fixed runs (its verdicts are the classic 95% ones)."""
        return cls((max(1, runs),))

    @property
    def rounds(self) -> int:
        return len(self.schedule)

    @property
    def sequential(self) -> bool:
        return self.rounds > 1

    @property
    def taken(self) -> int:
        """The looks taken so far: a look not yet run is not judged."""
        return self.rounds if self.done is None else max(1, min(self.done, self.rounds))

    def alpha_at(self, look: int) -> float:
        """The level of look ``look`` (1-based); the levels of all looks add up to ``alpha``."""
        if self.rounds == 1:
            return self.alpha
        n_max = self.schedule[-1]
        now = self.schedule[min(look, self.rounds) - 1] / n_max
        before = self.schedule[look - 2] / n_max if look > 1 else 0.0
        return spent(now, self.alpha) - spent(before, self.alpha)

    def round_of(self, run: int) -> int:
        """The round whose look first includes run number ``run`` (1-based)."""
        return next((r for r, n in enumerate(self.schedule, 1) if run <= n), self.rounds)

    def text(self) -> str:
        if not self.sequential:
            return f"one look at {self.alpha:.0%}"
        levels = ", ".join(f"{self.alpha_at(r):.2%}" for r in range(1, self.rounds + 1))
        return (f"{self.rounds} looks at {'/'.join(map(str, self.schedule))} runs, levels {levels} "
                f"(Pocock-type alpha spending, {self.alpha:.0%} in all)")


# ---- Student's t quantiles for any level (stdlib: the regularized incomplete beta) ----------------

def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=4096)
def _t_two_sided(alpha: float, df: int) -> float:
    if df > 10_000:
        return statistics.NormalDist().inv_cdf(1 - alpha / 2)
    low, high = 0.0, 1.0
    while 2 * t_tail(high, df) > alpha:
        high *= 2
    for _ in range(200):  # bisection to the float's precision
        mid = (low + high) / 2
        if 2 * t_tail(mid, df) > alpha:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * high:
            break
    return high


def t_two_sided(alpha: float, df: float) -> float:
    """The two-sided ``1 - alpha`` quantile of Student's t; fractional df round down (wider)."""
    if df < 1:
        return math.inf
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return _t_two_sided(alpha, int(df))
