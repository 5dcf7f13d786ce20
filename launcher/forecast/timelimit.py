"""``cluster.timeout_min=auto``: each cell asks for the time it needs, not the grid's one limit.

A scheduler plans with the time a job asks for (Slurm's backfill fits short jobs into gaps before
larger ones): a cell asking for an hour it uses a minute of waits behind jobs it could have run
between. A cell's time, in order of what it rests on:

1. **measured**: the same configuration ran before on this cluster (an earlier run of this sweep, or
   the latest sweep of the cluster under ``output_root``): the longest of its runs' wall times;
2. **forecast**: the performance model's step time (launcher/forecast/perfmodel.py, fitted on the
   latest sweep of the cluster) times the cell's steps, plus that sweep's start-up (a run's wall time
   less its steps: process start, model build, compilation, probes), the longest it saw;
3. **default**: nothing to forecast from (the first sweep of a cluster, a model never run): the
   stated ``DEFAULT_MIN``, and the plan says so.

The time asked is ``MARGIN`` (1.5) times the expected wall time plus ``cluster.signal_delay_s`` (the
warning that checkpoints and requeues a run comes that long before the limit: a run must end before
it), rounded up to whole minutes, at least ``FLOOR_MIN``. A run that outlives its limit is not lost silently: on Slurm the warning signal before
the limit checkpoints and requeues it (docs/backends.md), and the report sets the time asked against
the time used for every cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from contract.cell_run import end_s, first_start_s
from contract.records import read_records
from launcher.cluster.backends import backend_for
from launcher.plan.cell import Cell, CellStatus
from launcher.report.rows import md_cell
from launcher.state import SweepState

AUTO = "auto"
MARGIN = 1.5  # a run may take half as long again as expected: the runs of a configuration here differ by far less
FLOOR_MIN = 1  # Slurm counts limits in whole minutes
DEFAULT_MIN = 60  # where nothing can be forecast: the limit every cell asked for before
# Slurm's sbatch --signal: "the signal may be sent up to 60 seconds earlier than specified" (its event
# resolution): a run must end that long before the warning too.
SIGNAL_RESOLUTION_S = 60.0


@dataclass(frozen=True)
class TimeAsked:
    """A cell's time limit and what it rests on (shown by --plan and the report)."""

    minutes: int
    expected_s: float | None  # None: the default, nothing to expect from
    how: str


def minutes_for(expected_s: float, signal_delay_s: float = 0.0) -> int:
    """The limit for a run expected to take ``expected_s``: the warning signal comes ``signal_delay_s``
    before the limit and checkpoints and requeues the run, so the run must end before it."""
    warning_s = signal_delay_s + SIGNAL_RESOLUTION_S if signal_delay_s else 0.0
    return max(FLOOR_MIN, math.ceil((MARGIN * expected_s + warning_s) / 60.0))


def used_s(state: SweepState, cell: Cell) -> float | None:
    """The wall time a finished cell's job used: as recorded when it was finished (:func:`note_used`),
    else from its records (start to its last end)."""
    if cell.time_used_s:
        return cell.time_used_s
    return records_span_s(state, cell)


def round_pace_s(state: SweepState, cells: list[Cell], round_s: float, key: Callable[[Cell], Hashable]
                 ) -> Callable[[Hashable], float]:
    """The wall time one more launch of a kind (``key``: a configuration, a world size) costs, from the
    last round's ``cells`` and wall time ``round_s`` (start-ups and the launcher's work between jobs
    included): the round's wall shared among its cells in proportion to the time each one's job used,
    averaged over the cells of that kind, so that a two-rank launch is not costed at the pace of a
    round that also held one-rank ones; a kind the round did not hold at the round's mean. What
    runs=auto and cells=auto cost their next round with (launcher/decide.py,
    launcher/forecast/cellsearch.py)."""
    used = {c.index: used_s(state, c) for c in cells}
    known = [u for u in used.values() if u]
    mean_used_s = sum(known) / len(known) if known else 1.0  # a cell without a measured time
    weight = {index: u or mean_used_s for index, u in used.items()}
    total = sum(weight.values()) or 1.0
    shares: dict[Hashable, list[float]] = {}
    for c in cells:
        shares.setdefault(key(c), []).append(round_s * weight[c.index] / total)
    per_cell_s = round_s / max(1, len(cells))
    return lambda kind: sum(shares[kind]) / len(shares[kind]) if kind in shares else per_cell_s


def records_span_s(state: SweepState, cell: Cell) -> float | None:
    """A finished cell's wall time from its records (the worker's start to its last end)."""
    if cell.status is not CellStatus.done:
        return None
    records = state.cell_dir(cell) / "metrics.jsonl"
    start = first_start_s(records)
    try:
        end = end_s(read_records(records))
    except OSError:
        return None
    return end - start if start is not None and end is not None and end > start else None


def after_runs(state: SweepState, cells: list[Cell]) -> TimeAsked | None:
    """A further run's limit from the runs of its configuration that ended (runs=auto's rounds)."""
    seen = [s for c in cells if (s := used_s(state, c)) is not None]
    if not seen:
        return None
    return TimeAsked(minutes_for(max(seen), cells[0].cluster.signal_delay_s), max(seen),
                     f"measured: {len(seen)} earlier run(s), longest {max(seen):.0f} s")


def note_used(state: SweepState, times: dict[str, tuple[float, float, list[str]]] | None) -> None:
    """Each finished cell's wall time: the longer of its records' span (the worker's start to its end)
    and its job's span as the backend saw it (sacct's Start to End on Slurm)."""
    done = [c for c in state.cells if c.status is CellStatus.done and c.time_used_s is None]
    spans = {a.cell: a.end_s - a.start_s for a in backend_for(state.cluster).allocations(state, done, times)}
    for cell in done:
        seen = [s for s in (records_span_s(state, cell), spans.get(cell.index)) if s is not None and s > 0]
        cell.time_used_s = max(seen) if seen else None


def section(state: SweepState) -> list[str]:
    """The report's time limits: each cell's time asked against the time it used, and what the ask
    rested on (cells whose limit was set by hand are left out)."""
    asked = [c for c in state.cells if c.time_asked is not None]
    if not asked:
        return []
    lines = ["## Time limits (cluster.timeout_min=auto)", "",
             f"Each cell asked for {MARGIN:g}x the wall time its configuration used or was forecast to use, plus "
             f"cluster.signal_delay_s and 60 s (the warning before the limit requeues a run; Slurm may send it a minute early), in whole minutes (at least "
             f"{FLOOR_MIN}); where nothing could be forecast, {DEFAULT_MIN} min.", "",
             "| cell | asked min | used s | used / asked | rests on |", "|---|---:|---:|---:|---|"]
    for c in asked:
        used = f"{c.time_used_s:.0f}" if c.time_used_s else "-"
        share = f"{c.time_used_s / (60 * c.cluster.timeout_min):.0%}" if c.time_used_s else "-"
        lines.append(f"| {md_cell(c.name)} | {c.cluster.timeout_min} | {used} | {share} | {md_cell(c.time_asked or '')} |")
    stopped = [c.name for c in asked if "cluster.timeout_min" in (c.error or "")]  # every backend's words for it
    lines += ["", f"Stopped at their limit: {', '.join(stopped)}." if stopped else "No cell was stopped at its limit.", ""]
    return lines
