"""``python -m launcher.sync <sweep_dir> [--tracking-uri URI]``: create the MLflow runs a sweep lacks,
and replay what did not reach MLflow from the JSONL records, then finish the sweep as
``launcher.status`` does (launcher/finish.py: cells reconciled with their cluster, runs settled, the parent run
closed with the report once every cell has ended).

Workers write every metric to ``metrics.jsonl`` first and log to MLflow best-effort. If the
tracking server was down, this puts the missing points in, and only those: a (metric, step)
already in the run is skipped, so syncing twice never duplicates anything. ``launcher.status``
and the report run it for finished cells.

With ``--tracking-uri``, a sweep that ran with ``tracking=off`` (an offline GPU node without MLflow)
or whose store cannot be reached from here is logged to that store afterwards: its parent run and one
run per cell, at the jobs' own start and end times, with every metric and tag of their records, the
params a tracked sweep logs and its report.md. The sweep directory may have moved (a tarball
extracted elsewhere); it then remembers the store and run ids, and a second sync finds the runs by
the sweep's id instead of making new ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.commands.command import FAILURE_EXIT, UNDECIDED_EXIT, USER_ERROR_EXIT, Command, Parser, Refused
from launcher.finish import finalize
from launcher.masking import mask
from launcher.plan.cell import CellStatus
from launcher.state import SweepState
from launcher.track import tracking
from launcher.track.runs import complete_runs, missing_runs, move_to_store, sync_sweep

__all__ = ["main"]


class SyncCommand(Command):
    name = "sync"
    nothing = "nothing was synced"

    def add_arguments(self, parser: Parser) -> None:
        parser.add_argument("sweep_dir", type=Path, help="a sweep directory (holds sweep.json)")
        parser.add_argument("--tracking-uri", help="the MLflow store to log the sweep to (a sweep that ran with "
                                                   "tracking=off, or whose store cannot be reached from here); "
                                                   "default: the sweep's own")

    def run(self, args: argparse.Namespace) -> int:
        return sync(args)


main = SyncCommand.main


def sync(args: argparse.Namespace) -> int:
    """Log what the store lacks, then finish the sweep; the exit code says whether anything is missing."""
    if args.tracking_uri:  # a relative sqlite:/// store: the one under this directory, recorded absolute
        args.tracking_uri = tracking.absolute_uri(args.tracking_uri)
    state = SweepState.load(args.sweep_dir)
    if not _has_results(state):  # nothing to log: no empty runs made, and not a success either
        return _said_without_results(state)
    if not (args.tracking_uri or state.tracking_uri):  # nothing synced is not a success: refused, the fix said
        raise Refused(f"{state.sweep_dir} ran with tracking=off: there is no store to sync to; nothing was synced. "
                      f"Fix: name one: python -m launcher.sync {state.sweep_dir} --tracking-uri URI (an MLflow server "
                      f"http://host:5000, or sqlite:///path/mlflow.db)")
    problem = _store_problem(state, args.tracking_uri)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return USER_ERROR_EXIT
    if args.tracking_uri and move_to_store(state, args.tracking_uri):
        print(f"{state.name}: logging to {mask('', args.tracking_uri)} from now on (sweep id {state.sweep_id})")
    created = complete_runs(state)
    if created:
        print(f"created {created} cell run(s) under parent run {state.parent_run_id}")
    for cell, n in sync_sweep(state).items():
        if n:
            print(f"{cell}: {n} point(s) added")
    # The one finishing step (the cluster's states, interference, run statuses; the report once all ended).
    finished = finalize(state, force=False)
    if finished:
        print(finished)
    return _said_what_is_missing(state)


def _has_results(state: SweepState) -> bool:
    """Whether any cell has a result to log: its result.json written (a cell recorded done whose file
    is gone has nothing to log, and its report must not be rewritten as an empty table)."""
    return any((state.cell_dir(c) / "result.json").is_file() for c in state.cells)


def _said_without_results(state: SweepState) -> int:
    """A sweep with no cell that has a result is not synced (no run is created for nothing) and says
    so: 1 when every cell has ended without one, 3 while some have not ended."""
    counts: dict[str, int] = {}
    for c in state.cells:
        counts[c.status.value] = counts.get(c.status.value, 0) + 1
    said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lost = sum(1 for c in state.cells if c.status is CellStatus.done)
    if lost:
        print(f"error: {state.sweep_dir}: {lost} cell(s) recorded done have no result.json ({said}): their results "
              f"are gone from this copy; nothing was synced, no run was created and report.md was left as it is. "
              f"Fix: copy the whole sweep directory (each cell's result.json with it), then sync again.",
              file=sys.stderr)
        return FAILURE_EXIT
    if all(c.status.terminal for c in state.cells):
        print(f"error: {state.sweep_dir} has no results: no cell finished with a measurement ({said}); nothing was "
              f"synced and no run was created. See python -m launcher.status {state.sweep_dir} (each cell's error).",
              file=sys.stderr)
        return FAILURE_EXIT
    print(f"{state.sweep_dir} has no results yet ({said}): nothing was synced and no run was created; sync again "
          f"once its cells have ended (python -m launcher.status {state.sweep_dir} --wait).", file=sys.stderr)
    return UNDECIDED_EXIT


def _store_problem(state: SweepState, uri: str | None) -> str | None:
    """Why the sweep cannot be synced to ``uri`` (None: its own store), or None."""
    if uri and uri != state.tracking_uri and not all(c.status.terminal for c in state.cells):
        return (f"{state.sweep_dir} has cells still queued or running, which log to "
                f"{mask('', state.tracking_uri) or 'no store (tracking=off)'}. Fix: sync it to another store once they have "
                f"ended (python -m launcher.status {state.sweep_dir} --wait).")
    reason = tracking.check_reachable(uri) if uri else None
    return f"cannot log to {mask('', uri)}: {reason}" if reason else None


def _said_what_is_missing(state: SweepState) -> int:
    """1 when the store still lacks part of the sweep (it failed during this sync), said on stderr."""
    missing = missing_runs(state)
    if not missing:
        print(f"MLflow: {mask('', state.tracking_uri)} holds the sweep (parent run {state.parent_run_id}, "
              f"{sum(1 for c in state.cells if c.run_id)} cell run(s))")
        return 0
    print(f"MLflow still lacks {'; '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}: run this again once "
          f"{mask('', state.tracking_uri)} answers, or log the sweep to a store that does: python -m launcher.sync "
          f"{state.sweep_dir} --tracking-uri URI", file=sys.stderr)
    return FAILURE_EXIT
