"""``python -m launcher.status <sweep_dir>``: progress, wait, cancel, resubmit.

Works from any later shell and any working directory: everything it needs is in the sweep
document (sweep.json), each cell's directory (spec.json, result.json, error files) and what the
cluster says of its jobs (on Slurm one sacct and one squeue call per refresh: launcher/track/reconcile.py).
It answers within seconds for a thousand cells however many changed: it never imports MLflow, whose
runs a detached process brings up to date (launcher/finish.py); a finished sweep is finished once.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from contract.cell_run import RUN_ID_FILE
from launcher import decide
from launcher.cluster.backends import backend_for
from launcher.cluster.base import CANCELLED_BY_LAUNCHER
from launcher.cluster.failures import describe
from launcher.commands.command import FAILURE_EXIT, UNDECIDED_EXIT, Command, Parser, Refused
from launcher.finish import finalize, refresh, settle_cells, wait
from launcher.plan.cell import RUN_AGAIN, Cell, CellStatus
from launcher.state import SweepState
from launcher.track.runs import ensure_runs
from launcher.track.tracking import reopen

__all__ = ["cancel", "exit_code", "main", "refresh", "render", "resubmit", "resubmit_flagged", "wait"]

# The cells `status` lists without --all (at most `limit` of them): what a person must look at.
ATTENTION = (CellStatus.failed, CellStatus.lost, CellStatus.cancelled, CellStatus.running)


def render(state: SweepState, all_cells: bool = False, width: int = 30, limit: int = 20) -> str:
    """Counts by status and a bar; then the cells that need attention (or every cell with all_cells)."""
    lines = [state.progress(width)]
    attention = [c for c in state.cells if c.status in ATTENTION or c.interference]
    shown = state.cells if all_cells else attention[:limit]
    for c in shown:
        err = f"  {c.error}" if c.error and c.status is not CellStatus.done else ""
        err += f"\n{'':26}{describe(c.failure_class)}" if c.failure_class and c.status is not CellStatus.done else ""
        flag = f"  co-located: {c.interference}" if c.interference else ""
        flag += f"  (restarts {c.restarts}: {'; '.join(c.history)})" if c.restarts else ""
        lines.append(f"  {c.job_id or '-':>14}  {c.status.value:<9} {c.name}{err}{flag}")
    hidden = len(state.cells) - len(shown)
    if hidden and not all_cells:
        more = len(attention) - len(shown)
        lines.append(f"  ({f'{more} more cell(s) need attention and ' if more else ''}{hidden - more} cell(s) are "
                     f"pending or done: --all lists every cell)")
    return "\n".join(lines)


def cancel(state: SweepState) -> list[Cell]:
    """Cancel every unfinished cell and record the decision: its status is cancelled at once, so no
    cell waits for an accounting record that a never-started array task does not get."""
    refresh(state)
    active = [c for c in state.cells if not c.status.terminal]
    if state.design is not None and not state.design.stopped:
        state.design.stopped = CANCELLED_BY_LAUNCHER  # runs=auto: no further round either
    backend_for(state.cluster).cancel([c.job_id for c in active if c.job_id])
    for cell in active:
        cell.status, cell.error, cell.failure_class = CellStatus.cancelled, CANCELLED_BY_LAUNCHER, None
    state.save()
    settle_cells(state, active)
    return active


def resubmit(state: SweepState, which: tuple[CellStatus, ...] = RUN_AGAIN) -> list[Cell]:
    """Submit again the cells in ``which`` statuses, each with its own settings, into the same runs.
    The cluster's view is read first: a cell that finished (a requeued job that completed included) or
    that the cluster still runs or has requeued is never submitted again (:func:`skipped`)."""
    refresh(state)
    again = [c for c in state.cells if c.status in which]
    for cell in again:
        cell.resubmits += 1
        if state.tracking_uri and cell.run_id:
            reopen(state.tracking_uri, cell.run_id)
    if again:
        backend_for(state.cluster).submit(state, again, after_each_cell=lambda cell: settle_cells(state, [cell]))
    return again


def skipped(state: SweepState, resubmitted: list[Cell]) -> list[str]:
    """Why each cell that --resubmit-failed left alone was left alone, one line each (done cells are
    counted, not listed)."""
    chosen = {c.index for c in resubmitted}
    words = backend_for(state.cluster).words
    lines, done = [], 0
    for cell in state.cells:
        if cell.index in chosen:
            continue
        if cell.status is CellStatus.done:
            done += 1
            if cell.restarts:
                lines.append(f"  {cell.name}: done after {cell.restarts} requeue(s) by {words.scheduler} "
                             f"({'; '.join(cell.history)}): its result is kept")
        elif cell.status in (CellStatus.pending, CellStatus.running):
            requeued = f", requeued {cell.restarts} time(s) after {'; '.join(cell.history)}" if cell.restarts else ""
            lines.append(f"  {cell.name}: job {cell.job_id} is still {cell.status.value} {words.where}{requeued}")
        elif cell.status is CellStatus.planned:
            lines.append(f"  {cell.name}: planned, its submission is under way")
    if done:
        lines.insert(0, f"  {done} done cell(s): finished, with a result")
    return lines


def resubmit_flagged(state: SweepState) -> list[Cell]:
    """Run again, on whole nodes, the finished cells that measured something else too. Each one's
    previous outputs move to ``attempt-<n>/`` in its directory, and it gets a new MLflow run: the old
    one keeps its numbers and its ``interference`` tag."""
    flagged = [c for c in state.cells if c.status is CellStatus.done and c.interference]
    for cell in flagged:
        _archive(state.cell_dir(cell), cell.resubmits + 1)
        cell.resubmits += 1
        cell.run_id, cell.interference, cell.status = None, None, CellStatus.planned
        cell.cluster.exclusive = True
    state.save()
    if flagged:
        backend = backend_for(state.cluster)
        if backend.worker_tracking_uri(state):
            ensure_runs(state)  # the ranks log into their runs themselves: the runs exist first
        backend.submit(state, flagged, after_each_cell=lambda cell: _rerun_ended(state, cell))
    return flagged


def _rerun_ended(state: SweepState, cell: Cell) -> None:
    ensure_runs(state)
    settle_cells(state, [cell])


def _archive(cell_dir: Path, attempt: int) -> None:
    target = cell_dir / f"attempt-{attempt}"
    target.mkdir(exist_ok=True)
    for name in ("result.json", "metrics.jsonl", RUN_ID_FILE, "checkpoint", "ranks"):
        if (cell_dir / name).exists():
            (cell_dir / name).rename(target / name)
    for path in cell_dir.glob("error-rank*.txt"):
        path.rename(target / path.name)


class StatusCommand(Command):
    name = "status"

    def add_arguments(self, parser: Parser) -> None:
        parser.add_argument("sweep_dir", type=Path, help="a sweep directory (holds sweep.json)")
        parser.add_argument("--wait", action="store_true", help="block until every cell has finished, then report")
        parser.add_argument("--timeout-s", type=float, default=None, help="--wait: give up after this many seconds")
        parser.add_argument("--cancel", action="store_true", help="cancel every unfinished cell")
        parser.add_argument("--resubmit-failed", action="store_true",
                            help="submit failed, cancelled and lost cells again")
        parser.add_argument("--resubmit-flagged", action="store_true",
                            help="rerun, on whole nodes, the cells flagged co-located (interference)")
        parser.add_argument("--all", action="store_true", help="list every cell, not only those that need attention")
        parser.add_argument("--report", action="store_true", help="print the comparison table")

    def run(self, args: argparse.Namespace) -> int:
        _refuse_timeout(args.timeout_s, args.wait)
        state = SweepState.load(args.sweep_dir)
        _act(state, args)
        if args.wait and not wait(state, timeout_s=args.timeout_s):
            print("timed out waiting", file=sys.stderr)
            return UNDECIDED_EXIT
        if not args.cancel:
            refresh(state, settle=args.wait)  # MLflow: in the background (finalize), unless this call waited
            if all(c.status.terminal for c in state.cells):
                decide.advance(state)  # runs=auto: the next round, where comparisons are still open
        # The one finishing step (reconciliation, interference, report once the sweep has ended); MLflow's
        # runs in the background, unless this call waited anyway.
        finished = finalize(state, force=args.report or args.wait, background=not args.wait)
        print(render(state, all_cells=args.all))
        if state.design is not None:
            print(decide.summary(state))
        if finished:
            print(finished)
        return exit_code(state)


main = StatusCommand.main


def _refuse_timeout(timeout_s: float | None, waits: bool) -> None:
    if timeout_s is None:
        return
    if not waits:
        raise Refused(f"--timeout-s {timeout_s:g}: only means something with --wait; nothing was done. Fix: add "
                      f"--wait, or drop --timeout-s.")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise Refused(f"--timeout-s {timeout_s:g}: the seconds to wait, above 0; nothing was done. Fix: e.g. "
                      f"--wait --timeout-s 600, or --wait alone to wait until every cell has ended.")


def _act(state: SweepState, args: argparse.Namespace) -> None:
    """What was asked of the cells before their status is shown: cancel, resubmit, rerun flagged."""
    if args.cancel:
        cells = cancel(state)
        arrays = sorted({(c.job_id or "-").split("_")[0] for c in cells})
        print(f"cancelled {len(cells)} cell(s) in {len(arrays)} job(s)/array(s): {' '.join(arrays[:10]) or '-'}"
              + (" ..." if len(arrays) > 10 else ""))
    if args.resubmit_failed:
        cells = resubmit(state)
        print(f"resubmitted {len(cells)} cell(s): " + ", ".join(f"{c.name} -> {c.job_id}" for c in cells))
        left = skipped(state, cells)
        if left:
            print("not resubmitted:\n" + "\n".join(left))
    if args.resubmit_flagged:
        cells = resubmit_flagged(state)
        print(f"resubmitted {len(cells)} flagged cell(s): " + ", ".join(f"{c.name} -> {c.job_id}" for c in cells))


def exit_code(state: SweepState) -> int:
    """The house's exit codes (docs/troubleshooting.md): 0 every cell done, 1 a cell failed,
    cancelled or lost, 3 undecided (cells still queued or running, none failed yet)."""
    if any(c.status.terminal and c.status is not CellStatus.done for c in state.cells):
        return FAILURE_EXIT
    return 0 if all(c.status is CellStatus.done for c in state.cells) else UNDECIDED_EXIT
