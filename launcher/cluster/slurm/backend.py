"""Slurm: one sbatch per group of cells (job arrays), states from sacct and squeue, scancel.

Slurm cells run in the background of the launcher: the ranks log into MLflow themselves, to runs
created before submission. Every Slurm cell with a job is moved to the state Slurm last gave it,
finished or not: a cell that looked failed when its node went down and was then requeued is
pending, running, then done. The rules:

- ``done`` exactly when the job completed and the cell's ``result.json`` exists;
- ``cancelled`` when the job was cancelled (by ``launcher.status --cancel``, by hand with scancel,
  or left the queue before it started) or stopped at its time limit; the reason is its ``error``;
- ``failed`` (with its failure class) when it ended any other way, ``lost`` when neither the
  queue nor accounting knows it long after its submission;
- ``restarts`` and ``history``: the requeues that accounting recorded, and what ended each start.
"""

from __future__ import annotations

import dataclasses
import pwd
import shlex
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster.base import (
    CANCELLED_BY_LAUNCHER,
    Allocation,
    Backend,
    JobTimes,
    Resolved,
    ResourceCheck,
    Wording,
)
from launcher.cluster.failures import first_failure
from launcher.cluster.slurm import accounting, resources, settings, spread, submit
from launcher.cluster.slurm.accounting import JobRecord, first_word, slurm_status
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from contract.health import NodeProbeSpec
    from contract.spec import Layout
    from launcher.cluster.interrupt import Interrupts
    from launcher.plan.clusterschema import ClusterConfig

# A submitted job that neither squeue nor sacct knows after this long is lost (accounting lags the
# queue by a second or two; a purged or never-recorded job stays unknown for good).
LOST_AFTER_S = 120.0
# Above this many cells a Slurm sweep creates its MLflow runs in a background process: SQLite takes
# ~60 ms per run, a minute for 1000 cells, and the login-node command should return in seconds.
BACKGROUND_RUNS_ABOVE = 50


class SlurmBackend(Backend):
    name = "slurm"
    words = Wording(where="in Slurm", scheduler="Slurm", submitter="sbatch")
    runs_cells_in_foreground = False
    ranks_log_to_tracking = True

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        submit.submit(state, cells, self.max_array_size(cells), after)

    def rank_launch(self, cell: Cell) -> str:
        """One task per rank in an allocation of the cell's shape (salloc, or an sbatch script), each
        translating Slurm's variables before ``python -m jobs`` (launcher/cluster/slurm/ranks.py)."""
        c, lay = cell.cluster, cell.layout
        gpus = f" --gpus-per-node={c.gpus_per_node}" if c.gpus_per_node else ""
        extra = "".join(f" {shlex.quote(a)}" for a in settings.of(c).srun_args)
        return (f"srun --nodes={lay.nodes} --ntasks-per-node={lay.tasks_per_node} "
                f"--cpus-per-task={lay.cpus_per_task}{gpus}{extra} {c.python_command()} -m launcher.cluster.slurm.ranks")

    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        return submit.submit_probe(state.path / "submitit", settings.of(cell.cluster), cell.layout, f"{state.name}-fabric", spec)

    def run_health(self, folder: Path, cluster: ClusterConfig, layout: Layout, spec: NodeProbeSpec,
                   nodes: Sequence[str]) -> tuple[str | None, str | None]:
        """One job on exactly ``nodes`` (sbatch --nodelist), with the sweep's other settings."""
        on_nodes = dataclasses.replace(settings.of(cluster), nodelist=",".join(nodes), exclude=None)
        return submit.run_node_probe(folder, on_nodes, layout, spec)

    def health_nodes(self, cluster: ClusterConfig, whole_pool: bool = False) -> list[str]:
        """cluster.nodelist's nodes, else (or ``whole_pool``) the partition's that take jobs (sinfo);
        less cluster.exclude's."""
        c = settings.of(cluster)
        nodes = (expand_nodelist(c.nodelist) if c.nodelist and not whole_pool
                 else resources.schedulable_nodes().get(c.partition, []))
        excluded = set(expand_nodelist(c.exclude)) if c.exclude else set()
        return [n for n in nodes if n not in excluded]

    def excluding(self, cell: Cell, nodes: Collection[str]) -> None:
        """Added to cluster.exclude (sbatch --exclude); a cluster.nodelist holding one is dropped."""
        spread.keep_out(cell, nodes)

    def placing_apart(self, cell: Cell, used: Collection[str], seen: Collection[str]) -> None:
        """cluster.exclude of the nodes used (launcher/cluster/slurm/spread.py)."""
        spread.exclude_used(cell, used, seen)

    def nodes_fingerprint(self, cells: Sequence[Cell]) -> str:
        """The partitions' nodes, as sinfo names and describes them (CPUs, memory, GPUs)."""
        return resources.partition_nodes({settings.of(c.cluster).partition for c in cells})

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """The partitions hold the cells (sinfo): nodes, GPUs, cores, memory, node lists, account and QoS;
        a GPU cell's cores, memory and GPU memory are resolved from its partition, and the runs of each
        grid point are spread over the partition's nodes (launcher/cluster/slurm/spread.py)."""
        found = resources.check(cells)
        if not found.errors and spread.repeated(cells):
            for index, nodelist in spread.rotation(cells, resources.schedulable_nodes()).items():
                found.resolved.setdefault(index, Resolved()).placement = {"nodelist": nodelist}
        return found

    def max_array_size(self, cells: Sequence[Cell]) -> int | None:
        """The cells' own cluster.max_array_size where set, else the cluster's MaxArraySize."""
        configured = [size for c in cells if (size := settings.of(c.cluster).max_array_size)]
        return min(configured) if configured else resources.max_array_size()

    def describe_submission(self, cells: Sequence[Cell], folder: Path, max_array_size: int | None) -> list[str]:
        """Each sbatch call with the script submitit would write for it."""
        calls = submit.groups(cells, max_array_size)
        lines = [f"slurm: {len(calls)} sbatch call(s)" + (f" (arrays split at MaxArraySize {max_array_size})"
                                                         if max_array_size else "") + ":"]
        for i, group in enumerate(calls, 1):
            lines += ["", f"--- sbatch call {i}: array of {len(group)}: cells {', '.join(str(c.index) for c in group)}",
                      submit.sbatch_script(group, folder, "<sweep name>").rstrip()]
        return lines

    def update_cells(self, state: SweepState, cells: Sequence[Cell]) -> JobTimes:
        """One sacct call (every accounting record of every job: requeues included) and one squeue
        call, whatever the number of cells."""
        records = accounting.job_records([c.job_id for c in cells if c.job_id])
        for cell in cells:
            if cell.job_id:
                _follow(state, cell, records.get(cell.job_id))
        return {job: (r.started[0], r.started[1], list(r.started[2])) for job, r in records.items() if r.started}

    def cancel(self, job_ids: Sequence[str]) -> None:
        accounting.cancel(list(job_ids))

    def allocations(self, state: SweepState, cells: Sequence[Cell], times: JobTimes | None) -> list[Allocation]:
        """sacct's Start, End and NodeList of every cell's job."""
        if times is None:
            times = accounting.job_times([c.job_id for c in cells if c.job_id])
        return [Allocation(c.index, frozenset(times[c.job_id][2]), times[c.job_id][0], times[c.job_id][1])
                for c in cells if c.job_id in times]

    def job_tags(self, cell: Cell) -> dict[str, str]:
        return {"slurm_job_id": cell.job_id} if cell.job_id else {}

    def noise_floor_key(self, cluster: ClusterConfig) -> str:
        """``slurm:<partition>[:<gpu type>]``."""
        c = settings.of(cluster)
        return f"slurm:{c.partition or 'default'}" + (f":{c.gpu_type}" if c.gpu_type else "")

    def creates_runs_in_background(self, cell_count: int) -> bool:
        return cell_count > BACKGROUND_RUNS_ABOVE


def _follow(state: SweepState, cell: Cell, record: JobRecord | None) -> None:
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


def _set(state: SweepState, cell: Cell, status: CellStatus, record: JobRecord | None) -> None:
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
        cell.failure_class = accounting.failure_class(state.cell_dir(cell), raw, cell.error)


def _cancel_reason(cell: Cell, record: JobRecord | None) -> str:
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

