"""Benchmarks that measured each other: cells whose allocations overlapped on a host, and cells whose
cores other processes used during the measured window.

Two sources, each enough to flag a cell:
- **Other cells of the sweep**: on Slurm, sacct's Start, End and NodeList of every cell's job; on the
  local cluster, each cell's first step and the time its result was written, on the hosts its
  ranks reported. Two cells that shared a host at the same time are both flagged.
- **Anything else**: the worker's ``foreign_cpu_share`` (CPU time on its cores that was not its
  ranks', over the measured window, from /proc) and, on GPUs, ``foreign_gpu_share``.

A flagged cell keeps its numbers, shows ``co-located`` in the report, gets the MLflow tag
``interference``, and the findings leave it out of their comparisons. ``launcher.status
--resubmit-flagged`` reruns such cells on whole nodes.
"""

from __future__ import annotations

from contract.metrics import FOREIGN_CPU_SHARE, FOREIGN_GPU_SHARE, MEASURED_STEPS, STEP_TIME_MS_P50
from launcher.cluster.backends import backend_for
from launcher.cluster.base import Allocation, JobTimes
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

# Above this share of its cores' time used by other processes, a cell's numbers are not its own.
FOREIGN_SHARE_LIMIT = 0.10
# Shorter measured windows are not judged by the share of their cores others used (see foreign_use).
MIN_WINDOW_S = 1.0
# Overlaps shorter than this are start/stop jitter of back-to-back jobs, not shared measurement.
MIN_OVERLAP_S = 1.0


def overlaps(allocations: list[Allocation], names: dict[int, str]) -> dict[int, str]:
    """{cell index: "co-located with <cell> on <host> (NN% of its run)"} for every cell that shared a
    host with another cell at the same time (the largest overlap is named)."""
    found: dict[int, tuple[float, str]] = {}
    for a in allocations:
        for b in allocations:
            if a.cell == b.cell:
                continue
            shared = a.hosts & b.hosts
            overlap_s = min(a.end_s, b.end_s) - max(a.start_s, b.start_s)
            if not shared or overlap_s < MIN_OVERLAP_S:
                continue
            share = overlap_s / max(a.end_s - a.start_s, 1e-9)
            text = f"co-located with [{names[b.cell]}] on {', '.join(sorted(shared))} ({share:.0%} of its run)"
            if share > found.get(a.cell, (0.0, ""))[0]:
                found[a.cell] = (share, text)
    return {cell: text for cell, (_, text) in found.items()}


def foreign_use(summary: dict) -> str | None:
    """The worker's own measurement of other processes on its cores or GPUs, when above the limit.

    Windows shorter than MIN_WINDOW_S are not judged: /proc counts in 10 ms ticks, and a process
    starting or a scheduler blip is a large share of a 0.2 s window (such cells are too short to
    compare anyway)."""
    steps, step_ms = summary.get(MEASURED_STEPS), summary.get(STEP_TIME_MS_P50)
    if isinstance(steps, (int, float)) and isinstance(step_ms, (int, float)) and steps * step_ms / 1e3 < MIN_WINDOW_S:
        return None
    parts = []
    for key, what in ((FOREIGN_CPU_SHARE, "its cores"), (FOREIGN_GPU_SHARE, "its GPUs")):
        share = summary.get(key)
        if isinstance(share, (int, float)) and share > FOREIGN_SHARE_LIMIT:
            parts.append(f"other processes used {share:.0%} of {what} during the measured window")
    return "; ".join(parts) or None


def _summary(state: SweepState, cell: Cell) -> dict:
    return state.read_result(cell).get("summary", {})


def flag(state: SweepState, times: JobTimes | None = None) -> list[Cell]:
    """Set ``interference`` on every finished cell that measured something else too; returns them.
    ``times``: the jobs' start, end and hosts when the caller has read them from sacct already."""
    done = [c for c in state.cells if c.status is CellStatus.done]
    allocations = backend_for(state.cluster).allocations(state, done, times)
    shared = overlaps(allocations, {c.index: c.name for c in state.cells})
    flagged = []
    for cell in done:
        reasons = [r for r in (shared.get(cell.index), foreign_use(_summary(state, cell))) if r]
        cell.interference = "; ".join(reasons) or None
        if cell.interference:
            flagged.append(cell)
    return flagged
