"""A comparison of two sweeps in words: the table, one line per (configuration, metric), the pairs not
compared, and the summary lines (regressions, configurations not claimed, what would decide the
inconclusive rows, how false claims are controlled). launcher/report/compare.py decides; this
module only writes."""

from __future__ import annotations

from launcher.report.compare import FAMILY_METHOD, NO_CHANGE, NOT_CLAIMED, REGRESSION, Comparison, row_name
from launcher.report.comparisons import why_lines
from launcher.report.rows import md_cell


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return format(v, ",.0f") if abs(v) >= 1000 else format(v, ".3g" if abs(v) < 10 else ".1f")



def render(result: Comparison, label_a: str, label_b: str) -> str:
    """A markdown table, one line per (configuration, metric), and the unmatched configurations."""
    lines = [f"A: {label_a}", f"B: {label_b}", "",
             "| cell | metric | A | B | change | verdict | noise |", "|---|---|---:|---:|---:|---|---|"]
    for m in sorted(result.matches, key=lambda m: m.name):
        name = m.name + (f" (matched by name; differs in {', '.join(m.differs)}: the setting under test)"
                         if m.by == "name" and m.differs else " (matched by name)" if m.by == "name" else "")
        for d in m.deltas:
            change = "-" if d.change is None else f"{d.change:+.1%}"
            verdict = f"**{d.verdict}**" if d.verdict == REGRESSION else d.verdict
            verdict += f" (within ±{d.margin:.0%})" if d.verdict == NO_CHANGE and d.margin else ""
            lines.append(f"| {md_cell(name)} | {d.metric} | {_fmt(d.a)} | {_fmt(d.b)} | {change} | {verdict} | "
                         f"{md_cell(d.note)} |")
    if result.not_compared:
        lines += ["", f"Not compared ({len(result.not_compared)} pair(s): no claim, never a pass of the gate):"]
        lines += [f"- {md_cell(m.name)}: {m.why_not}" for m in sorted(result.not_compared, key=lambda m: m.name)]
    if result.running:
        lines += ["", f"{result.running} cell(s) have not ended: only configurations whose runs have all ended are "
                  "compared; compare again once the sweep has ended."]
    if result.only_a:
        lines += ["", "Only in A: " + ", ".join(md_cell(row_name(r)) for r in result.only_a)]
    if result.only_b:
        lines += ["", "Only in B: " + ", ".join(md_cell(row_name(r)) for r in result.only_b)]
    explained = [m for m in sorted(result.matches, key=lambda m: m.name) if m.changed]
    if explained:
        lines += ["", "Why (B against A, the step's parts from each run's profiled probe):"]
        for m in explained:
            lines += [f"- {md_cell(m.name)}:", *why_lines(m.why)]
    lines += ["", family_text(result)]
    bad = result.regressions()
    lines += ["", f"{len(bad)} regression(s) beyond the noise and the threshold of {result.threshold:.0%}"
              + (": " + "; ".join(f"{m.name} {d.metric}" + (f" {d.change:+.1%}" if d.change is not None else
                                                                 f" ({d.note})") for m, d in bad) if bad else ".")]
    unclaimed = sorted({m.name for m in result.matches for d in m.deltas if d.verdict == NOT_CLAIMED})
    if unclaimed:
        lines.append(f"{len(unclaimed)} configuration(s) not claimed, flagged for interference (their speed is "
                     f"the machine's): {', '.join(md_cell(n) for n in unclaimed)}.")
    undecided = result.inconclusive()
    if undecided:
        noiseless = sum(1 for _, d in undecided if d.note.startswith("no noise estimate"))
        drifting = sum(1 for _, d in undecided if d.undecidable and not d.note.startswith("no noise estimate"))
        needed = [d.runs_needed for _, d in undecided if not d.note.startswith("no noise estimate") and not d.undecidable]
        parts = []
        if noiseless:
            parts.append(f"{noiseless} without a noise estimate (one run per side): set runs=3 or more, or measure "
                         "a noise floor on this cluster")
        if drifting:
            parts.append(f"{drifting} that no number of runs would decide (cannot decide: the drift between sweeps, "
                         "or a baseline's spread, is wider than the change; record A/A pairs: --record-drift)")
        if needed:
            parts.append(f"{len(needed)} inside the noise between runs: "
                         + (f"about {max(n for n in needed if n)} runs per side would decide them"
                            if all(needed) else "some would need more runs than is practical"))
        lines.append(f"{len(undecided)} inconclusive: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def family_text(result: Comparison) -> str:
    """How the comparison controls its false claims, and what noise it judges against."""
    family = (f"False claims controlled over the family of {result.family} judged row(s) ({FAMILY_METHOD}): each row "
              f"at {result.row_alpha:.3%}, {result.alpha:.0%} for the whole comparison."
              if result.family else "No row could be judged.")
    drift = f" Sweep-to-sweep drift in the noise: {result.drift.text()}." if result.drift else ""
    if result.drift and not result.drift.recorded:
        drift += " Record it from A/A pairs (two sweeps of one command, one after the other: --compare A B --record-drift)."
    return family + drift
