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

from jobs.sinks import read_records
from launcher import tracking  # noqa: F401  (sets MLflow's retry and telemetry defaults first)
from launcher.state import SweepState

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
    for i in range(0, len(missing), 1000):  # MLflow's per-batch limit
        client.log_batch(run_id, metrics=missing[i : i + 1000])
    run = client.get_run(run_id)
    new_tags = [RunTag(k, v[:5000]) for k, v in tags.items() if run.data.tags.get(k) != v[:5000]]
    if error and run.data.tags.get("error") != error[:5000]:
        new_tags.append(RunTag("error", error[:5000]))
    if new_tags:
        client.log_batch(run_id, tags=new_tags)
    if status and run.info.status == "RUNNING":
        client.set_terminated(run_id, status)
    return len(missing)


def sync_cell(state: SweepState, cell) -> int:
    """Replay one cell's records into its run (best-effort: a tracking outage is reported, not raised)."""
    if not (state.tracking_uri and cell.run_id):
        return 0
    from mlflow.tracking import MlflowClient

    try:
        return sync_run(MlflowClient(tracking_uri=state.tracking_uri), cell.run_id,
                        read_records(state.cell_dir(cell) / "metrics.jsonl"))
    except Exception as exc:  # the records stay on disk; the next sync picks them up
        print(f"[mlflow] sync of {cell.name} failed, will retry on the next status/sync: {exc}", file=sys.stderr)
        return 0


def sync_sweep(state: SweepState) -> Dict[str, int]:
    """{cell: points added} for every cell that has records and a run."""
    if not state.tracking_uri:
        return {}
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=state.tracking_uri)
    added = {}
    for cell in state.cells:
        if cell.run_id:
            added[cell.name] = sync_run(client, cell.run_id, read_records(state.cell_dir(cell) / "metrics.jsonl"))
    return added


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
