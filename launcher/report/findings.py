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
from typing import Any

from contract import metrics
from contract.metrics import (
    ANATOMY_BACKWARD_MS,
    ANATOMY_COPIES_MS,
    ANATOMY_DATA_WAIT_MS,
    ANATOMY_FORWARD_MS,
    GPU_UTIL_MEAN,
    MODEL_STATE_BYTES,
    STEP_TIME_RANK_SPREAD,
)
from launcher.plan import traffic
from launcher.report import nodes
from launcher.report.comparisons import (
    AXES,
    STATE_TOLERANCE,
    comparison_bullets,
    comparison_table,
    comparisons,
    interference,
    noise_used,
    state_ratio,
    unclaimed_parts,
)
from launcher.report.comparisons import (
    answers as strategy_answers,
)
from launcher.report.explain import traffic_findings
from launcher.report.rows import NO_RESULT_YET, grouped, md_cell, no_result_yet, num, peak_memory_gib, series_labels
from launcher.report.stats import (
    INCONCLUSIVE,
    LOWER,
    MIN_EFFECT,
    SAME,
    Estimate,
    Floor,
    Looks,
    difference,
    estimate,
    t95,
)

MARGIN = 0.05  # the recommendation's "within 5% of the fastest"
TRAFFIC_TOLERANCE = traffic.TOLERANCE
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
    waiting: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for u in units:
        size = (str(u.get("model")), int(u.get("world_size") or 0))
        if estimate(u) is not None and not interference(u):
            by_size.setdefault(size, []).append(u)
        elif no_result_yet(u):
            waiting.setdefault(size, []).append(u)
    multi_model = len({m for m, _ in by_size}) > 1
    lines = []
    for (model, ws), members in sorted(by_size.items()):
        est = {id(u): _est(u, floor) for u in members}
        fastest = max(members, key=lambda u: est[id(u)].mean)
        ef = est[id(fastest)]
        where = f"{ws} rank(s)" + (f", {model}" if multi_model else "")
        if (model, ws) in waiting:
            # A contender that never ran may be the fastest: nothing is picked against it.
            lines.append(f"- **{where}**: withheld: " + ", ".join(
                f"{md_cell(_name(u))} has {NO_RESULT_YET} ({_why(u)})" for u in waiting[(model, ws)])
                + f"; fastest so far {md_cell(_name(fastest))} at {ef.mean:,.1f} samples/s. Run the sweep's command "
                "again to finish it.")
            continue
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
            return peak_memory_gib(u) or num(u.get(MODEL_STATE_BYTES)) or math.inf

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
    ratio = state_ratio(num(a.get(MODEL_STATE_BYTES)), num(b.get(MODEL_STATE_BYTES)))
    return ratio is not None and ratio < 1 - STATE_TOLERANCE


def stragglers(rows: list[dict[str, Any]]) -> list[str]:
    """Cells whose slowest rank ran more than 10% behind the median rank (the worker's ``straggler_rank``
    tag, from step times measured without gradient communication, where waiting hides nothing)."""
    out = []
    withheld = [row for row in rows if row.get("straggler_withheld")]
    if withheld:
        out.append(f"- Not judged in {len(withheld)} cell(s): {md_cell(withheld[0]['straggler_withheld'])}.")
    for row in rows:
        rank = row.get("straggler_rank")
        spread = row.get(STEP_TIME_RANK_SPREAD)
        if rank:
            how = f": {spread:.2f}x the median rank's step time" if isinstance(spread, (int, float)) else ""
            out.append(f"- {md_cell(row['cell'])}: rank {md_cell(rank)} is a straggler{how}. The whole job runs at its "
                       f"pace; look at that host (thermals, a noisy neighbour, a slow link).")
    return out


HOST_BOUND_UTIL = 75.0  # NVML's GPU busy percent below which the device waited for the host a large part of the window
_HOST_PARTS = ("anatomy_optimizer_ms", ANATOMY_DATA_WAIT_MS, ANATOMY_FORWARD_MS, ANATOMY_BACKWARD_MS,
               ANATOMY_COPIES_MS)


def host_bound(units: list[dict[str, Any]]) -> list[str]:
    """Configurations whose GPUs were idle for a large part of the measured window (NVML's
    ``gpu_util_mean`` below 75%): the step was host-bound, and the largest part of the profiled step
    (the anatomy: what the host was doing) is named as what kept the GPU waiting."""
    out = []
    for u in units:
        util = num(u.get(GPU_UTIL_MEAN))
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
    yet = [u for u in failed if no_result_yet(u)]
    failed = [u for u in failed if not no_result_yet(u)]
    if yet:
        lines.append(f"{NO_RESULT_YET.capitalize()}: " + ", ".join(f"{md_cell(u['cell'])} ({_why(u)})" for u in yet)
                     + ". Nothing is claimed or recommended against them.")
    if failed:
        lines.append("Left out (no result): " + ", ".join(f"{md_cell(u['cell'])} ({_why(u)})" for u in failed) + ".")
    if flagged:
        lines.append("⚠ Interference: " + "; ".join(f"{md_cell(u['cell'])}: {md_cell(interference(u))}" for u in flagged)
                     + ". Their comparisons are shown but not claimed, and they are not recommended.")
    if noiseless:
        lines.append(f"{len(noiseless)} configuration(s) ran once and this cluster has no noise floor: nothing is "
                     "claimed about them. Set runs=3 or more, or measure a noise floor "
                     "(docs/reading-the-report.md, A noise floor per cluster).")
    if yet or failed or flagged or noiseless:
        lines.append("")
    for axis, title in AXES.items():
        comps = comparisons(units, axis, floor, looks)
        lines += [f"### {title}", ""]
        if not comps:
            lines += [f"No two configurations differ only in their {axis} at the same world size.", ""]
            continue
        bullets = comparison_bullets(comps)
        lines += bullets or ["No throughput difference is claimed."]
        lines += unclaimed_parts(comps)
        lines += [""] + comparison_table(comps) + [""]
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


def answers(rows: list[dict[str, Any]], floor: Floor | None = None, looks: Looks | None = None) -> list[str]:
    """One plain line per strategy question of the sweep (comparisons.answers)."""
    return strategy_answers(comparisons(grouped(rows), "strategy", floor, looks or Looks.fixed()))


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
