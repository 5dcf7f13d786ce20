"""Sweep against sweep: per-cell deltas of throughput, step time and memory, each with a verdict
that respects the measured noise (``python -m launcher.report --compare A B``).

Pure functions over report rows: :func:`compare` matches two sweeps' rows and judges each pair,
and :class:`Comparison` holds the verdicts the command reads. Reading the rows (a sweep directory
or an MLflow parent run) is launcher/report/collect.py's; the table is comparetable.py's; the
command line, its refusals and its exit code are launcher/report/__main__.py's.

Matching: cells that differ only in ``seed`` are first grouped into one configuration (mean over
runs, as in the report). Two configurations match when their settings are equal: the cell's
overrides (sweep directory) or run params (MLflow), without the where-settings (``output_root``,
``sweep_dir``, ``wait``, timeouts, ``tracking.*``) and the seed. A configuration left unmatched
that has the same cell name (the swept values, e.g. ``strategy=fsdp nodes=2``) on the other side
is matched by name, and the output says so (the fixed settings differ). The rest are listed as
only in A or only in B.

Verdicts, B against A (B is the newer run), each from the spread between independent runs
(``runs``) on both sides, or the cluster's noise floor where a side ran once (launcher/report/stats.py):
* ``improvement`` or ``regression`` only when the 95% interval of the change excludes zero AND the
  change is at least the threshold (5% by default; 3% for peak memory);
* ``no change`` when equivalence within ±threshold is shown (two one-sided tests: the 90% interval
  lies wholly inside the margin): the positive result a regression gate passes on (``--gate``);
* ``inconclusive`` otherwise, with the runs per side that would decide it (benchstat's "~");
  without any noise estimate (one run, no floor) every metric is inconclusive;
* throughput (higher is better), step time p50 and peak memory (lower is better) each get their own
  interval from their own spread; model state is counted exactly: differences below 1% are
  ``no change``;
* a configuration with a result in A and none in B (failed, diverged, cancelled) is a ``regression``.
A configuration whose runs were flagged for interference on either side (another job shared its
devices or hosts: launcher/report/findings.py) keeps its numbers but its speed verdicts become
``not claimed``, as in the findings: the difference is the machine's, not the configuration's. It
is neither a regression nor a pass of the gate.
**Only comparable configurations are compared.** A pair is compared when both sides are the same
model at the same world size, their settings are equal apart from at most one (the setting under
test; a pair matched by name says which), and every run of both has ended. Any other pair is listed
under "not compared" with the reason: it is never a claim, never a regression and never a pass of
the gate. A sweep compared with itself is refused (launcher/commands/report.py); a sweep still
running is compared only on its configurations whose runs have all ended, and the output says so.

**Family-wise error control.** Every judged row (each claimed metric of each compared
configuration: throughput, step time, peak memory) is one test of the family; the family's
chance of any false claim is held at 5% by Bonferroni's split: each row is judged at ``5% / m``
(``m`` rows). Under repeated looks the split applies to each look's level. The output states ``m``
and the level.

**Drift between sweeps.** Two sweeps run at different times differ by more than their runs'
spread shows, by a drift shared by every run of a sweep that more runs do not shrink. Every
difference adds it to its noise as a term of its own, with its own degrees of freedom
(launcher/report/stats.py, sweep_drift): a stated default allowance pooled with the cluster's
record of A/A pairs (``--record-drift``, launcher/report/noisefloor.py). The output says which
drift was used and from how many recorded A/A entries; a row that the drift alone keeps from any
verdict says "cannot decide: drift between sweeps dominates" instead of a number of runs.

**Throughput and step time agree or say why.** Both are read from the same runs; step time p50 is
the median step, throughput counts every step. Where they disagree, step time never claims more
than throughput: a step-time claim without a throughput claim is shown as inconclusive with the
reason, and a throughput claim that step time does not share says so in its note.

The command reads its exit code from here: 1 where :meth:`Comparison.regressions` finds one; 3
(undecided) where nothing was judged (:meth:`Comparison.judged` is empty), or with ``--gate`` where
a throughput row is not shown to be "no change" or an improvement; an inconclusive row alone is
never 1.
When B ran with ``runs=auto`` against A as its baseline, its rounds were looks at these
comparisons: each verdict is then its first decided look at that look's alpha
(launcher/report/sequential.py), and A's runs count at every look.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from contract import metrics
from launcher.report.comparisons import STATE_TOLERANCE, interference, sequence_text
from launcher.report.explain import Explanation, explain
from launcher.report.rows import grouped, num, settings
from launcher.report.stats import (
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    MIN_EFFECT,
    SAME,
    Diff,
    Drift,
    Floor,
    Looks,
    estimate,
    sequential_difference,
    sweep_drift,
)

IMPROVEMENT, REGRESSION, NO_CHANGE = "improvement", "regression", "no change"
UNDECIDED, NOT_CLAIMED = "inconclusive", "not claimed"
# Each claimed metric is compared under its report column's label and by its direction; model
# state, counted exactly, under its own (its column's unit changes with the sweep).
_THROUGHPUT = metrics.claimed()["throughput"]
_STATE = metrics.get("model_state_bytes")
_STEP = metrics.claimed()["step_time"]
_SPEED = {str(_THROUGHPUT.label), str(_STEP.label)}  # what interference moves
ENDED = ("done", "failed", "cancelled", "lost", "diverged", "FINISHED", "FAILED", "KILLED")
FAMILY_METHOD = "Bonferroni"


@dataclass
class Delta:
    metric: str
    a: float | None
    b: float | None
    change: float | None  # (b - a) / a
    verdict: str
    note: str = ""
    runs_needed: int | None = None  # inconclusive: runs per side that would decide it
    margin: float | None = None  # the band of "no change" (the threshold, or memory's narrower one)
    undecidable: str | None = None  # inconclusive: why no number of runs would decide it


@dataclass
class Match:
    name: str
    a: dict[str, Any]
    b: dict[str, Any]
    by: str  # "settings" | "name"
    deltas: list[Delta] = field(default_factory=list)
    why_not: str | None = None  # why the pair is not comparable (None: compared)
    differs: list[str] = field(default_factory=list)  # the setting under test, where one differs
    why: Explanation | None = None  # B's step against A's, part by part (launcher/report/explain.py)

    @property
    def caveat(self) -> str | None:
        """Why its speed is not claimed: a side flagged for interference (None: nothing)."""
        for side, row in (("A", self.a), ("B", self.b)):
            if flag := interference(row):
                return f"interference in {side}: {flag}"
        return None

    @property
    def changed(self) -> bool:
        """A claimed change of speed (throughput or step time)."""
        return any(d.metric in _SPEED and d.verdict in (IMPROVEMENT, REGRESSION) for d in self.deltas)


@dataclass
class Comparison:
    matches: list[Match]
    only_a: list[dict[str, Any]]
    only_b: list[dict[str, Any]]
    threshold: float
    not_compared: list[Match] = field(default_factory=list)
    family: int = 0  # the judged rows (the family whose false claims are controlled together)
    alpha: float = 0.05  # the family's level
    drift: Drift | None = None  # the drift judged against (stats.sweep_drift: the default and the record)
    running: int = 0  # cells of either sweep that have not ended (their configurations are not compared)

    @property
    def row_alpha(self) -> float:
        """Each row's level: the family's alpha split over its rows (Bonferroni)."""
        return self.alpha / max(1, self.family)

    def regressions(self) -> list[tuple[Match, Delta]]:
        """Regressions beyond the noise and the threshold (a lost result always counts)."""
        return [(m, d) for m in self.matches for d in m.deltas if d.verdict == REGRESSION]

    def judged(self) -> list[tuple[Match, Delta]]:
        """The rows with a verdict among the claimed metrics (throughput, step time, peak memory): what
        the comparison decided. Model state, counted exactly, judges no runs; none of these: the
        command is undecided (exit 3), never a pass."""
        labels = {str(m.label) for m in metrics.claimed().values()}
        return [(m, d) for m in self.matches for d in m.deltas
                if d.metric in labels and d.verdict in (IMPROVEMENT, REGRESSION, NO_CHANGE)]

    def inconclusive(self) -> list[tuple[Match, Delta]]:
        return [(m, d) for m in self.matches for d in m.deltas if d.verdict == UNDECIDED]

    def gate(self) -> tuple[bool, str]:
        """Whether a regression gate passes positively: every matched configuration's throughput is
        shown to be "no change" (within ±threshold) or an improvement, and none is missing."""
        label = str(_THROUGHPUT.label)
        rows = [(m, d) for m in self.matches for d in m.deltas if d.metric == label]
        shown = [(m, d) for m, d in rows if d.verdict in (NO_CHANGE, IMPROVEMENT)]
        if self.regressions():
            return False, f"gate failed: {len(self.regressions())} regression(s)"
        if not rows or len(shown) < len(rows) or self.only_a or self.not_compared:
            open_ = [m.name for m, d in rows if d.verdict not in (NO_CHANGE, IMPROVEMENT)]
            missing = [row_name(r) for r in self.only_a]
            return False, ("gate not passed: " + "; ".join(
                part for part in (f"{len(open_)} throughput row(s) not shown within ±{self.threshold:.0%} "
                                  f"({', '.join(open_[:4])})" if open_ else "",
                                  f"{len(missing)} configuration(s) only in A" if missing else "",
                                  f"{len(self.not_compared)} pair(s) not comparable" if self.not_compared else "",
                                  "nothing compared" if not rows else "") if part))
        return True, (f"gate passed: all {len(rows)} configuration(s) shown no slower than A "
                      f"(no change within ±{self.threshold:.0%} or an improvement)")


def _key(row: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in settings(row).items() if k != "seed"))


def row_name(row: dict[str, Any]) -> str:
    return " ".join(w for w in str(row.get("cell", "")).split() if not w.startswith(("seed=", "run="))).split(" (")[0]


def _ended(row: dict[str, Any]) -> bool:
    return all(str(m.get("status") or "done") in ENDED for m in row.get("_members", [row]))


def comparable(m: Match) -> str | None:
    """Why a matched pair cannot be compared (None: it can): the same model, the same world size,
    the settings equal apart from at most one (the setting under test), every run ended."""
    for side, row in (("A", m.a), ("B", m.b)):
        if not _ended(row):
            members = row.get("_members", [row])
            left = sum(1 for r in members if str(r.get("status") or "done") not in ENDED)
            return f"still running in {side} ({left} of {len(members)} run(s) not ended)"
    sa, sb = settings(m.a), settings(m.b)
    if m.a.get("model") != m.b.get("model") or sa.get("model") != sb.get("model"):
        return f"different models (A: {m.a.get('model') or sa.get('model')}, B: {m.b.get('model') or sb.get('model')})"
    if str(m.a.get("world_size")) != str(m.b.get("world_size")):
        return f"different world sizes (A: {m.a.get('world_size')}, B: {m.b.get('world_size')})"
    differ = sorted(k for k in set(sa) | set(sb) if k != "seed" and sa.get(k) != sb.get(k))
    if len(differ) > 1:
        return (f"settings differ in {len(differ)} keys ({', '.join(differ[:4])}"
                + (" ..." if len(differ) > 4 else "") + "): only the one under test may differ")
    m.differs = differ
    return None


def family_size(matches: list[Match], floor: Floor | None = None) -> int:
    """The judged rows of the compared pairs: each claimed metric both sides measured (model state,
    counted exactly, and flagged pairs' speed, never claimed, are not tests)."""
    n = 0
    for m in matches:
        for claim in metrics.claimed():
            if m.caveat and claim in ("throughput", "step_time"):
                continue
            n += estimate(m.a, claim, floor) is not None and estimate(m.b, claim, floor) is not None
    return n


def compare(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], threshold: float = 0.05,
            floor: Floor | None = None, looks: Looks | None = None, drift: Drift | None = None) -> Comparison:
    """B against A; ``looks``: B's planned looks when it ran with runs=auto against A as its baseline
    (A's runs, all there before B started, count at every look); ``drift``: the cluster's recorded
    sweep-to-sweep drift (None: none recorded), pooled with the default allowance
    (stats.sweep_drift) into the drift that is part of the noise of every difference."""
    looks = looks or Looks.fixed()
    drift = sweep_drift(drift)
    running = sum(1 for r in [*rows_a, *rows_b] if str(r.get("status") or "done") not in ENDED)
    if looks.sequential:
        rows_a = [{**r, "round": 0} for r in rows_a]
    units_a, units_b = grouped(rows_a), grouped(rows_b)
    left_b = {id(u): u for u in units_b}
    by_key: dict[str, list[dict[str, Any]]] = {}
    for u in units_b:
        by_key.setdefault(_key(u), []).append(u)
    matches, unmatched_a = [], []
    for a in units_a:
        found = [b for b in by_key.get(_key(a), []) if id(b) in left_b]
        if found:
            matches.append(Match(row_name(a), a, found[0], "settings"))
            del left_b[id(found[0])]
        else:
            unmatched_a.append(a)
    only_a = []
    for a in unmatched_a:
        same_name = [b for b in left_b.values() if row_name(b) == row_name(a)]
        if len(same_name) == 1:
            matches.append(Match(row_name(a), a, same_name[0], "name"))
            del left_b[id(same_name[0])]
        else:
            only_a.append(a)
    not_compared = []
    for m in matches:
        m.why_not = comparable(m)
        if m.why_not:
            not_compared.append(m)
    compared = [m for m in matches if not m.why_not]
    family = family_size(compared, floor)
    # Bonferroni over the family: every row at alpha / m, every look of a row at its share of that.
    row_looks = dataclasses.replace(looks, alpha=looks.alpha / max(1, family))
    for m in compared:
        m.deltas = _agreed(_unclaimed(deltas(m.a, m.b, threshold, floor, row_looks, drift), m.caveat))
        m.why = explain(m.b, m.a, "B", "A", floor)
    return Comparison(compared, only_a, list(left_b.values()), threshold, not_compared, family, looks.alpha, drift,
                      running)


def _agreed(found: list[Delta]) -> list[Delta]:
    """Throughput and step time read the same runs: step time never claims what throughput does not,
    and a throughput claim that step time does not share says why."""
    tp = next((d for d in found if d.metric == str(_THROUGHPUT.label)), None)
    step = next((d for d in found if d.metric == str(_STEP.label)), None)
    if tp is None or step is None or NOT_CLAIMED in (tp.verdict, step.verdict) or tp.verdict == step.verdict:
        return found
    claims = (IMPROVEMENT, REGRESSION)
    why = ("step time p50 is the median step and throughput counts every step (slow steps, data waits): "
           "the two move apart when the slow steps change")
    if step.verdict in claims:
        step.note = (f"not claimed: throughput on the same runs is {tp.verdict} "
                     f"({'-' if tp.change is None else format(tp.change, '+.1%')}); {why}; {step.note}")
        step.verdict = UNDECIDED
        step.runs_needed, step.undecidable = tp.runs_needed, tp.undecidable
    elif tp.verdict in claims:
        tp.note = f"{tp.note}; step time p50 on the same runs is {step.verdict}: {why}"
    return found


def _unclaimed(found: list[Delta], caveat: str | None) -> list[Delta]:
    """A flagged configuration's speed deltas shown but not claimed (memory and state are kept:
    another job's load does not move them)."""
    if caveat is None:
        return found
    return [Delta(d.metric, d.a, d.b, d.change, NOT_CLAIMED, f"{caveat}; {d.note}", margin=d.margin)
            if d.metric in _SPEED and d.a is not None and d.b is not None else d for d in found]


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not a else (b - a) / a


def deltas(a: dict[str, Any], b: dict[str, Any], threshold: float, floor: Floor | None = None,
           looks: Looks | None = None, drift: Drift | None = None) -> list[Delta]:
    """B against A for every metric both measured, each judged by its own between-run noise."""
    looks = looks or Looks.fixed()
    ea, eb = estimate(a, "throughput", floor), estimate(b, "throughput", floor)
    if ea is None or eb is None:
        if ea is not None:
            why = b.get("failure_class") or b.get("status")
            return [Delta(str(_THROUGHPUT.label), ea.mean, None, None, REGRESSION, f"no result in B ({why})")]
        why = a.get("failure_class") or a.get("status")
        verdict = IMPROVEMENT if eb is not None else NO_CHANGE
        return [Delta(str(_THROUGHPUT.label), None, eb.mean if eb else None, None, verdict,
                      f"no result in A ({why})")]
    out = [_delta(_THROUGHPUT, _judged(b, a, "throughput", threshold, looks, floor, drift), ea.mean, eb.mean,
                  noise=_noise(ea.source, eb.source, ea.n, eb.n, drift, "throughput"), looks=looks)]
    for claim, metric in metrics.claimed().items():
        if claim == "throughput":
            continue
        sa, sb = estimate(a, claim, floor), estimate(b, claim, floor)
        if sa is not None and sb is not None:
            out.append(_delta(metric, _judged(b, a, claim, _effect(claim, threshold), looks, floor, drift), sa.mean,
                              sb.mean, noise=_noise(sa.source, sb.source, sa.n, sb.n, drift, claim), looks=looks))
    ma, mb = _mib(a), _mib(b)
    state_change = _change(ma, mb)
    if state_change is not None:
        grew_worse = (state_change > 0) == (_STATE.direction is metrics.Direction.LOWER)
        verdict = NO_CHANGE if abs(state_change) <= STATE_TOLERANCE else (REGRESSION if grew_worse
                                                                           else IMPROVEMENT)
        out.append(Delta("model state MiB", ma, mb, state_change, verdict,
                         f"counted exactly; band ±{STATE_TOLERANCE:.0%}"))
    return out


def _judged(b: dict[str, Any], a: dict[str, Any], claim: str, effect: float, looks: Looks,
            floor: Floor | None, drift: Drift | None = None) -> Diff:
    found = sequential_difference(b, a, claim, effect, looks, floor, drift)
    assert found is not None  # both sides have an estimate (checked by the caller)
    return found


def _noise(source_a: str, source_b: str, n_a: int, n_b: int, drift: Drift | None = None, claim: str = "") -> str:
    if "none" in (source_a, source_b):
        return "no noise estimate (1 run, no noise floor)"
    with_drift = (f" + drift {drift.cv[claim]:.1%} ({drift.df_of(claim)} df)"
                  if drift is not None and claim in drift.cv else "")
    if "floor" in (source_a, source_b):
        return f"{n_a} + {n_b} runs with the noise floor{with_drift}"
    return f"{n_a} + {n_b} runs{with_drift}"


def _effect(claim: str, threshold: float) -> float:
    """The change worth a verdict: the command's threshold for speed (throughput, step time), the
    registry's narrower band for memory, which moves less between runs."""
    return MIN_EFFECT[claim] if claim == "peak_memory" else threshold


def _delta(metric: metrics.Metric, d: Diff, a: float, b: float, *, noise: str, looks: Looks) -> Delta:
    """One metric's delta: the Diff's verdict in the words of a comparison over time."""
    better, worse = (HIGHER, LOWER) if metric.direction is metrics.Direction.HIGHER else (LOWER, HIGHER)
    verdict = {better: IMPROVEMENT, worse: REGRESSION, SAME: NO_CHANGE, INCONCLUSIVE: UNDECIDED}[d.verdict]
    interval = (f"{_level(1 - d.alpha)} CI {d.low - 1:+.1%}..{d.high - 1:+.1%}, "
                if d.low is not None and d.high is not None else "")
    if verdict == NO_CHANGE and d.eq_low is not None and d.eq_high is not None:
        interval = f"within ±{d.min_effect:.0%}: {_level(1 - 2 * d.alpha)} CI {d.eq_low - 1:+.1%}..{d.eq_high - 1:+.1%}, "
    note = f"{interval}{noise}{sequence_text(d, looks, flip=True)}"
    if verdict == UNDECIDED and not looks.sequential:  # a sequential note says it already
        note = d.why_inconclusive() if d.low is None else f"{note}; {d.why_inconclusive()}"
    return Delta(str(metric.label), a, b, d.ratio - 1, verdict, note, d.runs_needed, d.min_effect,
                 d.undecidable if verdict == UNDECIDED else None)


def _level(confidence: float) -> str:
    """95%, 99.6%: as many digits as tell the level from its neighbours."""
    text = f"{confidence:.0%}"
    return text if abs(float(text[:-1]) / 100 - confidence) < 1e-9 else f"{confidence:.1%}"


def _mib(row: dict[str, Any]) -> float | None:
    b = num(_STATE.read(row))
    return None if b is None else b / 1024**2
