"""Findings: the decisions a sweep supports, stated with numbers and only where the noise allows.

Pure functions over report rows (launcher/rows.py); no I/O. The rules:

* **Noise.** Each configuration's throughput has a 95% confidence interval. Where it ran more than
  once (cells that differ only in ``seed``), the interval comes from the spread over those runs;
  otherwise from the spread over its ``repeats`` measured windows: the worker records the windows'
  mean and coefficient of variation (``throughput_cv``, sample standard deviation over mean), so
  the standard error is ``cv * mean / sqrt(repeats)`` with ``repeats - 1`` degrees of freedom. Two
  configurations differ only when the 95% interval of the difference of their means (Welch:
  standard errors added in quadrature, Welch-Satterthwaite degrees of freedom, Student's t) lies
  entirely on one side of zero; otherwise the finding is "no measurable difference". With one
  window and one run there is no noise estimate, and no difference is claimed. Windows of one run
  share its process and its neighbours, so they understate the noise between runs made at
  different times: repeat cells over seeds for the stronger estimate.
* **Same world size.** Only cells of the same model and world size are compared; a cell on more
  devices is not better for having more of them (scaling efficiency answers that question).
* **Other settings equal.** Strategies are compared where everything but the strategy (and its
  ``strategy.*`` options) is equal; precisions likewise.
* **Memory** is measured once per cell (peak over the window, max over ranks): a peak-memory
  difference below 3% and a model-state difference below 1% are called equal.
* **Failed cells** are listed and left out; a cell flagged ``interference`` (another job shared
  its devices or hosts) is listed, its comparisons are shown but not claimed, and it is never
  recommended.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from launcher.rows import grouped, num, peak_memory_gib, series_labels, settings, throughput

MARGIN = 0.05  # the recommendation's "within 5% of the fastest"
PEAK_TOLERANCE = 0.03
STATE_TOLERANCE = 0.01
# Known choices in the order that makes the first one the baseline of a comparison.
_ORDER = {"strategy": ["ddp", "fsdp", "zero2", "hsdp", "fsdp_noshard", "fsdp_offload"],
          "precision": ["fp32", "bf16", "fp16"]}
AXES = ("strategy", "precision")
MAX_SHOWN = 60  # comparisons per axis in the markdown; the ones with a verdict come first

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


@dataclass
class Estimate:
    """A configuration's mean throughput and its standard error (None: no noise estimate)."""

    mean: float
    se: float | None
    df: float | None
    n: int  # runs (source "runs") or windows ("windows")
    source: str  # "runs" | "windows" | "none"

    @property
    def half_width(self) -> float | None:
        return None if self.se is None or self.df is None else t95(self.df) * self.se


def estimate(row: dict[str, Any]) -> Estimate | None:
    """The throughput estimate of a row (a cell, or a grouped row holding its runs in ``_members``)."""
    runs = [throughput(m) for m in row.get("_members", [row])]
    done = [v for v in runs if v]
    if not done:
        return None
    if len(done) >= 2:
        mean = statistics.fmean(done)
        return Estimate(mean, statistics.stdev(done) / math.sqrt(len(done)), len(done) - 1, len(done), "runs")
    mean = done[0]
    member = next(m for m in row.get("_members", [row]) if throughput(m))
    cv, windows = num(member.get("throughput_cv")), int(num(member.get("repeats")) or 0)
    if cv is None or windows < 2:
        return Estimate(mean, None, None, max(windows, 1), "none")
    return Estimate(mean, cv * mean / math.sqrt(windows), windows - 1, windows, "windows")


def ci_text(row: dict[str, Any]) -> str:
    """The table's "±95% CI" cell: the half-width of the interval as a share of the mean."""
    e = estimate(row)
    if e is None or e.half_width is None or not e.mean:
        return "-"
    return f"±{e.half_width / e.mean:.1%}"


@dataclass
class Diff:
    """A's throughput against B's: ratio, its 95% interval (None without noise estimates) and verdict."""

    ratio: float
    low: float | None
    high: float | None
    verdict: str  # "higher" | "lower" | "same" | "unknown"


def difference(a: Estimate, b: Estimate) -> Diff:
    """Welch's interval for mean(A) - mean(B), expressed as a ratio to B: 1 + interval / mean(B)."""
    ratio = a.mean / b.mean
    if a.se is None or b.se is None or a.df is None or b.df is None:
        return Diff(ratio, None, None, "unknown")
    se = math.sqrt(a.se**2 + b.se**2)
    if se == 0:
        df = math.inf
    else:
        df = se**4 / ((a.se**4 / a.df if a.se else 0.0) + (b.se**4 / b.df if b.se else 0.0))
    d, hw = a.mean - b.mean, t95(df) * se
    # A throughput is never negative: a very noisy interval is cut at zero.
    low, high = max(0.0, 1 + (d - hw) / b.mean), 1 + (d + hw) / b.mean
    verdict = "higher" if low > 1 else "lower" if high < 1 else "same"
    return Diff(ratio, low, high, verdict)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


@dataclass
class Comparison:
    axis: str
    model: str
    world_size: int
    context: str  # the other swept settings, e.g. "precision=bf16"
    a: dict[str, Any]  # the challenger ...
    b: dict[str, Any]  # ... against the baseline (ddp, fp32 where present)
    a_label: str
    b_label: str
    throughput: Diff | None  # None: one side has no result
    peak_ratio: float | None
    state_ratio: float | None
    caveat: str | None  # why nothing is claimed beyond the numbers (failed, interference)

    @property
    def claimed(self) -> bool:
        return self.caveat is None and self.throughput is not None and self.throughput.verdict in ("higher", "lower")


def _words(row: dict[str, Any]) -> list[str]:
    return [w for w in str(row.get("cell", "")).split() if "=" in w]


def _axis_of(key: str, axis: str) -> bool:
    return key == axis or key.startswith(axis + ".")


def _interference(row: dict[str, Any]) -> str | None:
    for m in row.get("_members", [row]):
        if m.get("interference"):
            return str(m["interference"])
    return None


def _label(row: dict[str, Any], axis: str) -> str:
    extra = [w for w in _words(row) if _axis_of(w.split("=", 1)[0].lstrip("+~"), axis)
             and w.split("=", 1)[0].lstrip("+~") != axis]
    return " ".join([str(settings(row).get(axis, "?")), *extra])


def _order(axis: str, row: dict[str, Any]) -> tuple[int, str]:
    value = str(settings(row).get(axis))
    known = _ORDER.get(axis, [])
    return (known.index(value) if value in known else len(known), _label(row, axis))


def comparisons(units: list[dict[str, Any]], axis: str) -> list[Comparison]:
    """Every pair of configurations that differ only in ``axis``, at the same model and world size."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for u in units:
        rest = sorted((k, v) for k, v in settings(u).items() if not _axis_of(k, axis) and k != "seed")
        groups.setdefault(repr((u.get("model"), u.get("world_size"), rest)), []).append(u)
    out = []
    for members in groups.values():
        if len({_label(u, axis) for u in members}) < 2:
            continue
        members.sort(key=lambda u: _order(axis, u))
        for i, b in enumerate(members):
            for a in members[i + 1:]:
                out.append(_compare(axis, a, b))
    out.sort(key=lambda c: (str(c.model), c.world_size or 0, c.context, c.b_label, c.a_label))
    return out


def _compare(axis: str, a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    ea, eb = estimate(a), estimate(b)
    caveat = None
    for side in (a, b):
        if estimate(side) is None:
            caveat = f"{_label(side, axis)} has no result ({side.get('status')})"
        elif _interference(side):
            caveat = f"{_label(side, axis)} flagged interference: {_interference(side)}"
    context = " ".join(w for w in _words(a) if not _axis_of(w.split("=", 1)[0].lstrip("+~"), axis)
                       and not w.startswith(("nodes=", "seed=")))
    return Comparison(
        axis=axis, model=str(a.get("model")), world_size=int(a.get("world_size") or 0), context=context,
        a=a, b=b, a_label=_label(a, axis), b_label=_label(b, axis),
        throughput=difference(ea, eb) if ea and eb else None,
        peak_ratio=_ratio(peak_memory_gib(a), peak_memory_gib(b)),
        state_ratio=_ratio(num(a.get("model_state_bytes")), num(b.get("model_state_bytes"))),
        caveat=caveat)


# ---- wording --------------------------------------------------------------------------------------

def throughput_text(d: Diff | None) -> str:
    if d is None:
        return "-"
    if d.low is None:
        return f"{d.ratio:.2f}×"
    return f"{d.ratio:.2f}× ({d.low:.2f}–{d.high:.2f})"


def verdict_text(c: Comparison) -> str:
    d = c.throughput
    if d is None or c.caveat:
        return f"not claimed: {c.caveat}"
    if d.verdict == "unknown":
        return "not claimed: no noise estimate (one window, one run; set repeats=3)"
    if d.verdict == "same":
        return "no measurable difference"
    pct = abs(d.ratio - 1)
    return f"**{c.a_label} {pct:.1%} {'faster' if d.verdict == 'higher' else 'slower'}**"


def memory_text(ratio: float | None, tolerance: float) -> str:
    if ratio is None:
        return "-"
    if abs(ratio - 1) <= tolerance:
        return f"{ratio:.2f}× (equal)"
    return f"{ratio:.2f}× ({abs(1 - ratio):.0%} {'less' if ratio < 1 else 'more'})"


def _table(comps: list[Comparison]) -> list[str]:
    lines = ["| ranks | other settings | A vs B | throughput A/B (95% CI) | verdict | peak mem A/B | "
             "model state A/B |", "|---:|---|---|---:|---|---:|---:|"]
    shown = sorted(comps, key=lambda c: not c.claimed)[:MAX_SHOWN]
    for c in [c for c in comps if c in shown]:
        lines.append(f"| {c.world_size} | {_md(c.context or '-')} | {_md(c.a_label)} vs {_md(c.b_label)} | "
                     f"{throughput_text(c.throughput)} | {_md(verdict_text(c))} | "
                     f"{memory_text(c.peak_ratio, PEAK_TOLERANCE)} | {memory_text(c.state_ratio, STATE_TOLERANCE)} |")
    if len(comps) > len(shown):
        lines.append("")
        lines.append(f"{len(comps) - len(shown)} more comparison(s) without a measurable difference are not shown.")
    return lines


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _bullets(comps: list[Comparison]) -> list[str]:
    """One sentence per claimed throughput difference, with memory and model state beside it."""
    out = []
    for c in comps:
        if not c.claimed or c.throughput is None:
            continue
        d = c.throughput
        mem = []
        if c.peak_ratio is not None and abs(c.peak_ratio - 1) > PEAK_TOLERANCE:
            mem.append(f"{abs(1 - c.peak_ratio):.0%} {'less' if c.peak_ratio < 1 else 'more'} peak memory")
        if c.state_ratio is not None and abs(c.state_ratio - 1) > STATE_TOLERANCE:
            mem.append(f"{c.state_ratio:.2f}× the model state per rank")
        where = f"{c.world_size} rank(s)" + (f", {c.context}" if c.context else "")
        out.append(f"- {where}: **{c.a_label}** is {abs(d.ratio - 1):.1%} "
                   f"{'faster' if d.verdict == 'higher' else 'slower'} than **{c.b_label}** "
                   f"({d.ratio:.2f}×, 95% CI {d.low:.2f}–{d.high:.2f})" + (f", with {' and '.join(mem)}" if mem else "")
                   + ".")
    return out


def scaling(units: list[dict[str, Any]]) -> list[str]:
    """Scaling efficiency per series: per-device throughput over the smallest world size's."""
    series: dict[str, list[dict[str, Any]]] = {}
    for u in units:
        if estimate(u) is not None and not _interference(u):
            series.setdefault(str(u.get("series")), []).append(u)
    labels = series_labels([u for members in series.values() for u in members])
    lines = []
    for key, members in sorted(series.items(), key=lambda kv: labels.get(kv[0], kv[0])):
        if len({u.get("world_size") for u in members}) < 2:
            continue
        members.sort(key=lambda u: u.get("world_size") or 0)
        base = members[0]
        eb = estimate(base)
        parts = []
        for u in members[1:]:
            eu = estimate(u)
            if eu is None or eb is None:
                continue
            eff = (eu.mean / u["world_size"]) / (eb.mean / base["world_size"])
            text = f"{u['world_size']} ranks {eff:.0%}"
            if eu.se is not None and eb.se is not None and eu.df and eb.df:
                rel = math.sqrt((eu.se / eu.mean) ** 2 + (eb.se / eb.mean) ** 2)
                text += f" (±{t95(min(eu.df, eb.df)) * rel * eff:.0%})"
            parts.append(text)
        if parts:
            lines.append(f"- {_md(labels.get(key, key))}: against {base['world_size']} rank(s), "
                         + ", ".join(parts) + ".")
    return lines


def recommendations(units: list[dict[str, Any]], margin: float = MARGIN) -> list[str]:
    """Per model and world size: the fastest configuration, and the one with the least peak memory
    (model state where no peak was measured) among those within ``margin`` of the fastest or not
    measurably slower than it (a configuration inside the noise of the fastest is as good a pick)."""
    by_size: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for u in units:
        if estimate(u) is not None and not _interference(u):
            by_size.setdefault((str(u.get("model")), int(u.get("world_size") or 0)), []).append(u)
    multi_model = len({m for m, _ in by_size}) > 1
    lines = []
    for (model, ws), members in sorted(by_size.items()):
        fastest = max(members, key=lambda u: _est(u).mean)
        ef = _est(fastest)
        where = f"{ws} rank(s)" + (f", {model}" if multi_model else "")
        text = f"- **{where}**: fastest **{_md(_name(fastest))}** at {ef.mean:,.1f} samples/s"
        if ef.half_width is not None:
            text += f" (±{ef.half_width / ef.mean:.1%})"
        others = [(u, _est(u)) for u in members if u is not fastest]
        same = [u for u, e in others if difference(e, ef).verdict == "same"]
        unknown = [u for u, e in others if difference(e, ef).verdict == "unknown"]
        if same:
            text += "; not measurably faster than " + ", ".join(_md(_name(u)) for u in same)
        if unknown:
            text += "; no noise estimate to tell it from " + ", ".join(_md(_name(u)) for u in unknown)
        text += "."
        near = [u for u in members if _est(u).mean >= (1 - margin) * ef.mean or u in same]
        within = f"within {margin:.0%} of it or not measurably slower" if same else f"within {margin:.0%} of it"

        def memory(u: dict[str, Any]) -> float:
            return peak_memory_gib(u) or num(u.get("model_state_bytes")) or math.inf

        lean = min(near, key=lambda u: (memory(u), -_est(u).mean))
        if len(near) == 1:
            text += f" No other configuration comes within {margin:.0%} of it."
        elif lean is fastest or memory(lean) >= memory(fastest) * (1 - PEAK_TOLERANCE):
            text += f" Of the {len(near) - 1} other(s) {within}, none uses measurably less memory."
        else:
            el = _est(lean)
            pm_l, pm_f = peak_memory_gib(lean), peak_memory_gib(fastest)
            mem = (f"peak {pm_l:.2f} GiB against {pm_f:.2f} GiB" if pm_l is not None and pm_f is not None
                   else "less model state per rank")
            text += (f" Most memory-efficient {within}: **{_md(_name(lean))}** ({mem}, "
                     f"{el.mean / ef.mean:.0%} of the fastest's throughput).")
        lines.append(text)
    return lines


def stragglers(rows: list[dict[str, Any]]) -> list[str]:
    """Cells whose slowest rank ran more than 10% behind the median rank (the worker's ``straggler_rank``
    tag, from step times measured without gradient communication, where waiting hides nothing)."""
    out = []
    for row in rows:
        rank = row.get("straggler_rank")
        spread = row.get("step_time_rank_spread")
        if rank:
            how = f": {spread:.2f}x the median rank's step time" if isinstance(spread, (int, float)) else ""
            out.append(f"- {_md(row['cell'])}: rank {_md(rank)} is a straggler{how}. The whole job runs at its "
                       f"pace; look at that host (thermals, a noisy neighbour, a slow link).")
    return out


def _est(row: dict[str, Any]) -> Estimate:
    e = estimate(row)
    if e is None:
        raise ValueError(f"{row.get('cell')} has no result")
    return e


def _name(row: dict[str, Any]) -> str:
    words = [w for w in str(row.get("cell", "")).split() if not w.startswith("nodes=")]
    return " ".join(words) or f"{row.get('strategy')} {row.get('precision')}"


def findings(rows: list[dict[str, Any]], margin: float = MARGIN) -> str:
    """The ``## Findings`` section's body (markdown), from report rows."""
    units = grouped(rows)
    lines = ["Only cells of the same model and world size are compared, with every other setting equal. A "
             "throughput difference is claimed only when the 95% confidence interval of the difference excludes "
             "zero (noise from the spread over repeated runs, else over the measured windows; ratios are A over "
             "B with that interval). Memory: peak differences under "
             f"{PEAK_TOLERANCE:.0%} and model-state differences under {STATE_TOLERANCE:.0%} count as equal.", ""]
    failed = [u for u in units if estimate(u) is None]
    flagged = [u for u in units if _interference(u)]
    noiseless = [u for u in units if (e := estimate(u)) is not None and e.se is None]
    if failed:
        lines.append("Left out (no result): " + ", ".join(f"{_md(u['cell'])} ({u.get('status')})" for u in failed)
                     + ".")
    if flagged:
        lines.append("⚠ Interference: " + "; ".join(f"{_md(u['cell'])}: {_md(_interference(u))}" for u in flagged)
                     + ". Their comparisons are shown but not claimed, and they are not recommended.")
    if noiseless:
        lines.append(f"{len(noiseless)} configuration(s) have no noise estimate (one measured window, one run): "
                     "nothing is claimed about them. Set repeats=3 or more.")
    if failed or flagged or noiseless:
        lines.append("")
    for axis, title in (("strategy", "Strategies"), ("precision", "Precisions")):
        comps = comparisons(units, axis)
        lines += [f"### {title}", ""]
        if not comps:
            lines += [f"No two configurations differ only in their {axis} at the same world size.", ""]
            continue
        bullets = _bullets(comps)
        lines += bullets or ["No measurable throughput difference."]
        lines += [""] + _table(comps) + [""]
    lines += ["### Scaling efficiency", ""]
    lines += scaling(units) or ["No series was measured at more than one world size."]
    lines += ["", "### Stragglers", ""]
    lines += stragglers(rows) or ["No rank lagged more than 10% behind the median rank."]
    lines += ["", f"### Recommendation (margin {margin:.0%})", ""]
    lines += recommendations(units, margin) or ["No cell finished with a result."]
    return "\n".join(lines).rstrip() + "\n"
