"""Each cell's status, from what Slurm (or the cell's local process) last said about its job.

One sacct call (every accounting record of every job: requeues included) and one squeue call per
refresh, whatever the number of cells. Every Slurm cell with a job is moved to the state Slurm
last gave it, finished or not: a cell that looked failed when its node went down and was then
requeued is pending, running, then done. The rules:

- ``done`` exactly when the job completed and the cell's ``result.json`` exists;
- ``cancelled`` when the job was cancelled (by ``launcher.status --cancel``, by hand with scancel,
  or left the queue before it started) or stopped at its time limit; the reason is its ``error``;
- ``failed`` (with its failure class) when it ended any other way, ``lost`` when neither the
  queue nor accounting knows it long after its submission;
- ``restarts`` and ``history``: the requeues that accounting recorded, and what ended each start.

A planned cell whose submitting process has ended will never be submitted: it is ``cancelled``
with that reason, so no cell stays planned for good.
"""

from __future__ import annotations

import os
import pwd
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.failures import classify, first_failure
from launcher.runs import finish_cell
from launcher.slurm import JobRecord, first_word, job_records
from launcher.state import CellState, CellStatus, SweepState, slurm_status

# A submitted job that neither squeue nor sacct knows after this long is lost (accounting lags the
# queue by a second or two; a purged or never-recorded job stays unknown for good).
LOST_AFTER_S = 120.0
CANCELLED_BY_LAUNCHER = "cancelled by launcher.status --cancel"


@dataclass
class Refreshed:
    changed: list[CellState] = field(default_factory=list)
    # {job id: (start s, end s, hosts)} of the cells' latest starts (interference reads them).
    times: dict[str, tuple[float, float, list[str]]] = field(default_factory=dict)


def refresh(state: SweepState) -> Refreshed:
    """Bring every cell's status up to date; save and update its MLflow run when it changed."""
    state.adopt_runs()  # runs a background process has created since
    out = Refreshed()
    records: dict[str, JobRecord] = {}
    if state.cluster == "slurm":
        records = job_records([c.job_id for c in state.cells if c.job_id])
        out.times = {job: (r.started[0], r.started[1], list(r.started[2]))
                     for job, r in records.items() if r.started}
    for cell in state.cells:
        before = (cell.status, cell.error, cell.restarts)
        if cell.job_id is None:
            _unsubmitted(state, cell)
        elif state.cluster == "slurm":
            _follow_slurm(state, cell, records.get(cell.job_id))
        elif not cell.status.terminal:
            _follow_local(state, cell)
        if (cell.status, cell.error, cell.restarts) != before:
            out.changed.append(cell)
            finish_cell(state, cell)
    if out.changed:
        state.save()
    return out


def submitter_gone(state: SweepState) -> bool:
    """Whether the process that last submitted cells has ended (known only on its own host)."""
    if not state.submitter:
        return True
    host, _, pid = state.submitter.rpartition(":")
    if host != socket.gethostname():
        return False  # another login node: it cannot be checked from here
    return not _alive(pid)


def _alive(pid: str | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # it exists, under another user
    except (OSError, ValueError):
        return False
    try:  # a zombie (dead, its parent gone or not reaping) still answers signal 0
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _unsubmitted(state: SweepState, cell: CellState) -> None:
    if cell.status is CellStatus.planned and submitter_gone(state):
        cell.status = CellStatus.cancelled
        cell.error = (f"never submitted: the process that was submitting the sweep ({state.submitter or 'unknown'}) "
                      f"ended first. Fix: python -m launcher.status {state.sweep_dir} --resubmit-failed")


def _follow_slurm(state: SweepState, cell: CellState, record: JobRecord | None) -> None:
    if record is None:
        waited_s = time.time() - (cell.submitted_at or 0.0)
        if not cell.status.terminal and waited_s >= LOST_AFTER_S:
            _set(state, cell, CellStatus.lost, None)
        return
    cell.restarts, cell.history = record.restarts, list(record.history)
    word = first_word(record.state)
    if record.left_queue:
        job = CellStatus.cancelled
    elif word == "TIMEOUT":
        job = CellStatus.cancelled
    else:
        job = slurm_status(record.state)
    if cell.status is CellStatus.cancelled and cell.error == CANCELLED_BY_LAUNCHER and not job.terminal:
        return  # scancel was sent; Slurm still ends the job (COMPLETING)
    if job is CellStatus.done and not (state.cell_dir(cell) / "result.json").exists():
        job = CellStatus.failed
    if job is cell.status and job.terminal:
        return  # already settled: keep its reason and class
    _set(state, cell, job, record)


def _set(state: SweepState, cell: CellState, status: CellStatus, record: JobRecord | None) -> None:
    cell.status = status
    cell.error, cell.failure_class = None, None
    if status is CellStatus.cancelled:
        cell.error = _cancel_reason(cell, record)
    elif status in (CellStatus.failed, CellStatus.lost):
        raw = record.state if record else None
        default = (f"job {cell.job_id} is in neither the queue nor accounting (purged or never ran)"
                   if status is CellStatus.lost else
                   f"job {cell.job_id} completed without writing result.json" if first_word(raw or "") == "COMPLETED"
                   else f"job {cell.job_id} ended ({raw or 'unknown'}) without a result")
        cell.error = first_failure(state.cell_dir(cell)) or default
        cell.failure_class = classify(state.cell_dir(cell), raw, cell.error)


def _cancel_reason(cell: CellState, record: JobRecord | None) -> str:
    if record is None:
        return cell.error or CANCELLED_BY_LAUNCHER
    word = first_word(record.state)
    if word == "TIMEOUT":
        return (f"stopped by Slurm at its time limit (cluster.timeout_min={cell.cluster.timeout_min}). Fix: raise "
                f"cluster.timeout_min if the cell was only slow; ranks/stalled-rank*.txt would show a hang")
    if record.left_queue:
        return (f"job {cell.job_id} left the queue before it started: cancelled outside the launcher (scancel by "
                f"hand or by an administrator)")
    if cell.error == CANCELLED_BY_LAUNCHER:
        return cell.error
    parts = record.state.split()
    who = _user(parts[2]) if len(parts) >= 3 and parts[1] == "by" else "Slurm"
    return f"job {cell.job_id} was cancelled outside the launcher ({who}: scancel)"


def _user(uid: str) -> str:
    try:
        return f"by {pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError):
        return f"by uid {uid}"


def _follow_local(state: SweepState, cell: CellState) -> None:
    """A local cell runs in the foreground of its launcher: a result means done; a live process
    running; anything else is a cell whose processes are gone."""
    if (state.cell_dir(cell) / "result.json").exists():
        status = CellStatus.done
    elif _alive(cell.job_id):
        status = CellStatus.running
    else:
        status = CellStatus.failed
    if status is cell.status:
        return
    cell.status, cell.error, cell.failure_class = status, None, None
    if status is CellStatus.failed:
        cell.error = first_failure(state.cell_dir(cell)) or (
            f"its process (pid {cell.job_id}) ended without a result: the launcher was stopped or killed")
        cell.failure_class = classify(state.cell_dir(cell), None, cell.error)
