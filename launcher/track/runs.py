"""A sweep's MLflow runs, kept in agreement with its cells: created (parent, then one child per cell),
replayed from the JSONL records where the tracking store missed points, and settled (status and
tags follow the cell's status; runs left RUNNING by processes that are gone are closed, with the
reason). ``launcher.sync``, ``launcher.status``, the report and the launcher itself use it.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from contract import cell_run, mlflow_client, records
from contract.metrics import PREDICTED_ACTIVATION_BYTES, PREDICTED_MODEL_STATE_BYTES, RESTARTS, predicted_comm_bytes
from contract.mlflow_client import METRICS_PER_BATCH, TAG_MAX_CHARS
from launcher.cluster.backends import backend_for
from launcher.plan.cell import Cell, CellStatus
from launcher.state import MLFLOW_STATUS, RUNS_FILE, SETTLED_FILE, SweepState
from launcher.track import tracking

STEP_KEYS_SKIP = ("kind", "step", "time")


@dataclass
class Replay:
    """What a job's records say its run must hold."""
    points: dict[tuple[str, int], float] = field(default_factory=dict)  # (metric, step) -> value
    stamps_ms: dict[tuple[str, int], int] = field(default_factory=dict)  # system samples keep their time
    tags: dict[str, str] = field(default_factory=dict)
    status: str | None = None
    error: str | None = None  # the last status's error (none once a requeued job has finished)
    end_s: float | None = None  # when the job wrote that it ended


def _numbers(rec: dict, keep=lambda key: key not in STEP_KEYS_SKIP) -> Iterator[tuple[str, float]]:
    return ((k, float(v)) for k, v in rec.items() if keep(k) and isinstance(v, (int, float)) and not isinstance(v, bool))


def replay(records: list[dict]) -> Replay:
    """The run's points, tags and end, from a job's JSONL records (steps, summary, system samples,
    tags, the final status)."""
    out = Replay()
    for rec in records:
        kind = rec.get("kind")
        if kind in ("step", "summary"):
            step = int(rec["step"]) if kind == "step" else 0
            out.points.update({(key, step): value for key, value in _numbers(rec)})
        elif kind == "system":  # the job's own GPUs, sampled during the window (step: sample index)
            for key, value in _numbers(rec, keep=lambda key: key.startswith("system/")):
                out.points[(key, int(rec["step"]))] = value
                out.stamps_ms[(key, int(rec["step"]))] = int(float(rec.get("time", time.time())) * 1000)
        elif kind == "tags":
            out.tags.update({k: str(v) for k, v in rec.items() if k != "kind"})
        elif kind == "status":
            out.status, out.error, out.end_s = rec.get("status"), rec.get("error"), rec.get("time")
    if out.error:
        out.tags["error"] = out.error
    return out


def cell_records(cell_dir: Path) -> list[dict]:
    """A cell's JSONL records, refused where they hold two runs' summaries: two launches wrote into one
    folder (requeues of one job add start records, never a second summary), so no run can tell which
    numbers are the cell's."""
    found = records.read_records(cell_dir / cell_run.METRICS_FILE)
    summaries = sum(1 for r in found if r.get("kind") == "summary")
    if summaries > 1:
        raise records.RecordError(
            f"{cell_dir / cell_run.METRICS_FILE} holds {summaries} runs' summaries: two launches measured into one cell "
            f"folder. Fix: move the cell folder aside and run the sweep's command again to measure it once.")
    return found


def sync_run(client, run_id: str, records: list[dict], known: dict[str, float] | None = None) -> int:
    """Log every JSONL point missing from the run, then the figures ``known`` before launch (the
    headline metrics first: contract/cell_run.view_order); returns how many points were added."""
    from mlflow.entities import Metric, RunTag

    want = replay(records)
    for key, value in (known or {}).items():
        want.points.setdefault((key, 0), float(value))
    have: set[tuple[str, int]] = set()
    for key in {k for k, _ in want.points}:
        have.update((key, m.step) for m in client.get_metric_history(run_id, key))
    now_ms = int(time.time() * 1000)
    missing = [Metric(k, v, want.stamps_ms.get((k, s), now_ms), s) for (k, s), v in
               sorted(want.points.items(), key=lambda item: (cell_run.view_order(item[0][0]), item[0]))
               if (k, s) not in have]
    for i in range(0, len(missing), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=missing[i : i + METRICS_PER_BATCH])
    run = client.get_run(run_id)
    new_tags = [RunTag(k, v[:TAG_MAX_CHARS]) for k, v in want.tags.items()
                if run.data.tags.get(k) != v[:TAG_MAX_CHARS]]
    if new_tags:
        client.log_batch(run_id, tags=new_tags)
    if want.status and run.info.status == "RUNNING":  # it ends when its job wrote that it ended
        client.set_terminated(run_id, want.status, end_time=int(1000 * (want.end_s or time.time())))
    return len(missing)


def sync_sweep(state: SweepState) -> dict[str, int]:
    """{cell: points added} for every cell that has records and a run."""
    if not state.tracking_uri:
        return {}
    client = mlflow_client.client(state.tracking_uri)
    added = {}
    for cell in state.cells:
        if cell.run_id:
            added[cell.name] = sync_run(client, cell.run_id, cell_records(state.cell_dir(cell)),
                                        cell_run.known_metrics(state.cell_dir(cell)))
    return added


def finish_cell(state: SweepState, cell: Cell) -> bool:
    """A cell whose status changed: once it has ended, replay what its ranks could not log and attach
    its files; then make its run's status and tags agree with the cell's. Best-effort: returns whether
    the run now agrees (False: a tracking outage, said on stderr; the next status or sync retries)."""
    if not state.tracking_uri:
        return True
    cell.run_id = cell.run_id or cell_run.run_id(state.cell_dir(cell))  # its rank 0 may have created it
    try:
        if not cell.run_id and cell.status.terminal:
            ensure_runs(state)  # a job that ended without creating its run (killed, or never started)
        if not cell.run_id:
            return not cell.status.terminal
        client = mlflow_client.client(state.tracking_uri)
        if cell.status.terminal:
            sync_run(client, cell.run_id, cell_records(state.cell_dir(cell)),
                     cell_run.known_metrics(state.cell_dir(cell)))
            tracking.attach_cell_artifacts(state.tracking_uri, cell.run_id, state.cell_dir(cell),
                                           state.path / "submitit", cell.job_id)
        settle_run(client, client.get_run(cell.run_id), cell, lambda: job_end_s(state, cell))
        return True
    except Exception as exc:  # a tracking outage must not break status; the records stay on disk
        print(f"[mlflow] could not bring the run of {cell.name} up to date, the next status/sync retries: {exc}",
              file=sys.stderr)
        return False


# Tags that describe a failure: only a failed (or lost) cell's run carries them. When a cell that
# looked failed is requeued and completes, they move to "earlier_failure" (history, not status).
FAILURE_TAGS = ("failure_class", "error")


def run_tags(cell: Cell) -> tuple[dict[str, str], list[str]]:
    """(tags the cell's run must carry, tags it must not) for the cell's current status."""
    tags: dict[str, str] = {}
    drop: list[str] = []
    if cell.status in (CellStatus.failed, CellStatus.lost):
        tags.update({k: v for k, v in (("failure_class", cell.failure_class), ("error", cell.error)) if v})
    else:
        drop += FAILURE_TAGS
    if cell.status is CellStatus.cancelled:
        tags["cancel_reason"] = cell.error or "cancelled"
    else:
        drop.append("cancel_reason")
    if cell.history:
        tags["requeued_after"] = "; ".join(cell.history)
    if cell.interference:
        tags["interference"] = cell.interference
    return tags, drop


def settle_run(client, run, cell: Cell, end_s: Callable[[], float] = time.time) -> bool:
    """Make one run agree with its cell: status (KILLED for a cancelled cell, RUNNING again for a
    requeued one), failure and cancel tags, Slurm's restarts. A run still RUNNING whose cell has
    ended was left open by processes that are gone: it is closed with ``closed_by`` saying so.
    A run it ends ends at ``end_s()``, the job's end. Writes nothing when they already agree; returns
    whether anything was written."""
    run_id, have = run.info.run_id, run.data.tags
    tags, drop = run_tags(cell)
    earlier = [f"{k}={have[k]}" for k in FAILURE_TAGS if k in drop and have.get(k)]
    if earlier:
        tags["earlier_failure"] = "; ".join(earlier)
    if cell.restarts > _int(have.get(RESTARTS)):
        tags[RESTARTS] = str(cell.restarts)
    wanted = MLFLOW_STATUS[cell.status]
    if cell.status in (CellStatus.failed, CellStatus.lost) and run.info.status == "RUNNING":
        tags["closed_by"] = (f"launcher: the cell's job {cell.job_id or '-'} ended ({cell.status.value}) and its "
                             f"processes are gone, but its run was still RUNNING")
    changed = False
    for key, value in tags.items():
        if have.get(key) != value[:TAG_MAX_CHARS]:
            client.set_tag(run_id, key, value[:TAG_MAX_CHARS])
            changed = True
    for key in drop:
        if key in have:
            client.delete_tag(run_id, key)
            changed = True
    if cell.status.terminal and run.info.status != wanted:
        client.set_terminated(run_id, wanted, end_time=int(1000 * end_s()))
        changed = True
    elif not cell.status.terminal and run.info.status in ("FINISHED", "FAILED", "KILLED"):
        client.update_run(run_id, status="RUNNING")  # requeued or resubmitted: it logs on into this run
        changed = True
    return changed


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def settle(state: SweepState) -> int:
    """Every child run of the sweep agrees with its cell, from one paged search (no call per run when
    they agree); returns how many runs were changed."""
    if not (state.tracking_uri and state.parent_run_id and state.experiment_id):
        return 0
    client = mlflow_client.client(state.tracking_uri)
    by_id = {c.run_id: c for c in state.cells if c.run_id}
    changed, token = 0, None
    while True:
        page = client.search_runs([state.experiment_id], f"tags.mlflow.parentRunId = '{state.parent_run_id}'",
                                  max_results=1000, page_token=token)
        for run in page:
            cell = by_id.get(run.info.run_id)
            if cell is not None and cell.status is not CellStatus.planned:
                changed += settle_run(client, run, cell, functools.partial(job_end_s, state, cell))
        token = page.token
        if not token:
            return changed


BACKGROUND_LOG = "mlflow-runs.log"
LOCK_FILE = "mlflow.lock"


@contextlib.contextmanager
def runs_lock(state: SweepState, wait: bool = True) -> Iterator[bool]:
    """One run creator at a time per sweep (the launcher, a background sync, a status): yields whether
    this process holds the lock (False only with wait=False while another one works)."""
    if not wait:
        with records.holding(state.path / LOCK_FILE, wait_s=0) as taken:
            yield taken
        return
    # The holder's calls are each bounded (CALL_DEADLINE_S); a holder that outlives them all is named.
    with records.turn(state.path / LOCK_FILE, mlflow_client.TURN_WAIT_S, f"{state.path}: the sweep's MLflow runs"):
        yield True


def ensure_runs(state: SweepState, wait: bool = True) -> int:
    """The sweep's MLflow runs as far as its jobs have gone: the parent (it starts with the sweep),
    every cell's run template, and the run of every cell whose job has started (or has ended without
    starting), created at the job's own start time (contract/cell_run.py). Idempotent and resumable;
    returns how many cell runs it created (0 when another process holds the lock and wait=False)."""
    if not state.tracking_uri:
        return 0
    with runs_lock(state, wait) as mine:
        if not mine:
            return 0
        state.adopt_runs()  # what another creator (a rank 0 at its job's end included) finished meanwhile
        missing = [c for c in state.cells if not c.run_id]
        if state.parent_run_id and not missing:
            return 0
        starts_s = {c.index: s for c in missing if (s := job_start_s(state, c)) is not None}
        if state.parent_run_id and not starts_s and all(cell_run.has_template(state.cell_dir(c)) for c in missing):
            return 0  # nothing new: no MLflow call at all (a status of a queued sweep stays quick)
        tracker = tracking.SweepTracker(state.tracking_uri, state.experiment or "ddp-vs-fsdp")
        code = state.code or tracking.code_provenance()
        if not state.parent_run_id:
            open_parent(state, tracker, code)
            missing = [c for c in missing if not c.run_id]
        for cell in missing:
            if not cell_run.has_template(state.cell_dir(cell)):
                write_template(state, cell, code)
        opened = [c for c in missing if c.index in starts_s]
        for cell in opened:
            cell.run_id = cell_run.open_run(tracker.client, state.cell_dir(cell), starts_s[cell.index])
        return len(opened)


def complete_runs(state: SweepState, wait: bool = True) -> int:
    """Every run the sweep lacks, created at its job's own times (ensure_runs), and each ended cell's
    run that is new to this directory (created, or found in the store by a sync that may have stopped
    half-way) filled from its records and settled as its cell (finish_cell). Returns how many cell
    runs were created."""
    state.adopt_runs()  # runs other processes made are theirs to fill, not new here
    had = {c.index for c in state.cells if c.run_id}
    created = ensure_runs(state, wait)
    for cell in state.cells:
        if cell.run_id and cell.index not in had and cell.status.terminal:
            finish_cell(state, cell)
    return created


def missing_runs(state: SweepState) -> list[str]:
    """What the sweep's store lacks, read from the sweep directory alone (no MLflow call): the parent
    run once a cell has ended, the runs of ended cells, and, once all have ended, the parent's end with
    the report (launcher/finish.py)."""
    if not state.tracking_uri:
        return []
    ended = [c for c in state.cells if c.status.terminal]
    lost = [f"the run of {c.name}" for c in ended if not c.run_id]
    if ended and not state.parent_run_id:
        lost.insert(0, "the parent run")
    elif len(ended) == len(state.cells) and state.closed != state.outcome():
        lost.insert(0, "the parent run's end and report")
    return lost


def move_to_store(state: SweepState, uri: str) -> bool:
    """Log the sweep to ``uri`` from now on: a sweep that ran with tracking=off, or whose store cannot
    be reached from here. The ids of an earlier store are forgotten (that store keeps its runs); in
    ``uri`` the runs are found by the sweep's id, or created. Returns whether the store changed."""
    if state.tracking_uri == uri:
        return False
    state.tracking_uri, state.experiment = uri, state.experiment or _experiment_of(state)
    state.experiment_id = state.parent_run_id = state.closed = None
    # A document from before code was recorded: the syncing checkout's commit would be a guess.
    state.code = state.code or {"git_commit": "unknown"}
    (state.path / RUNS_FILE).unlink(missing_ok=True)
    (state.path / SETTLED_FILE).unlink(missing_ok=True)  # nothing is settled in the new store
    for cell in state.cells:
        cell.run_id = None
        cell_run.forget_run(state.cell_dir(cell))
    state.save()
    return True


def _experiment_of(state: SweepState) -> str | None:
    """The experiment the sweep's config names (tracking.experiment; tracking=off keeps the name)."""
    try:
        return (_resolved(state, state.cells[0]).get("tracking") or {}).get("experiment")
    except (OSError, yaml.YAMLError):
        return None


def open_parent(state: SweepState, tracker: tracking.SweepTracker, code: dict[str, str]) -> None:
    """The sweep's parent run: the one the store holds for this sweep already (synced before, from this
    directory or a copy of it), with its cells' runs; else a new one, starting with the sweep."""
    state.experiment_id = tracker.experiment_id
    found = tracker.find_parent(state.sweep_id)
    if found:
        state.parent_run_id = found
        by_name = tracker.cell_runs(found)
        for cell in state.cells:
            if cell.name in by_name and not cell.run_id:
                cell.run_id = cell_run.remember_run(state.cell_dir(cell), by_name[cell.name])
    else:
        tags = {"sweep_dir": state.sweep_dir, "argv": " ".join(state.argv), "cluster": state.cluster,
                "cells": str(len(state.cells)), tracking.SWEEP_ID_TAG: state.sweep_id, **code}
        state.parent_run_id = tracker.parent(state.name, tags, start_s=sweep_start_s(state))
    state.save_runs()


def write_template(state: SweepState, cell: Cell, code: dict[str, str]) -> None:
    """What the cell's run is created with, whoever creates it (contract/cell_run.py)."""
    tags = {"mlflow.parentRunId": str(state.parent_run_id), "strategy": cell.strategy, "precision": cell.precision,
            "nodes": str(cell.nodes), "world_size": str(cell.world_size), "model": cell.model, "cell": cell.name,
            **code, **backend_for(state.cluster).job_tags(cell)}
    metrics = {name: float(value) for name, value in (
        (PREDICTED_MODEL_STATE_BYTES, cell.predicted_state_bytes),
        (PREDICTED_ACTIVATION_BYTES, cell.predicted_activation_bytes)) if value is not None}
    metrics.update({predicted_comm_bytes(k): float(v) for k, v in cell.predicted_comm_bytes.items()})
    cell_run.write_template(state.cell_dir(cell), str(state.experiment_id), cell.name, tags,
                            tracking.flatten(_resolved(state, cell)), metrics)


def job_start_s(state: SweepState, cell: Cell) -> float | None:
    """When the cell's job started (its first attempt), from its own records; a cell that ended
    without a job starting (refused, cancelled while queued) starts where it was submitted. None
    while its job has not started."""
    started = cell_run.first_start_s(state.cell_dir(cell) / cell_run.METRICS_FILE)
    if started is not None or not cell.status.terminal:
        return started
    return cell.submitted_at or time.time()


def job_end_s(state: SweepState, cell: Cell) -> float:
    """When the cell's job ended: its rank 0's end record; for a job killed before writing it, the
    last sign of life of any of its ranks (records, heartbeats); else when it was submitted."""
    cell_dir = state.cell_dir(cell)
    ended = cell_run.end_s(records.read_records(cell_dir / cell_run.METRICS_FILE))
    if ended is not None:
        return ended
    touched = [p.stat().st_mtime for p in (cell_dir / cell_run.METRICS_FILE, *cell_dir.glob("ranks/rank*.json"))
               if p.exists()]
    return max(touched, default=cell.submitted_at or time.time())


def sweep_start_s(state: SweepState) -> float:
    """The sweep's start: its first submission."""
    return min((c.submitted_at for c in state.cells if c.submitted_at), default=time.time())


def sweep_end_s(state: SweepState) -> float:
    """The sweep's end: its last job's end."""
    return max((job_end_s(state, c) for c in state.cells if c.status.terminal), default=time.time())


def _resolved(state: SweepState, cell: Cell) -> dict:
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
