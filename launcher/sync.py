"""``python -m launcher.sync <sweep_dir>``: create the MLflow runs a sweep lacks, and replay what did
not reach MLflow from the JSONL records, then finish the sweep as ``launcher.status`` does
(report.finalize: cells reconciled with Slurm, runs settled, report once every cell has ended).

Workers write every metric to ``metrics.jsonl`` first and log to MLflow best-effort. If the
tracking server was down, this puts the missing points in, and only those: a (metric, step)
already in the run is skipped, so syncing twice never duplicates anything. ``launcher.status``
and the report run it for finished cells.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.cli import guarded
from launcher.report import report
from launcher.state import StateError, SweepState
from launcher.track.runs import BACKGROUND_LOG, ensure_runs, finish_cell, start_in_background, sync_run, sync_sweep

__all__ = ["BACKGROUND_LOG", "ensure_runs", "finish_cell", "main", "start_in_background", "sync_run", "sync_sweep"]


@guarded
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m launcher.sync <sweep_dir>", file=sys.stderr)
        return 2
    try:
        state = SweepState.load(Path(args[0]))
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    created = ensure_runs(state)
    if created:
        print(f"created {created} cell run(s) under parent run {state.parent_run_id}")
    for cell, n in sync_sweep(state).items():
        if n:
            print(f"{cell}: {n} point(s) added")
    # The one finishing step (Slurm's states, interference, run statuses; the report once all ended).
    finished = report.finalize(state, force=False)
    if finished:
        print(finished)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
