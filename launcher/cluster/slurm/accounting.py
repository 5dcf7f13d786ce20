"""What Slurm says about jobs: sacct's accounting records and squeue's queue, read in one call each,
the cell status each Slurm state means (the one table), and scancel."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from launcher.cluster import failures
from launcher.cluster.slurm.commands import call, run
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.plan.cell import CellStatus

# The one Slurm -> cell status table (sacct/squeue State, first word, without "+").
# COMPLETED means the job ended with exit code 0; the cell is done only if it left a result.
SLURM_STATUS = {
    "PENDING": CellStatus.pending, "REQUEUED": CellStatus.pending, "REQUEUE_HOLD": CellStatus.pending,
    "REQUEUE_FED": CellStatus.pending, "CONFIGURING": CellStatus.pending, "RESIZING": CellStatus.pending,
    "SUSPENDED": CellStatus.pending, "PREEMPTED": CellStatus.pending,  # preempted jobs are requeued (--requeue)
    "RUNNING": CellStatus.running, "COMPLETING": CellStatus.running, "STAGE_OUT": CellStatus.running,
    "SIGNALING": CellStatus.running,
    "COMPLETED": CellStatus.done, "CANCELLED": CellStatus.cancelled, "FAILED": CellStatus.failed,
    "TIMEOUT": CellStatus.failed, "NODE_FAIL": CellStatus.failed, "OUT_OF_MEMORY": CellStatus.failed,
    "BOOT_FAIL": CellStatus.failed, "DEADLINE": CellStatus.failed,
}


# The Slurm states that settle a failed job's class, and the one that says its time ran out.
SLURM_FAILURE = {"OUT_OF_MEMORY": failures.OOM, "NODE_FAIL": failures.NODE_FAILURE,
                 "BOOT_FAIL": failures.NODE_FAILURE, "PREEMPTED": failures.PREEMPTED}


def failure_class(cell_dir: Path, state: str | None, error: str | None) -> str:
    """The failure class of a cell whose job ended in Slurm ``state`` (sacct's, or None)."""
    word = first_word(state or "")
    return failures.classify(cell_dir, SLURM_FAILURE.get(word), error, timed_out=word == "TIMEOUT")


def slurm_status(state: str) -> CellStatus:
    """``"CANCELLED by 0"`` -> cancelled; an unknown state counts as failed."""
    return SLURM_STATUS.get(first_word(state), CellStatus.failed)


def expand_array_ids(job: str) -> list[str]:
    """``123_[0-2,5%4]`` -> 123_0, 123_1, 123_2, 123_5 (sacct and squeue fold pending array tasks)."""
    base, sep, rest = job.partition("_[")
    if not sep:
        return [job]
    ids: list[str] = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return ids


def parse_states(text: str) -> dict[str, str]:
    """``JobID|State`` lines (sacct -X -n -P, squeue -h -o '%i|%T') -> {job id: raw state}.

    A requeued job shows several records: the last one wins.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        job, state = line.split("|", 1)
        for one in expand_array_ids(job.strip()):
            states[one] = state.strip()
    return states


# How a start ends when Slurm requeues the job (a cancelled job still COMPLETING is not requeued).
REQUEUE_CAUSES = ("NODE_FAIL", "PREEMPTED", "REQUEUED", "BOOT_FAIL", "TIMEOUT", "FAILED")


@dataclass(frozen=True)
class JobRecord:
    """What Slurm last said about one job (or array task), from accounting and the queue together.

    ``state`` is the live queue's state while the job is queued (squeue), else the state of its
    latest accounting record (sacct). A requeued job has one accounting record per start: the
    earlier ones are its ``history`` (``NODE_FAIL on node[1-2]``) and their number its ``restarts``.
    """

    state: str  # Slurm's own words, e.g. RUNNING, COMPLETED, "CANCELLED by 0", NODE_FAIL
    restarts: int = 0
    history: tuple[str, ...] = ()
    in_queue: bool = False
    # Accounting still says PENDING, but the queue (which answered) no longer holds the job: it
    # left the queue without starting, which only a cancellation does (scancel of a pending task).
    left_queue: bool = False
    started: tuple[float, float, tuple[str, ...]] | None = None  # (start s, end s or now, hosts) of the latest start


@dataclass(frozen=True)
class _Row:
    state: str
    nodes: str
    start: str
    end: str


def first_word(state: str) -> str:
    """``"CANCELLED by 0"`` -> CANCELLED; ``"COMPLETED+"`` -> COMPLETED."""
    return state.split()[0].rstrip("+").upper() if state.strip() else ""


def parse_sacct_records(text: str) -> tuple[dict[str, list[_Row]], dict[str, _Row]]:
    """``JobID|State|NodeList|Start|End`` lines (sacct -X -D -n -P) -> (every record of each job, in
    order; the folded record of not-yet-started array tasks, ``123_[2-4]``, for each task it covers)."""
    records: dict[str, list[_Row]] = {}
    folded: dict[str, _Row] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 5:
            continue
        job, *fields = (p.strip() for p in parts)
        row = _Row(*fields)
        if "_[" in job:
            folded.update({one: row for one in expand_array_ids(job)})
        else:
            records.setdefault(job, []).append(row)
    return records, folded


def merge_records(sacct_text: str, squeue_text: str | None, job_ids: list[str]) -> dict[str, JobRecord]:
    """{job id: JobRecord} from one sacct output (all records, -D) and one squeue output (None when
    squeue failed: then nothing is concluded from a job's absence). Ids neither knows are absent."""
    records, folded = parse_sacct_records(sacct_text)
    queue = parse_states(squeue_text) if squeue_text is not None else None
    out: dict[str, JobRecord] = {}
    # Arrays that Slurm still knows: a task of one that neither accounting nor the queue lists was
    # cancelled before it started (scancel of a pending task before accounting folded the array).
    known = {j.split("_")[0] for j in (*records, *folded, *(queue or {}))}
    for job in job_ids:
        rows = records.get(job) or ([folded[job]] if job in folded else [])
        live = queue.get(job) if queue is not None else None
        if live is None and not rows:
            if queue is not None and "_" in job and job.split("_")[0] in known:
                out[job] = JobRecord(state="PENDING", left_queue=True)
            continue
        last = rows[-1] if rows else None
        earlier = list(rows[:-1])
        if live is not None and last is not None and first_word(last.state) in REQUEUE_CAUSES \
                and first_word(live) != "COMPLETING":
            earlier = list(rows)  # requeued: the queue holds its next start, accounting has not recorded it yet
        history = tuple(f"{r.state} on {r.nodes}" if r.nodes and r.nodes != "None assigned" else r.state
                        for r in earlier)
        state = live or (last.state if last else "")
        left = live is None and queue is not None and first_word(state) in ("PENDING", "REQUEUED")
        started = next(((_epoch(r.start), datetime.now().timestamp() if r.end in ("Unknown", "None", "")
                         else _epoch(r.end), tuple(expand_nodelist(r.nodes)))
                        for r in reversed(rows) if r.start not in ("Unknown", "None", "")
                        and r.nodes and r.nodes != "None assigned"), None)
        out[job] = JobRecord(state=state, restarts=len(history), history=history, in_queue=live is not None,
                             left_queue=left, started=started)
    return out


def job_records(job_ids: list[str]) -> dict[str, JobRecord]:
    """One sacct call (every record of every job: requeues included) and one squeue call, whatever
    the number of jobs; see :func:`merge_records`."""
    if not job_ids:
        return {}
    arrays = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    acct = run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State,NodeList,Start,End", "-j", arrays])
    queue = call(["squeue", "-h", "-o", "%i|%T", "-j", arrays])
    return merge_records(acct, queue, job_ids)


def job_times(job_ids: list[str]) -> dict[str, tuple[float, float, list[str]]]:
    """{job id: (start epoch s, end epoch s, hosts)} of the jobs that have started, from one sacct call."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    return parse_sacct_times(run(["sacct", "-X", "-n", "-P", "-o", "JobID,Start,End,NodeList", "-j", ",".join(arrays)]))


def parse_sacct_times(text: str) -> dict[str, tuple[float, float, list[str]]]:
    """``JobID|Start|End|NodeList`` lines (sacct -X -n -P) -> {job id: (start_s, end_s, hosts)}; jobs that
    have not started are left out, and a running job ends now."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 4 or parts[1] in ("Unknown", "None", ""):
            continue
        job, start, end, nodes = parts
        end_s = datetime.now().timestamp() if end in ("Unknown", "None", "") else _epoch(end)
        if nodes and nodes != "None assigned":
            out[job] = (_epoch(start), end_s, expand_nodelist(nodes))
    return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
