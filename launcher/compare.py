"""Sweep against sweep: per-cell deltas of throughput, step time and memory, each with a verdict
that respects the measured noise (``python -m launcher.report --compare A B``).

Pure functions over report rows; reading the rows (sweep directory or MLflow parent run) is the
report module's job.

Matching: cells that differ only in ``seed`` are first grouped into one configuration (mean over
runs, as in the report). Two configurations match when their settings are equal: the cell's
overrides (sweep directory) or run params (MLflow), without the where-settings (``output_root``,
``sweep_dir``, ``wait``, timeouts, ``tracking.*``) and the seed. A configuration left unmatched
that has the same cell name (the swept values, e.g. ``strategy=fsdp nodes=2``) on the other side
is matched by name, and the output says so (the fixed settings differ). The rest are listed as
only in A or only in B.

Verdicts, B against A (B is the newer run):
* throughput: Welch's 95% interval of the difference (launcher/findings.py): ``improvement`` or
  ``regression`` when it excludes zero, else ``no change``; without a noise estimate on either
  side (one window, one run) the threshold is the only band, and the verdict says so;
* step time p50: the throughput's relative 95% intervals of both sides, combined, are the band
  (step time is the inverse of throughput, up to the data time); lower is better;
* peak memory and model state: measured once; differences below 3% and 1% are ``no change``;
  lower is better;
* a configuration with a result in A and none in B is a ``regression``.
A regression whose relative change exceeds ``threshold`` makes the command exit with 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from launcher.findings import PEAK_TOLERANCE, STATE_TOLERANCE, difference, estimate
from launcher.rows import grouped, num, peak_memory_gib, settings

IMPROVEMENT, REGRESSION, NO_CHANGE = "improvement", "regression", "no change"


@dataclass
class Delta:
    metric: str
    a: float | None
    b: float | None
    change: float | None  # (b - a) / a
    verdict: str
    note: str = ""


@dataclass
class Match:
    name: str
    a: dict[str, Any]
    b: dict[str, Any]
    by: str  # "settings" | "name"
    deltas: list[Delta] = field(default_factory=list)


@dataclass
class Comparison:
    matches: list[Match]
    only_a: list[dict[str, Any]]
    only_b: list[dict[str, Any]]
    threshold: float

    def regressions(self) -> list[tuple[Match, Delta]]:
        """Regressions larger than the threshold (a lost result always counts)."""
        return [(m, d) for m in self.matches for d in m.deltas
                if d.verdict == REGRESSION and (d.change is None or abs(d.change) > self.threshold)]


def _key(row: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in settings(row).items() if k != "seed"))


def _name(row: dict[str, Any]) -> str:
    return " ".join(w for w in str(row.get("cell", "")).split() if not w.startswith("seed=")).split(" (")[0]


def compare(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], threshold: float = 0.05) -> Comparison:
    units_a, units_b = grouped(rows_a), grouped(rows_b)
    left_b = {id(u): u for u in units_b}
    by_key: dict[str, list[dict[str, Any]]] = {}
    for u in units_b:
        by_key.setdefault(_key(u), []).append(u)
    matches, unmatched_a = [], []
    for a in units_a:
        found = [b for b in by_key.get(_key(a), []) if id(b) in left_b]
        if found:
            matches.append(Match(_name(a), a, found[0], "settings"))
            del left_b[id(found[0])]
        else:
            unmatched_a.append(a)
    only_a = []
    for a in unmatched_a:
        same_name = [b for b in left_b.values() if _name(b) == _name(a)]
        if len(same_name) == 1:
            matches.append(Match(_name(a), a, same_name[0], "name"))
            del left_b[id(same_name[0])]
        else:
            only_a.append(a)
    for m in matches:
        m.deltas = deltas(m.a, m.b, threshold)
    return Comparison(matches, only_a, list(left_b.values()), threshold)


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not a else (b - a) / a


def _rel_half_width(row: dict[str, Any]) -> float | None:
    e = estimate(row)
    return None if e is None or e.half_width is None or not e.mean else e.half_width / e.mean


def deltas(a: dict[str, Any], b: dict[str, Any], threshold: float) -> list[Delta]:
    ea, eb = estimate(a), estimate(b)
    if ea is None or eb is None:
        if ea is not None:
            why = b.get("failure_class") or b.get("status")
            return [Delta("samples/s", ea.mean, None, None, REGRESSION, f"no result in B ({why})")]
        why = a.get("failure_class") or a.get("status")
        verdict = IMPROVEMENT if eb is not None else NO_CHANGE
        return [Delta("samples/s", None, eb.mean if eb else None, None, verdict, f"no result in A ({why})")]
    out = []
    d = difference(eb, ea)
    change: float = (d.ratio or 1.0) - 1
    if d.verdict == "unknown":
        verdict = NO_CHANGE if abs(change) <= threshold else (IMPROVEMENT if change > 0 else REGRESSION)
        out.append(Delta("samples/s", ea.mean, eb.mean, change, verdict, "no noise estimate: threshold only"))
    else:
        verdict = {"higher": IMPROVEMENT, "lower": REGRESSION}.get(d.verdict, NO_CHANGE)
        interval = f"95% CI {d.low - 1:+.1%}..{d.high - 1:+.1%}" if d.low is not None and d.high is not None else ""
        out.append(Delta("samples/s", ea.mean, eb.mean, change, verdict, interval))
    # Step time: lower is better; its band is the throughputs' relative intervals, combined.
    sa, sb = num(a.get("step_time_ms_p50")), num(b.get("step_time_ms_p50"))
    step_change = _change(sa, sb)
    if step_change is not None:
        change = step_change
        ha, hb = _rel_half_width(a), _rel_half_width(b)
        if ha is not None and hb is not None:
            band = math.sqrt(ha**2 + hb**2)
            note = f"band ±{band:.1%}"
        else:
            band, note = threshold, "no noise estimate: threshold only"
        verdict = NO_CHANGE if abs(change) <= band else (REGRESSION if change > 0 else IMPROVEMENT)
        out.append(Delta("step p50 ms", sa, sb, change, verdict, note))
    for metric, va, vb, tol in (("peak mem GiB", peak_memory_gib(a), peak_memory_gib(b), PEAK_TOLERANCE),
                                ("model state MiB", _mib(a), _mib(b), STATE_TOLERANCE)):
        mem_change = _change(num(va), num(vb))
        if mem_change is None:
            continue
        verdict = NO_CHANGE if abs(mem_change) <= tol else (REGRESSION if mem_change > 0 else IMPROVEMENT)
        out.append(Delta(metric, num(va), num(vb), mem_change, verdict, f"band ±{tol:.0%}"))
    return out


def _mib(row: dict[str, Any]) -> float | None:
    b = num(row.get("model_state_bytes"))
    return None if b is None else b / 1024**2


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return format(v, ",.0f") if abs(v) >= 1000 else format(v, ".3g" if abs(v) < 10 else ".1f")


def render(result: Comparison, label_a: str, label_b: str) -> str:
    """A markdown table, one line per (configuration, metric), and the unmatched configurations."""
    lines = [f"A: {label_a}", f"B: {label_b}", "",
             "| cell | metric | A | B | change | verdict | noise |", "|---|---|---:|---:|---:|---|---|"]
    for m in sorted(result.matches, key=lambda m: m.name):
        name = m.name + (" (matched by name)" if m.by == "name" else "")
        for d in m.deltas:
            change = "-" if d.change is None else f"{d.change:+.1%}"
            verdict = f"**{d.verdict}**" if d.verdict == REGRESSION else d.verdict
            lines.append(f"| {_md(name)} | {d.metric} | {_fmt(d.a)} | {_fmt(d.b)} | {change} | {verdict} | "
                         f"{_md(d.note)} |")
    if result.only_a:
        lines += ["", "Only in A: " + ", ".join(_md(_name(r)) for r in result.only_a)]
    if result.only_b:
        lines += ["", "Only in B: " + ", ".join(_md(_name(r)) for r in result.only_b)]
    bad = result.regressions()
    lines += ["", f"{len(bad)} regression(s) beyond the threshold of {result.threshold:.0%}"
              + (": " + "; ".join(f"{m.name} {d.metric}" + (f" {d.change:+.1%}" if d.change is not None else
                                                                 f" ({d.note})") for m, d in bad) if bad else ".")]
    return "\n".join(lines)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

