"""The local cluster: submitit's LocalExecutor, real processes on this machine, one cell at a time.

Cells run one after another in the foreground: they share this machine's cores, and two
benchmarks running at once would measure each other. The launcher waits for each cell anyway, so
it logs each cell's records into MLflow itself as the cell ends (the ranks import no MLflow).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster import memlimit, submit
from launcher.cluster.base import Allocation, Backend, JobTimes, alive
from launcher.cluster.failures import classify, first_failure
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from launcher.cluster.interrupt import Interrupts


class LocalBackend(Backend):
    name = "local"
    runs_cells_in_foreground = True
    ranks_log_to_tracking = False

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        submit.run_local(state, cells, after_each_cell, interrupts)  # after: ended already (foreground)

    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        return submit.run_local_probe(state.path / "submitit", cell.cluster, cell.layout, spec)

    def nodes_fingerprint(self, cells: Sequence[Cell]) -> str:
        """This machine and the CPUs its ranks may use."""
        return f"{socket.gethostname()}: {len(os.sched_getaffinity(0))} CPUs"

    def check_resources(self, cells: Sequence[Cell]) -> list[str]:
        """This machine has the GPUs the cells ask for (nvidia-smi), and a memory cgroup can be made
        for cluster.mem_gb."""
        errors: list[str] = []
        _local_gpus(cells, errors)
        _local_memory(cells, errors)
        return errors

    def max_array_size(self, cells: Sequence[Cell]) -> int | None:
        return None

    def describe_submission(self, cells: Sequence[Cell], folder: Path, max_array_size: int | None) -> list[str]:
        return [f"local: {len(cells)} job(s), one after another on this machine (submitit LocalExecutor)."]

    def update_cells(self, state: SweepState, cells: Sequence[Cell]) -> JobTimes:
        for cell in cells:
            if not cell.status.terminal:
                _follow(state, cell)
        return {}

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            try:
                os.kill(int(job_id), signal.SIGTERM)  # the local controller forwards it to its ranks
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
        return {}  # a local job id is a pid, which names nothing once the cell has ended

    def noise_floor_key(self, partition: str | None, gpu_type: str | None) -> str:
        return f"local:{socket.gethostname()}"


def _follow(state: SweepState, cell: Cell) -> None:
    """A local cell runs in the foreground of its launcher: a result means done; a live process
    running; anything else is a cell whose processes are gone."""
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


# ---- what this machine has: checked before anything is created ----------------------------------

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


def _local_gpus(cells: Sequence[Cell], errors: list[str]) -> None:
    wanted = max((c.layout.gpus_per_node * c.layout.nodes for c in cells), default=0)
    if not wanted:
        return
    found = visible_gpus()
    if len(found) < wanted:
        errors.append(f"cluster.gpus_per_node: the local cluster runs one rank per GPU and a cell needs {wanted} "
                      f"GPU(s) on this machine; nvidia-smi finds {len(found)}. Fix: lower cluster.gpus_per_node "
                      f"(and cluster.tasks_per_node) or nodes, use cluster=slurm, or cluster.gpus_per_node=0 for CPU "
                      f"ranks.")
        return
    for cell in cells:  # fit is checked against the smallest GPU the cell may get
        if cell.layout.gpus_per_node and cell.cluster.gpu_mem_gib is None:
            cell.cluster.gpu_mem_gib = round(min(gib for _, gib in found), 1)


def _local_memory(cells: Sequence[Cell], errors: list[str]) -> None:
    """cluster.mem_gb on the local cluster is a memory cgroup per cell: refused where none can be made."""
    if not any(c.cluster.mem_gb for c in cells):
        return
    problem = memlimit.problem()
    if problem:
        errors.append(f"cluster.mem_gb: on cluster=local it is a memory cgroup around each cell, and {problem}. "
                      f"Fix: drop cluster.mem_gb (no host memory limit), run where memory cgroups can be created "
                      f"(root, or a delegated cgroup), or use cluster=slurm.")
