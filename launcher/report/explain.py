"""Why two configurations differ: the difference in step time cut into the step's parts, what to
try next, and the bytes measured against the theory.

Pure functions over report rows (launcher/report/rows.py; a grouped row holds its runs in
``_members``). The parts are the step's anatomy (jobs/anatomy.py, contract.metrics.STEP_PARTS),
measured in the profiled probe after each run's window; they add up to the probe's step time, so
their differences add up to the difference of the probe's step times. Each part's difference has
Welch's 95% interval from the runs on both sides (launcher/report/stats.py, the verdicts' own
machinery); a part is named only where its interval excludes zero, or, without any noise estimate
(one run a side, no floor), where it carries at least a tenth of the difference. What the named
parts leave is stated as the remainder, with the unattributed part's own difference beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contract import metrics
from contract.metrics import (
    ANATOMY_BACKWARD_MS,
    ANATOMY_DATA_WAIT_MS,
    ANATOMY_FORWARD_MS,
    ANATOMY_UNATTRIBUTED_MS,
    STEP_TIME_MS_P50,
    THROUGHPUT_SAMPLES_PER_S,
)
from launcher.plan import traffic
from launcher.report.rows import grouped, num, settings
from launcher.report.stats import Estimate, Floor, estimate_of, welch_interval

STEP = metrics.ANATOMY_STEP
WINDOW_STEP = STEP_TIME_MS_P50
UNATTRIBUTED = ANATOMY_UNATTRIBUTED_MS
UNDECIDED_SHARE = 0.10  # without noise, a part is named from this share of the difference on


@dataclass
class Part:
    name: str  # a STEP_PARTS metric
    delta_ms: float
    low: float | None  # Welch's 95% interval of the difference (None: no noise estimate)
    high: float | None

    @property
    def beyond_noise(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


@dataclass
class Explanation:
    a_label: str
    b_label: str
    window_delta_ms: float | None  # A - B, the measured window's median step time
    probe_delta_ms: float  # A - B, the probe's step time: what the parts add up to
    named: list[Part]
    unattributed: Part | None
    remainder_ms: float  # probe_delta - named - unattributed: parts within the noise
    noise: bool  # whether the parts had intervals
    context: dict[str, str] = field(default_factory=dict)  # per part: bytes and bandwidth words
    next_step: str | None = None

    def text(self) -> str:
        """One sentence: "+40 ms per step; in the profiled probe +45 ms, of which ..."."""
        head = (f"{self.window_delta_ms:+.1f} ms per step in the window" if self.window_delta_ms is not None
                else "no window step time")
        parts = [f"{p.delta_ms:+.1f} ms {part_label(p.name)}" + (f" ({self.context[p.name]})" if p.name in
                                                                   self.context else "") for p in self.named]
        rest = [f"{self.remainder_ms:+.1f} ms in parts within the noise"] if abs(self.remainder_ms) >= 0.05 else []
        if self.unattributed is not None:
            rest.append(f"{self.unattributed.delta_ms:+.1f} ms unattributed")
        body = ", ".join(parts) if parts else "no part beyond the noise"
        out = f"{head}; in the profiled probe {self.probe_delta_ms:+.1f} ms, of which {body}"
        out += ("; " + ", ".join(rest)) if rest else ""
        if not self.noise:
            out += " (one run a side and no noise floor: parts named by size, not by their noise)"
        return out + "."


def part_label(name: str) -> str:
    """``comm_all_gather_exposed_ms`` -> "exposed all-gather"; ``anatomy_forward_ms`` -> "forward"."""
    if name.startswith("comm_") and name.endswith("_exposed_ms"):
        return "exposed " + name[len("comm_"):-len("_exposed_ms")].replace("_", "-")
    return name[len("anatomy_"):-len("_ms")].replace("_", " ")


def _values(row: dict[str, Any], name: str) -> list[float]:
    members = row.get("_members", [row])
    return [v for m in members if num(m.get(THROUGHPUT_SAMPLES_PER_S)) and (v := num(m.get(name))) is not None]


def part_estimate(row: dict[str, Any], name: str, floor: Floor | None) -> Estimate | None:
    """A part's estimate over the runs; a configuration run once borrows the floor's step-time noise."""
    return estimate_of(_values(row, name), floor.cv.get("step_time") if floor else None, floor.df if floor else 0)


def explain(a: dict[str, Any], b: dict[str, Any], a_label: str, b_label: str,
            floor: Floor | None = None) -> Explanation | None:
    """A's step against B's, part by part; None where either side has no anatomy."""
    ea, eb = part_estimate(a, STEP, floor), part_estimate(b, STEP, floor)
    if ea is None or eb is None:
        return None
    parts = [p for name in metrics.STEP_PARTS if (p := _part(a, b, name, floor)) is not None]
    noise = any(p.low is not None for p in parts)
    probe_delta = ea.mean - eb.mean
    unattributed = next((p for p in parts if p.name == UNATTRIBUTED), None)
    named = [p for p in parts if p.name != UNATTRIBUTED
             and (p.beyond_noise if noise else abs(p.delta_ms) >= UNDECIDED_SHARE * abs(probe_delta))]
    named.sort(key=lambda p: -abs(p.delta_ms))
    remainder = probe_delta - sum(p.delta_ms for p in named) - (unattributed.delta_ms if unattributed else 0.0)
    wa, wb = num(a.get(WINDOW_STEP)), num(b.get(WINDOW_STEP))
    out = Explanation(a_label, b_label, None if wa is None or wb is None else wa - wb, probe_delta, named,
                      unattributed, remainder, noise)
    out.context = {p.name: words for p in named if (words := comm_words(a, b, p.name, b_label))}
    out.next_step = next_step(a, named)
    return out


def _part(a: dict[str, Any], b: dict[str, Any], name: str, floor: Floor | None) -> Part | None:
    ea, eb = part_estimate(a, name, floor), part_estimate(b, name, floor)
    if ea is None and eb is None:
        return None
    zero = Estimate(0.0, 0.0, math.inf, 1, "none")
    ea, eb = ea or zero, eb or zero
    interval = welch_interval(ea, eb)
    low, high = interval if interval else (None, None)
    return Part(name, ea.mean - eb.mean, low, high)


def total_bytes(row: dict[str, Any]) -> float:
    return sum(num(row.get(metrics.comm_bytes(k))) or 0.0 for k in metrics.COLLECTIVE_KINDS)


def comm_words(a: dict[str, Any], b: dict[str, Any], part: str, b_label: str) -> str | None:
    """For an exposed-communication part: its bytes per step, their ratio to B's traffic, and the
    bus bandwidth achieved."""
    if not part.startswith("comm_"):
        return None
    kind = part[len("comm_"):-len("_exposed_ms")]
    moved = num(a.get(metrics.comm_bytes(kind)))
    if not moved:
        return None
    words = [f"{traffic.human_bytes(moved)} per step"]
    theirs = total_bytes(b)
    if theirs:
        words.append(f"{total_bytes(a) / theirs:.1f}× {b_label}'s bytes in all")
    busbw = num(a.get(f"comm_{kind}_busbw_gbps"))
    if busbw:
        words.append(f"at {busbw:.2g} GB/s bus bandwidth")
    return ", ".join(words)


# ---- what to try next ------------------------------------------------------------------------

def _setting(row: dict[str, Any], key: str) -> str | None:
    value = settings(row).get(key)
    return None if value is None else str(value)


def next_step(row: dict[str, Any], named: list[Part]) -> str | None:
    """From the largest named part that grew, the setting that attacks it and the follow-up sweep,
    which ``python -m launcher --plan`` accepts as printed."""
    grown = [p for p in named if p.delta_ms > 0]
    if not grown:
        return None
    part = grown[0].name
    strategy = str(row.get("strategy") or _setting(row, "strategy") or "")
    advice = _advice(part, strategy, row)
    if advice is None:
        return f"{part_label(part)} grew most; no setting of this tool attacks it directly."
    why, sweep = advice
    return f"{part_label(part)} grew most: {why}. Try: `{follow_up(row, sweep)}`"


def _advice(part: str, strategy: str, row: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    batch = num(row.get("batch_size")) or num(_setting(row, "batch_size")) or 8
    bigger = {"batch_size": f"{int(batch)},{int(batch) * 2}"}
    if part == "comm_all_gather_exposed_ms":
        if strategy == "fsdp":
            return ("keep parameters gathered after forward (zero2) or prefetch the next unit",
                    {"strategy": "fsdp,zero2", "strategy.prefetch": "0,1"})
        return "all-gather parameters in bf16 (half the bytes)", {"precision": "bf16", "precision.mode": "params"}
    if part == "comm_reduce_scatter_exposed_ms":
        return ("reduce gradients in bf16 (half the bytes)",
                {"precision": "bf16", "precision.mode": "params", "precision.reduce_dtype": "fp32,bf16"})
    if part in ("comm_all_reduce_exposed_ms", "comm_broadcast_exposed_ms", "comm_other_exposed_ms"):
        return "a larger batch per device gives backward more computation to hide the reduction behind", bigger
    if part in (ANATOMY_FORWARD_MS, ANATOMY_BACKWARD_MS) and _setting(row, "activation_checkpointing") == "true":
        return "activation checkpointing recomputes the forward in backward", {"activation_checkpointing": "true,false"}
    if part == ANATOMY_DATA_WAIT_MS:
        return "the input pipeline keeps the step waiting", {"data": "synthetic"}
    return None


_WHERE = ("output_root", "sweep_dir", "run", "seed", "runs", "tracking")


def follow_up(row: dict[str, Any], sweep: dict[str, str]) -> str:
    """``python -m launcher --plan -m`` with the row's own settings, the swept ones replaced."""
    own = {k: str(v) for k, v in settings(row).items()
           if not k.lstrip("+~").startswith(_WHERE) and v is not None and str(v) != "None"}
    own.update(sweep)
    return "python -m launcher --plan -m " + " ".join(f"{k}={v}" for k, v in own.items())


# ---- bytes against the theory ------------------------------------------------------------------

def traffic_findings(rows: list[dict[str, Any]]) -> list[str]:
    """Configurations whose measured bytes per step (the mean over their runs) are more than 10% from
    their strategy's theory: said once per configuration, not once per run."""
    out = []
    for row in grouped(rows):
        for kind in metrics.COLLECTIVE_KINDS:
            theory = num(row.get(metrics.predicted_comm_bytes(kind)))
            measured = num(row.get(metrics.comm_bytes(kind)))
            if theory is None and not measured:
                continue
            if theory is None:
                if measured and any(num(row.get(metrics.predicted_comm_bytes(k))) for k in metrics.COLLECTIVE_KINDS):
                    out.append(f"- {row['cell']}: {kind.replace('_', '-')} moved {traffic.human_bytes(measured)} per "
                               "step where the strategy's theory moves none.")
                continue
            off = traffic.mismatch(measured, theory)
            if off is not None and abs(off) > traffic.TOLERANCE:
                out.append(f"- {row['cell']}: {kind.replace('_', '-')} moved {traffic.human_bytes(measured or 0)} per "
                           f"step against {traffic.human_bytes(theory)} in theory ({off:+.0%}): a unit not wrapped, a "
                           "dtype not applied, or traffic the theory does not know (docs/reading-the-report.md).")
    return out
