"""The pairs a sweep compares: which cells are compared with which (one axis at a time, the other
settings equal, the same model and world size), each pair's verdicts on throughput, step time,
memory and model state with the noise it used (launcher/report/stats.py), and their words: the
table and bullets of the findings (launcher/report/findings.py), read by runs=auto's looks
(launcher/decide.py) and by the comparison of sweeps (launcher/report/compare.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract import metrics
from contract.metrics import MODEL_STATE_BYTES
from launcher.report.explain import Explanation, explain
from launcher.report.rows import NO_RESULT_YET, md_cell, no_result_yet, num, settings
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
    estimate,
    sequential_difference,
    stop_reason,
)

# Model state is counted exactly: within the registry's band it is the same layout.
STATE_TOLERANCE: float = metrics.get(MODEL_STATE_BYTES).min_effect or 0.0
# Known choices in the order that makes the first one the baseline of a comparison.
_ORDER = {"strategy": ["ddp", "fsdp", "zero2", "hsdp", "fsdp_noshard", "fsdp+offload"],
          "precision": ["fp32", "bf16", "fp16"]}
AXES = {"strategy": "Strategies", "precision": "Precisions"}  # compared one at a time, the others equal
MAX_SHOWN = 60  # comparisons per axis in the markdown; the ones with a verdict come first


def state_ratio(a: float | None, b: float | None) -> float | None:
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
            caveat = f"{_label(side, axis)} has {NO_RESULT_YET if no_result_yet(side) else 'no result'} ({side.get('status')})"
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
        state_ratio=state_ratio(num(a.get(MODEL_STATE_BYTES)), num(b.get(MODEL_STATE_BYTES))),
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
    words = _verdict_words(c.a_label, d) + sequence_text(d, c.looks, followed=not c.wrappers_only)
    return words + (_WRAPPERS_ONLY if c.wrappers_only else "")


_WRAPPERS_ONLY = " (one rank: the wrappers' cost, not a strategy result)"


def _verdict_words(a_label: str, d: Diff) -> str:
    if d.verdict == SAME:
        return f"no change (within ±{d.min_effect:.0%})"
    if d.verdict == INCONCLUSIVE:
        return f"inconclusive: {d.why_inconclusive()}"
    pct = abs(d.ratio - 1)
    return f"**{a_label} {pct:.1%} {'faster' if d.verdict == HIGHER else 'slower'}**"


def sequence_text(d: Diff, looks: Looks, flip: bool = False, followed: bool = True) -> str:
    """In a runs=auto sweep: the runs the verdict used, at which look, and why no more came (empty
    for fixed runs); ``flip``: the runs listed B first (a comparison of B against A); ``followed``:
    False for a pair no round adds runs to (strategies at one rank, launcher/decide.py)."""
    if not looks.sequential:
        return ""
    if not followed:  # its runs are those other comparisons asked for: no stop of its own to name
        why = "decided" if d.decided else "not followed: no round adds runs at one rank"
    else:
        why = stop_reason(d, looks) or "open: the next round adds runs"
    return f" [{d.runs_text(flip)}; {why}]"


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


def comparison_table(comps: list[Comparison]) -> list[str]:
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


def comparison_bullets(comps: list[Comparison]) -> list[str]:
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


def answers(comps: list[Comparison]) -> list[str]:
    """One plain line per strategy question (each world size, and each other setting swept beside
    it), the verdict first: "2 ranks: ddp faster, fsdp 25.1% slower (0.75×, 95% CI 0.68–0.82; 3 + 3
    runs, decided)"; "1 rank: not a strategy question ...". The same words as the findings'."""
    out = []
    for c in comps:
        if c.axis != "strategy":
            continue
        where = f"{c.world_size} rank{'s' if c.world_size != 1 else ''}" + (f", {c.context}" if c.context else "")
        pair = f"{c.a_label} against {c.b_label}"
        d = c.throughput
        if c.wrappers_only:
            out.append(f"{where}: not a strategy question (nothing is sharded or sent at one rank: {pair} is the "
                       "wrappers' cost)")
        elif c.caveat or d is None:
            out.append(f"{where}: {pair} not claimed: {c.caveat}")
        elif d.verdict == SAME:
            out.append(f"{where}: no change between {c.a_label} and {c.b_label} (within ±{d.min_effect:.0%}; "
                       f"{c.noise}{_stop(c)})")
        elif d.verdict == INCONCLUSIVE:
            out.append(f"{where}: {pair} undecided ({d.why_inconclusive()}; {c.noise}{_stop(c)})")
        else:
            fast, slow = (c.a_label, c.b_label) if d.verdict == HIGHER else (c.b_label, c.a_label)
            out.append(f"{where}: {fast} faster, {slow} "
                       f"{abs(d.ratio - 1) if slow == c.a_label else abs(1 / d.ratio - 1):.1%} slower "
                       f"({c.a_label}/{c.b_label} {d.ratio:.2f}×, {1 - d.alpha:.0%} CI {d.low:.2f}–{d.high:.2f}; "
                       f"{c.noise}{_stop(c)})")
    return out


def _stop(c: Comparison) -> str:
    d = c.throughput
    return f", {stop_reason(d, c.looks)}" if d is not None and c.looks.sequential else ""


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


def unclaimed_parts(comps: list[Comparison]) -> list[str]:
    """The parts of each difference that is shown but not claimed (interference, noise): the step
    times still differ by something, and its parts say where, with the same noise rules."""
    out = []
    for c in comps:
        if c.claimed or c.why is None:
            continue
        where = f"{c.world_size} rank(s)" + (f", {c.context}" if c.context else "")
        reason = verdict_text(c).removeprefix("not claimed: ").removesuffix(_WRAPPERS_ONLY)
        reason += "; one rank: the wrappers' cost, not a strategy result" if c.wrappers_only else ""
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
