"""``python -m launcher.sync <sweep_dir>``: replay what did not reach MLflow from the JSONL records.

Workers write every metric to ``metrics.jsonl`` first and log to MLflow best-effort. If the
tracking server was down, this puts the missing points in, and only those: a (metric, step)
already in the run is skipped, so syncing twice never duplicates anything. ``launcher.status``
and the report run it for finished cells.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from jobs import mlflow_entry
from jobs.mlflow_entry import METRICS_PER_BATCH, TAG_MAX_CHARS
from jobs.sinks import read_records
from launcher import tracking
from launcher.state import CellState, SweepState

STEP_KEYS_SKIP = ("kind", "step", "time")


def sync_run(client, run_id: str, records: List[dict]) -> int:
    """Log every JSONL point missing from the run; returns how many points were added."""
    from mlflow.entities import Metric, RunTag

    wanted: Dict[Tuple[str, int], float] = {}
    tags: Dict[str, str] = {}
    status: Optional[str] = None
    error: Optional[str] = None
    for rec in records:
        kind = rec.get("kind")
        if kind == "step":
            for key, value in rec.items():
                if key not in STEP_KEYS_SKIP and isinstance(value, (int, float)) and not isinstance(value, bool):
                    wanted[(key, int(rec["step"]))] = float(value)
        elif kind == "summary":
            for key, value in rec.items():
                if key not in STEP_KEYS_SKIP and isinstance(value, (int, float)) and not isinstance(value, bool):
                    wanted[(key, 0)] = float(value)
        elif kind == "tags":
            tags.update({k: str(v) for k, v in rec.items() if k != "kind"})
        elif kind == "status":
            status, error = rec.get("status"), rec.get("error")
    have: Set[Tuple[str, int]] = set()
    for key in {k for k, _ in wanted}:
        have.update((key, m.step) for m in client.get_metric_history(run_id, key))
    now_ms = int(time.time() * 1000)
    missing = [Metric(k, v, now_ms, s) for (k, s), v in sorted(wanted.items()) if (k, s) not in have]
    for i in range(0, len(missing), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=missing[i : i + METRICS_PER_BATCH])
    run = client.get_run(run_id)
    if error:
        tags["error"] = error
    new_tags = [RunTag(k, v[:TAG_MAX_CHARS]) for k, v in tags.items() if run.data.tags.get(k) != v[:TAG_MAX_CHARS]]
    if new_tags:
        client.log_batch(run_id, tags=new_tags)
    if status and run.info.status == "RUNNING":
        client.set_terminated(run_id, status)
    return len(missing)


def sync_cell(state: SweepState, cell) -> int:
    """Replay one cell's records into its run (best-effort: a tracking outage is reported, not raised)."""
    if not (state.tracking_uri and cell.run_id):
        return 0
    try:
        return sync_run(mlflow_entry.client(state.tracking_uri), cell.run_id,
                        read_records(state.cell_dir(cell) / "metrics.jsonl"))
    except Exception as exc:  # the records stay on disk; the next sync picks them up
        print(f"[mlflow] sync of {cell.name} failed, will retry on the next status/sync: {exc}", file=sys.stderr)
        return 0


def sync_sweep(state: SweepState) -> Dict[str, int]:
    """{cell: points added} for every cell that has records and a run."""
    if not state.tracking_uri:
        return {}
    client = mlflow_entry.client(state.tracking_uri)
    added = {}
    for cell in state.cells:
        if cell.run_id:
            added[cell.name] = sync_run(client, cell.run_id, read_records(state.cell_dir(cell) / "metrics.jsonl"))
    return added


def finish_cell(state: SweepState, cell: CellState) -> None:
    """A cell that ended: replay what its ranks could not log, attach its files, and make its run's
    status and tags agree with the cell's (best-effort: the next status or sync retries)."""
    if not (state.tracking_uri and cell.run_id):
        return
    sync_cell(state, cell)
    tags = {"failure_class": cell.failure_class} if cell.failure_class else {}
    try:
        tracking.attach_cell_artifacts(state.tracking_uri, cell.run_id, state.cell_dir(cell), state.path / "submitit",
                                       cell.job_id)
        tracking.reconcile(state.tracking_uri, cell.run_id, cell.status, cell.error, tags)
    except Exception as exc:  # a tracking outage must not break status; the next refresh retries
        print(f"[mlflow] could not update run {cell.run_id}: {exc}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m launcher.sync <sweep_dir>", file=sys.stderr)
        return 2
    state = SweepState.load(Path(args[0]))
    for cell, n in sync_sweep(state).items():
        print(f"{cell}: {n} point(s) added")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
