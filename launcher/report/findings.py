"""Findings: the decisions a sweep supports, stated with numbers and only where the noise allows.

Pure functions over report rows (launcher/report/rows.py); no I/O. The statistics are launcher/report/stats.py's:

* **Noise between runs.** Each configuration's throughput, step time and peak memory have a 95%
  interval from the spread between its independent runs (``runs``, separate launches), or from the
  cluster's noise floor where it ran once (launcher/report/noisefloor.py); windows inside one run never
  serve as the noise of a claim. Which noise each comparison used is in its row.
* **Verdicts.** A difference is claimed only when its interval excludes zero and the change is at
  least the minimum effect (5% for throughput, 3% for peak memory); "no change (within ±5%)" is
  claimed when equivalence is shown (TOST: the 90% interval lies wholly inside the margin);
  anything else is "inconclusive", with the runs per side that would decide it. In a ``runs=auto``
  sweep every throughput verdict is its first decided look (launcher/report/sequential.py) and says
  how many runs it used and why no more came.
* **Same world size.** Only cells of the same model and world size are compared; a cell on more
  devices is not better for having more of them (scaling efficiency answers that question).
* **Other settings equal.** Strategies are compared where everything but the strategy (and its
  ``strategy.*`` options) is equal; precisions likewise.
* **Model state** is counted exactly (bytes of parameters, gradients and optimizer state per
  rank), so differences under 1% are called equal without a noise model.
* **Failed cells** (diverged, cancelled, out of memory, ...) are listed and left out; a cell flagged
  ``interference`` (another job shared its devices or hosts) is listed, its comparisons are shown
  but not claimed, and it is never recommended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract import metrics
from launcher.plan import traffic
from launcher.report import nodes
from launcher.report.explain import Explanation, explain, traffic_findings
from launcher.report.rows import grouped, md_cell, num, peak_memory_gib, series_labels, settings
from launcher.report.stats import (
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    MIN_EFFECT,
    SAME,
    Diff,
    Estimate,
    Floor,
    Looks,
    difference,
    estimate,
    sequential_difference,
    stop_reason,
    t95,
)

MARGIN = 0.05  # the recommendation's "within 5% of the fastest"
TRAFFIC_TOLERANCE = traffic.TOLERANCE
# Model state is counted exactly: within the registry's band it is the same layout.
STATE_TOLERANCE: float = metrics.get("model_state_bytes").min_effect or 0.0
# Known choices in the order that makes the first one the baseline of a comparison.
_ORDER = {"strategy": ["ddp", "fsdp", "zero2", "hsdp", "fsdp_noshard", "fsdp_offload"],
          "precision": ["fp32", "bf16", "fp16"]}
AXES = {"strategy": "Strategies", "precision": "Precisions"}  # compared one at a time, the others equal
MAX_SHOWN = 60  # comparisons per axis in the markdown; the ones with a verdict come first


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
    peak: Diff | None  # peak memory A/B with its own between-run noise (None: not measured)
    state_ratio: float | None
    caveat: str | None  # why nothing is claimed beyond the numbers (failed, interference)
    noise: str = ""  # what the interval rests on, e.g. "3 + 3 runs" or "noise floor (...)"
    why: Explanation | None = None  # the difference cut into the step's parts (launcher/report/explain.py)
    looks: Looks = Looks.fixed()  # the sweep's planned looks (runs=auto: several)

    @property
    def claimed(self) -> bool:
        return self.caveat is None and self.throughput is not None and self.throughput.claimed

    @property
    def wrappers_only(self) -> bool:
        """Strategies at one rank: nothing to shard and nothing to communicate, so what differs is the
        wrapper (its hooks, its parameter type, its optimizer step), never the strategy."""
        return self.axis == "strategy" and self.world_size == 1

    @property
    def peak_ratio(self) -> float | None:
        return None if self.peak is None else self.peak.ratio


def _words(row: dict[str, Any]) -> list[str]:
    return [w for w in str(row.get("cell", "")).split() if "=" in w]


def _axis_of(key: str, axis: str) -> bool:
    return key == axis or key.startswith(axis + ".")


def interference(row: dict[str, Any]) -> str | None:
    """What else a configuration's runs measured (the first flagged run's reason), or None."""
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


def comparisons(units: list[dict[str, Any]], axis: str, floor: Floor | None = None,
                looks: Looks | None = None) -> list[Comparison]:
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
                out.append(_compare(axis, a, b, floor, looks or Looks.fixed()))
    out.sort(key=lambda c: (str(c.model), c.world_size or 0, c.context, c.b_label, c.a_label))
    return out


def noise_used(ea: Estimate | None, eb: Estimate | None, floor: Floor | None) -> str:
    """What a comparison's interval rests on: "3 + 3 runs", the noise floor, or nothing."""
    if ea is None or eb is None:
        return "-"
    if ea.source == eb.source == "runs":
        return f"{ea.n} + {eb.n} runs"
    if "none" in (ea.source, eb.source):
        return "none (1 run, no noise floor)"
    return f"{ea.n} + {eb.n} runs, noise floor ({floor.where})" if floor else f"{ea.n} + {eb.n} runs"


def _compare(axis: str, a: dict[str, Any], b: dict[str, Any], floor: Floor | None, looks: Looks) -> Comparison:
    ea, eb = estimate(a, "throughput", floor), estimate(b, "throughput", floor)
    caveat = None
    for side, e in ((a, ea), (b, eb)):
        if e is None:
            caveat = f"{_label(side, axis)} has no result ({side.get('status')})"
        elif interference(side):
            caveat = f"{_label(side, axis)} flagged interference: {interference(side)}"
    context = " ".join(w for w in _words(a) if not _axis_of(w.split("=", 1)[0].lstrip("+~"), axis)
                       and not w.startswith(("nodes=", "seed=", "run=")))
    pa, pb = estimate(a, "peak_memory", floor), estimate(b, "peak_memory", floor)
    return Comparison(
        axis=axis, model=str(a.get("model")), world_size=int(a.get("world_size") or 0), context=context,
        a=a, b=b, a_label=_label(a, axis), b_label=_label(b, axis),
        throughput=sequential_difference(a, b, "throughput", MIN_EFFECT["throughput"], looks, floor)
        if ea and eb else None,
        peak=sequential_difference(a, b, "peak_memory", MIN_EFFECT["peak_memory"], looks, floor) if pa and pb else None,
        state_ratio=_ratio(num(a.get("model_state_bytes")), num(b.get("model_state_bytes"))),
        caveat=caveat, noise=noise_used(ea, eb, floor), why=explain(a, b, _label(a, axis), _label(b, axis), floor),
        looks=looks)


# ---- wording --------------------------------------------------------------------------------------

def throughput_text(d: Diff | None) -> str:
    if d is None:
        return "-"
    if d.low is None or d.high is None:
        return f"{d.ratio:.2f}×"
    return f"{d.ratio:.2f}× ({d.low:.2f}–{d.high:.2f})"


def verdict_text(c: Comparison) -> str:
    d = c.throughput
    if d is None or c.caveat:
        return f"not claimed: {c.caveat}" + (sequence_text(d, c.looks) if d is not None else "")
    words = _verdict_words(c.a_label, d) + sequence_text(d, c.looks)
    return words + (" (one rank: the wrappers' cost, not a strategy result)" if c.wrappers_only else "")


def _verdict_words(a_label: str, d: Diff) -> str:
    if d.verdict == SAME:
        return f"no change (within ±{d.min_effect:.0%})"
    if d.verdict == INCONCLUSIVE:
        return f"inconclusive: {d.why_inconclusive()}"
    pct = abs(d.ratio - 1)
    return f"**{a_label} {pct:.1%} {'faster' if d.verdict == HIGHER else 'slower'}**"


def sequence_text(d: Diff, looks: Looks, flip: bool = False) -> str:
    """In a runs=auto sweep: the runs the verdict used, at which look, and why no more came (empty
    for fixed runs); ``flip``: the runs listed B first (a comparison of B against A)."""
    if not looks.sequential:
        return ""
    return f" [{d.runs_text(flip)}; {stop_reason(d, looks) or 'open: the next round adds runs'}]"


def memory_text(d: Diff | None) -> str:
    """Peak memory A/B with its verdict from the runs' own spread."""
    if d is None:
        return "-"
    if d.verdict == SAME:
        return f"{d.ratio:.2f}× (equal)"
    if d.verdict == INCONCLUSIVE:
        return f"{d.ratio:.2f}× (inconclusive)"
    return f"{d.ratio:.2f}× ({abs(1 - d.ratio):.0%} {'less' if d.verdict == LOWER else 'more'})"


def state_text(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if abs(ratio - 1) <= STATE_TOLERANCE:
        return f"{ratio:.2f}× (equal)"
    return f"{ratio:.2f}× ({abs(1 - ratio):.0%} {'less' if ratio < 1 else 'more'})"


def _table(comps: list[Comparison]) -> list[str]:
    lines = ["| ranks | other settings | A vs B | throughput A/B (95% CI) | verdict | noise | peak mem A/B | "
             "model state A/B |", "|---:|---|---|---:|---|---|---:|---:|"]
    shown = sorted(comps, key=lambda c: not c.claimed)[:MAX_SHOWN]
    for c in [c for c in comps if c in shown]:
        lines.append(f"| {c.world_size} | {md_cell(c.context or '-')} | {md_cell(c.a_label)} vs {md_cell(c.b_label)} | "
                     f"{throughput_text(c.throughput)} | {md_cell(verdict_text(c))} | {md_cell(c.noise)} | "
                     f"{memory_text(c.peak)} | {state_text(c.state_ratio)} |")
    if len(comps) > len(shown):
        lines.append("")
        lines.append(f"{len(comps) - len(shown)} more comparison(s) without a claim are not shown.")
    return lines


def _bullets(comps: list[Comparison]) -> list[str]:
    """One sentence per claimed throughput difference, with memory and model state beside it."""
    out = []
    for c in comps:
        if not c.claimed or c.throughput is None:
            continue
        d = c.throughput
        mem = []
        if c.peak is not None and c.peak.claimed:
            mem.append(f"{abs(1 - c.peak.ratio):.0%} {'less' if c.peak.verdict == LOWER else 'more'} peak memory")
        if c.state_ratio is not None and abs(c.state_ratio - 1) > STATE_TOLERANCE:
            mem.append(f"{c.state_ratio:.2f}× the model state per rank")
        where = f"{c.world_size} rank(s)" + (f", {c.context}" if c.context else "")
        if c.wrappers_only:
            out.append(wrappers_sentence(c, where))
            out += why_lines(c.why)
            continue
        out.append(f"- {where}: **{c.a_label}** is {abs(d.ratio - 1):.1%} "
                   f"{'faster' if d.verdict == HIGHER else 'slower'} than **{c.b_label}** "
                   f"({d.ratio:.2f}×, {1 - d.alpha:.0%} CI {d.low:.2f}–{d.high:.2f}; {c.noise}"
                   f"{', ' + str(stop_reason(d, c.looks)) if c.looks.sequential else ''})"
                   + (f", with {' and '.join(mem)}" if mem else "") + ".")
        out += why_lines(c.why)
    return out


def wrappers_sentence(c: Comparison, where: str) -> str:
    """The one-rank strategy comparison, worded as what it is: the wrappers' cost, not a strategy result."""
    d = c.throughput
    assert d is not None
    if d.verdict == SAME:
        cost = f"their wrappers cost the same (within ±{d.min_effect:.0%})"
    else:
        cost = (f"{c.a_label}'s wrapper makes the step {abs(d.ratio - 1):.1%} "
                f"{'faster' if d.verdict == HIGHER else 'slower'} than {c.b_label}'s")
    interval = f" ({d.ratio:.2f}×, {1 - d.alpha:.0%} CI {d.low:.2f}–{d.high:.2f}; {c.noise})" if (
        d.low is not None and d.high is not None) else ""
    return (f"- {where}: **{c.a_label}** against **{c.b_label}**: at one rank nothing is sharded and nothing is "
            f"communicated, so the two differ only in their wrappers; {cost}{interval}. This is not a strategy "
            "result: compare strategies at two ranks or more.")


def _unclaimed_parts(comps: list[Comparison]) -> list[str]:
    """The parts of each difference that is shown but not claimed (interference, noise): the step
    times still differ by something, and its parts say where, with the same noise rules."""
    out = []
    for c in comps:
        if c.claimed or c.why is None:
            continue
        where = f"{c.world_size} rank(s)" + (f", {c.context}" if c.context else "")
        reason = verdict_text(c).removeprefix("not claimed: ")
        out += [f"- {where}: {c.a_label} against {c.b_label}, not claimed ({md_cell(reason)}):",
                *why_lines(c.why)]
    return ([""] + out) if out else []


def why_lines(why: Explanation | None) -> list[str]:
    """The explanation of a claimed difference and what to try next, as indented bullet lines."""
    if why is None:
        return ["  - Why: not measured (no anatomy: comm_probe_steps=0, or runs from before the anatomy ran at one "
                "rank)."]
    lines = [f"  - Why: {why.text()}"]
    if why.next_step:
        lines.append(f"  - Next: {why.next_step}")
    return lines


def scaling(units: list[dict[str, Any]], floor: Floor | None = None) -> list[str]:
    """Scaling efficiency per series: per-device throughput over the smallest world size's."""
    series: dict[str, list[dict[str, Any]]] = {}
    for u in units:
        if estimate(u) is not None and not interference(u):
            series.setdefault(str(u.get("series")), []).append(u)
    labels = series_labels([u for members in series.values() for u in members])
    lines = []
    for key, members in sorted(series.items(), key=lambda kv: labels.get(kv[0], kv[0])):
        if len({u.get("world_size") for u in members}) < 2:
            continue
        members.sort(key=lambda u: u.get("world_size") or 0)
        base = members[0]
        eb = estimate(base, "throughput", floor)
        parts = []
        for u in members[1:]:
            eu = estimate(u, "throughput", floor)
            if eu is None or eb is None:
                continue
            eff = (eu.mean / u["world_size"]) / (eb.mean / base["world_size"])
            text = f"{u['world_size']} ranks {eff:.0%}"
            if eu.se is not None and eb.se is not None and eu.df and eb.df:
                rel = math.sqrt((eu.se / eu.mean) ** 2 + (eb.se / eb.mean) ** 2)
                text += f" (±{t95(min(eu.df, eb.df)) * rel * eff:.0%}, {noise_used(eu, eb, floor)})"
            else:
                text += " (no noise estimate)"
            parts.append(text)
        if parts:
            lines.append(f"- {md_cell(labels.get(key, key))}: against {base['world_size']} rank(s), "
                         + ", ".join(parts) + ".")
    return lines


def recommendations(units: list[dict[str, Any]], margin: float = MARGIN, floor: Floor | None = None) -> list[str]:
    """Per model and world size: the fastest configuration, and the one with the least peak memory
    (model state where no peak was measured) among those within ``margin`` of the fastest or not
    measurably slower than it (a configuration inside the noise of the fastest is as good a pick)."""
    by_size: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for u in units:
        if estimate(u) is not None and not interference(u):
            by_size.setdefault((str(u.get("model")), int(u.get("world_size") or 0)), []).append(u)
    multi_model = len({m for m, _ in by_size}) > 1
    lines = []
    for (model, ws), members in sorted(by_size.items()):
        est = {id(u): _est(u, floor) for u in members}
        fastest = max(members, key=lambda u: est[id(u)].mean)
        ef = est[id(fastest)]
        where = f"{ws} rank(s)" + (f", {model}" if multi_model else "")
        text = f"- **{where}**: fastest **{md_cell(_name(fastest))}** at {ef.mean:,.1f} samples/s"
        if ws == 1 and len({u.get("strategy") for u in members}) > 1:
            text += " (one rank: strategies differ here only in their wrappers)"
        if ef.half_width is not None:
            text += f" (±{ef.half_width / ef.mean:.1%})"
        verdicts = {id(u): difference(est[id(u)], ef, MIN_EFFECT["throughput"]).verdict
                    for u in members if u is not fastest}
        same = [u for u in members if verdicts.get(id(u)) == SAME]
        undecided = [u for u in members if verdicts.get(id(u)) == INCONCLUSIVE]
        if same:
            text += "; not measurably faster than " + ", ".join(md_cell(_name(u)) for u in same)
        if undecided:
            text += "; inconclusive against " + ", ".join(md_cell(_name(u)) for u in undecided)
        text += "."
        near = [u for u in members if est[id(u)].mean >= (1 - margin) * ef.mean or u in same]
        within = f"within {margin:.0%} of it or not measurably slower" if same else f"within {margin:.0%} of it"

        def memory(u: dict[str, Any]) -> float:
            return peak_memory_gib(u) or num(u.get("model_state_bytes")) or math.inf

        lean = min(near, key=lambda u: (memory(u), -est[id(u)].mean))
        if len(near) == 1:
            # An inconclusive rival may still be as fast: only a decided field is "not within".
            text += "" if undecided else f" No other configuration comes within {margin:.0%} of it."
        elif lean is fastest or not _less_memory(lean, fastest, floor):
            text += f" Of the {len(near) - 1} other(s) {within}, none uses measurably less memory."
        else:
            el = est[id(lean)]
            pm_l, pm_f = peak_memory_gib(lean), peak_memory_gib(fastest)
            mem = (f"peak {pm_l:.2f} GiB against {pm_f:.2f} GiB" if pm_l is not None and pm_f is not None
                   else "less model state per rank")
            text += (f" Most memory-efficient {within}: **{md_cell(_name(lean))}** ({mem}, "
                     f"{el.mean / ef.mean:.0%} of the fastest's throughput).")
        lines.append(text)
    return lines


def _less_memory(a: dict[str, Any], b: dict[str, Any], floor: Floor | None) -> bool:
    """Whether ``a`` uses measurably less memory than ``b``: a peak lower beyond its own noise, or
    (no peak measured) an exactly counted model state more than 1% smaller."""
    pa, pb = estimate(a, "peak_memory", floor), estimate(b, "peak_memory", floor)
    if pa is not None and pb is not None:
        return difference(pa, pb, MIN_EFFECT["peak_memory"]).verdict == LOWER
    ratio = _ratio(num(a.get("model_state_bytes")), num(b.get("model_state_bytes")))
    return ratio is not None and ratio < 1 - STATE_TOLERANCE


def stragglers(rows: list[dict[str, Any]]) -> list[str]:
    """Cells whose slowest rank ran more than 10% behind the median rank (the worker's ``straggler_rank``
    tag, from step times measured without gradient communication, where waiting hides nothing)."""
    out = []
    for row in rows:
        rank = row.get("straggler_rank")
        spread = row.get("step_time_rank_spread")
        if rank:
            how = f": {spread:.2f}x the median rank's step time" if isinstance(spread, (int, float)) else ""
            out.append(f"- {md_cell(row['cell'])}: rank {md_cell(rank)} is a straggler{how}. The whole job runs at its "
                       f"pace; look at that host (thermals, a noisy neighbour, a slow link).")
    return out


HOST_BOUND_UTIL = 75.0  # NVML's GPU busy percent below which the device waited for the host a large part of the window
_HOST_PARTS = ("anatomy_optimizer_ms", "anatomy_data_wait_ms", "anatomy_forward_ms", "anatomy_backward_ms",
               "anatomy_copies_ms")


def host_bound(units: list[dict[str, Any]]) -> list[str]:
    """Configurations whose GPUs were idle for a large part of the measured window (NVML's
    ``gpu_util_mean`` below 75%): the step was host-bound, and the largest part of the profiled step
    (the anatomy: what the host was doing) is named as what kept the GPU waiting."""
    out = []
    for u in units:
        util = num(u.get("gpu_util_mean"))
        if util is None or util >= HOST_BOUND_UTIL:
            continue
        text = (f"- {md_cell(u['cell'])}: the step was host-bound: the GPU was busy {util:.0f}% of the measured window "
                f"(NVML), idle the rest")
        step = num(u.get(metrics.ANATOMY_STEP))
        parts = [(p, v) for p in _HOST_PARTS if (v := num(u.get(p)))]
        if step and parts:
            part, ms = max(parts, key=lambda pv: pv[1])
            text += (f"; what kept it waiting: the {part.removeprefix('anatomy_').removesuffix('_ms').replace('_', ' ')}, "
                     f"{ms:.1f} of the profiled step's {step:.1f} ms on the host")
            if part == "anatomy_optimizer_ms" and u.get("tuning.optimizer_impl") not in (None, "fused"):
                text += " (an unfused optimizer: optimizer_impl=fused steps every parameter in one kernel)"
        else:
            text += "; no anatomy to name the part (comm_probe_steps=0)"
        out.append(text + ".")
    return out


def _est(row: dict[str, Any], floor: Floor | None = None) -> Estimate:
    e = estimate(row, "throughput", floor)
    if e is None:
        raise ValueError(f"{row.get('cell')} has no result")
    return e


def _name(row: dict[str, Any]) -> str:
    # The configuration's words, without the node count and the grouped row's "(3 runs)".
    words = [w for w in str(row.get("cell", "")).split(" (")[0].split() if not w.startswith("nodes=")]
    return " ".join(words) or f"{row.get('strategy')} {row.get('precision')}"


def findings(rows: list[dict[str, Any]], margin: float = MARGIN, floor: Floor | None = None,
             looks: Looks | None = None) -> str:
    """The ``## Findings`` section's body (markdown), from report rows; ``looks``: a runs=auto
    sweep's planned looks (each row's ``round`` says which look first saw it)."""
    units = grouped(rows)
    looks = looks or Looks.fixed()
    lines = ["Only cells of the same model and world size are compared, with every other setting equal. A "
             "difference is claimed only when the 95% confidence interval of the difference, built from the spread "
             "between independent runs (or the cluster's noise floor for a configuration run once), excludes zero "
             f"and the change is at least {MIN_EFFECT['throughput']:.0%} (throughput) or "
             f"{MIN_EFFECT['peak_memory']:.0%} (peak memory); \"no change\" is claimed when equivalence is shown "
             "(two one-sided tests: the 90% interval lies wholly inside that margin), else \"inconclusive\" with the "
             "runs that would decide it. Windows inside one run are never the noise of a claim. Model state is "
             f"counted exactly: differences under {STATE_TOLERANCE:.0%} count as equal."
             + (f" This sweep ran with runs=auto: {looks.text()}; each verdict is its first decided look, so "
                "false claims stay at 5% over all looks." if looks.sequential else ""), ""]
    failed = [u for u in units if estimate(u) is None]
    flagged = [u for u in units if interference(u)]
    noiseless = [u for u in units if (e := estimate(u, "throughput", floor)) is not None and e.se is None]
    if failed:
        lines.append("Left out (no result): " + ", ".join(f"{md_cell(u['cell'])} ({_why(u)})" for u in failed) + ".")
    if flagged:
        lines.append("⚠ Interference: " + "; ".join(f"{md_cell(u['cell'])}: {md_cell(interference(u))}" for u in flagged)
                     + ". Their comparisons are shown but not claimed, and they are not recommended.")
    if noiseless:
        lines.append(f"{len(noiseless)} configuration(s) ran once and this cluster has no noise floor: nothing is "
                     "claimed about them. Set runs=3 or more, or measure a noise floor "
                     "(docs/reading-the-report.md, A noise floor per cluster).")
    if failed or flagged or noiseless:
        lines.append("")
    for axis, title in AXES.items():
        comps = comparisons(units, axis, floor, looks)
        lines += [f"### {title}", ""]
        if not comps:
            lines += [f"No two configurations differ only in their {axis} at the same world size.", ""]
            continue
        bullets = _bullets(comps)
        lines += bullets or ["No throughput difference is claimed."]
        lines += _unclaimed_parts(comps)
        lines += [""] + _table(comps) + [""]
    lines += ["### Scaling efficiency", ""]
    lines += scaling(units, floor) or [_none_left(units, "No series was measured at more than one world size.")]
    lines += ["", "### Bytes against the theory", ""]
    lines += traffic_findings(rows) or [f"Every measured collective moved within {TRAFFIC_TOLERANCE:.0%} of the bytes its "
                                        "strategy implies (launcher/plan/traffic.py), or nothing was measured."]
    lines += ["", "### Stragglers", ""]
    lines += stragglers(rows) or ["No rank lagged more than 10% behind the median rank."]
    waiting = host_bound(units)
    if waiting:
        lines += ["", "### Host-bound steps", "", *waiting]
    on_nodes = nodes.section(rows)
    if on_nodes:
        lines += ["", "### Nodes", "", *on_nodes]
    lines += ["", f"### Recommendation (margin {margin:.0%})", ""]
    lines += recommendations(units, margin, floor) or [_none_left(units, "No cell finished with a result.")]
    return "\n".join(lines).rstrip() + "\n"


def _none_left(units: list[dict[str, Any]], otherwise: str) -> str:
    """Why a section has nothing to say, in the words of what happened: every configuration with a
    result was flagged for interference, or none had a result (and why), else ``otherwise``."""
    measured = [u for u in units if estimate(u) is not None]
    if measured and all(interference(u) for u in measured):
        failed = len(units) - len(measured)
        return (f"Every configuration with a result was flagged for interference ({len(measured)} of {len(units)}"
                + (f"; {failed} without a result" if failed else "") + "): nothing is claimed or recommended. Rerun "
                "them on whole nodes (python -m launcher.status SWEEP --resubmit-flagged) or on a quiet machine.")
    if units and not measured:
        why = sorted({_why(u) for u in units})
        return f"No configuration has a result: every run ended without one ({'; '.join(why[:4])})."
    return otherwise


def _why(unit: dict[str, Any]) -> str:
    """Why a configuration has no result: its status and failure classes, over its runs."""
    members = unit.get("_members", [unit])
    classes = sorted({str(m.get("failure_class")) for m in members if m.get("failure_class")})
    return ", ".join([str(unit.get("status")), *classes])
