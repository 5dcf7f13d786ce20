"""``python -m launcher.sync <sweep_dir>``: create the MLflow runs a sweep lacks, and replay what did
not reach MLflow from the JSONL records.

Workers write every metric to ``metrics.jsonl`` first and log to MLflow best-effort. If the
tracking server was down, this puts the missing points in, and only those: a (metric, step)
already in the run is skipped, so syncing twice never duplicates anything. ``launcher.status``
and the report run it for finished cells.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from jobs import mlflow_entry
from jobs.mlflow_entry import METRICS_PER_BATCH, TAG_MAX_CHARS
from jobs.sinks import RUN_ID_FILE, read_records
from launcher import tracking
from launcher.state import CellState, StateError, SweepState

STEP_KEYS_SKIP = ("kind", "step", "time")


def sync_run(client, run_id: str, records: list[dict]) -> int:
    """Log every JSONL point missing from the run; returns how many points were added."""
    from mlflow.entities import Metric, RunTag

    wanted: dict[tuple[str, int], float] = {}
    stamps_ms: dict[tuple[str, int], int] = {}  # system samples keep the time they were taken
    tags: dict[str, str] = {}
    status: str | None = None
    error: str | None = None
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
        elif kind == "system":  # the job's own GPUs, sampled during the window (step: sample index)
            for key, value in rec.items():
                if key.startswith("system/") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    wanted[(key, int(rec["step"]))] = float(value)
                    stamps_ms[(key, int(rec["step"]))] = int(float(rec.get("time", time.time())) * 1000)
        elif kind == "tags":
            tags.update({k: str(v) for k, v in rec.items() if k != "kind"})
        elif kind == "status":
            status, error = rec.get("status"), rec.get("error")
    have: set[tuple[str, int]] = set()
    for key in {k for k, _ in wanted}:
        have.update((key, m.step) for m in client.get_metric_history(run_id, key))
    now_ms = int(time.time() * 1000)
    missing = [Metric(k, v, stamps_ms.get((k, s), now_ms), s) for (k, s), v in sorted(wanted.items())
               if (k, s) not in have]
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


def sync_sweep(state: SweepState) -> dict[str, int]:
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


BACKGROUND_LOG = "mlflow-runs.log"
LOCK_FILE = "mlflow.lock"


@contextlib.contextmanager
def runs_lock(state: SweepState, wait: bool = True) -> Iterator[bool]:
    """One run creator at a time per sweep (the launcher, a background sync, a status): yields whether
    this process holds the lock (False only with wait=False while another one works)."""
    with open(state.path / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_runs(state: SweepState, wait: bool = True) -> int:
    """Create whatever MLflow runs the sweep lacks: the parent, then a child per cell without one.
    Idempotent and resumable; returns how many child runs it created (0 when another process holds
    the lock and wait=False)."""
    if not state.tracking_uri:
        return 0
    with runs_lock(state, wait) as mine:
        if not mine:
            return 0
        state.adopt_runs()  # what another creator finished meanwhile
        missing = [c for c in state.cells if not c.run_id]
        if state.parent_run_id and not missing:
            return 0
        tracker = tracking.SweepTracker(state.tracking_uri, state.experiment or "ddp-vs-fsdp")
        code = tracking.code_provenance()
        if not state.parent_run_id:
            state.experiment_id = tracker.experiment_id
            state.parent_run_id = tracker.parent(state.name, {"sweep_dir": state.sweep_dir,
                                                              "argv": " ".join(state.argv), "cluster": state.cluster,
                                                              "cells": str(len(state.cells)), **code})
            state.save_runs()
        for cell in missing:
            tags = {"strategy": cell.strategy, "precision": cell.precision, "nodes": str(cell.nodes),
                    "world_size": str(cell.world_size), "model": cell.model, "cell": cell.name, **code}
            if cell.job_id and state.cluster == "slurm":
                tags["slurm_job_id"] = cell.job_id
            metrics = {name: float(value) for name, value in (
                ("predicted_model_state_bytes", cell.predicted_state_bytes),
                ("predicted_activation_bytes", cell.predicted_activation_bytes)) if value is not None}
            cell.run_id = tracker.child(state.parent_run_id, cell.name, tracking.flatten(_resolved(state, cell)), tags,
                                        metrics)
            # The cell's rank 0 reads it from here when it logs, at the end of its job.
            (state.cell_dir(cell) / RUN_ID_FILE).write_text(cell.run_id + "\n")
        return len(missing)


def _resolved(state: SweepState, cell: CellState) -> dict:
    """The cell's resolved config, as written to its config.yaml (the params of its run)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((state.cell_dir(cell) / "config.yaml").read_text(), Loader=loader) or {}


def start_in_background(state: SweepState) -> int:
    """``python -m launcher.sync <sweep_dir>`` detached from this command (it survives the login
    shell's exit); returns its pid."""
    log = open(state.path / BACKGROUND_LOG, "a")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen([sys.executable, "-m", "launcher.sync", state.sweep_dir], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
