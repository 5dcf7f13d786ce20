"""What the backends that run every rank on this one machine share (cluster=local, cluster=torchrun):
cells one after another in the foreground, their state read from their directories, this machine's
GPUs (nvidia-smi), its host name as the only node and as the key its records are kept under.

Each of those backends subclasses :class:`OneMachineBackend` (never another backend), and adds how it
starts a cell's ranks (its own ``submit`` module) and what else it checks. Nothing here names a node
or keeps one out: one machine has nothing to choose from.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from launcher.cluster.base import Allocation, Backend, JobTimes, Resolved, ResourceCheck, alive
from launcher.cluster.failures import classify, first_failure
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

if TYPE_CHECKING:
    from launcher.plan.clusterschema import ClusterConfig


class OneMachineBackend(Backend):
    """The parts of a backend that runs each cell to its end on this machine, the launcher waiting
    for it: it logs each cell's MLflow records itself as the cell ends (the ranks import no MLflow)."""

    runs_cells_in_foreground = True
    ranks_log_to_tracking = False

    def health_nodes(self, cluster: ClusterConfig, whole_pool: bool = False) -> list[str]:
        return [socket.gethostname()]  # one machine; more nodes are emulated on it (health.nodes)

    def excluding(self, cell: Cell, nodes: Collection[str]) -> None:
        """Nothing to keep out: every rank runs here (health=auto is refused on one machine)."""

    def placing_apart(self, cell: Cell, used: Collection[str], seen: Collection[str]) -> None:
        """Every run lands on this machine: no placement to make, none copied to keep."""
        cell.placed = None

    def nodes_fingerprint(self, cells: Sequence[Cell]) -> str:
        """This machine and the CPUs its ranks may use."""
        return f"{socket.gethostname()}: {len(os.sched_getaffinity(0))} CPUs"

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """This machine has the GPUs the cells ask for (nvidia-smi); a backend adds its own checks."""
        out = ResourceCheck()
        check_gpus(cells, out)
        return out

    def max_array_size(self, cells: Sequence[Cell]) -> int | None:
        return None

    def update_cells(self, state: SweepState, cells: Sequence[Cell]) -> JobTimes:
        for cell in cells:
            if not cell.status.terminal:
                _follow(state, cell)
        return {}

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            try:
                os.kill(int(job_id), signal.SIGTERM)  # the cell's controller (or torchrun) passes it to its ranks
            except (OSError, ValueError):
                pass

    def allocations(self, state: SweepState, cells: Sequence[Cell], times: JobTimes | None) -> list[Allocation]:
        """Each cell's first step to the moment its result was written, on the hosts its ranks reported."""
        out = []
        for cell in cells:
            path = state.cell_dir(cell) / "result.json"
            if not path.exists():
                continue
            result = state.read_result(cell)
            start_s = result.get("first_step_unix_s")
            if isinstance(start_s, (int, float)):
                out.append(Allocation(cell.index, frozenset(result.get("rank_hosts") or []), start_s,
                                      path.stat().st_mtime))
        return out

    def job_tags(self, cell: Cell) -> dict[str, str]:
        return {}  # a job id here is a pid, which names nothing once the cell has ended

    def noise_floor_key(self, cluster: ClusterConfig) -> str:
        """``local:<host>``, whichever one-machine backend ran the cells: the same machine's noise."""
        return f"local:{socket.gethostname()}"


def _follow(state: SweepState, cell: Cell) -> None:
    """A cell runs in the foreground of its launcher: a result means done; a live process running;
    anything else is a cell whose processes are gone."""
    if (state.cell_dir(cell) / "result.json").exists():
        status = CellStatus.done
    elif alive(cell.job_id):
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


def visible_gpus() -> list[tuple[str, float]]:
    """(name, memory GiB) of each GPU on this machine, from nvidia-smi (no CUDA initialisation here)."""
    if not shutil.which("nvidia-smi"):
        return []
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30)
    return parse_gpu_query(proc.stdout) if proc.returncode == 0 else []


def parse_gpu_query(text: str) -> list[tuple[str, float]]:
    """``NVIDIA H100 80GB HBM3, 81559`` lines (memory in MiB) -> [(name, GiB)]."""
    gpus = []
    for line in text.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append((name.strip(), int(mib) / 1024))
    return gpus


def check_gpus(cells: Sequence[Cell], out: ResourceCheck) -> None:
    """One rank per GPU: the cells' GPUs must be here; each GPU cell's fit is checked against the
    smallest GPU it may get."""
    wanted = max((c.layout.gpus_per_node * c.layout.nodes for c in cells), default=0)
    if not wanted:
        return
    found = visible_gpus()
    if len(found) < wanted:
        out.errors.append(f"cluster.gpus_per_node: the local cluster runs one rank per GPU and a cell needs {wanted} "
                          f"GPU(s) on this machine; nvidia-smi finds {len(found)}. Fix: lower cluster.gpus_per_node "
                          f"(and cluster.tasks_per_node) or nodes, use cluster=slurm, or cluster.gpus_per_node=0 for CPU "
                          f"ranks.")
        return
    for cell in cells:
        if cell.layout.gpus_per_node and cell.cluster.gpu_mem_gib is None:
            out.resolved[cell.index] = Resolved(gpu_mem_gib=round(min(gib for _, gib in found), 1))
