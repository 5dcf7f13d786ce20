"""The local cluster: submitit's LocalExecutor, real processes on this machine, one cell at a time.

Cells run one after another in the foreground: they share this machine's cores, and two
benchmarks running at once would measure each other. The launcher waits for each cell anyway, so
it logs each cell's records into MLflow itself as the cell ends (the ranks import no MLflow).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster.base import Allocation, Backend, JobTimes, ResourceCheck, Wording, alive
from launcher.cluster.failures import classify, first_failure
from launcher.cluster.local import resources, submit
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from contract.health import NodeProbeSpec
    from contract.spec import Layout
    from launcher.cluster.interrupt import Interrupts
    from launcher.plan.clusterschema import ClusterConfig


class LocalBackend(Backend):
    name = "local"
    words = Wording(where="on this machine", scheduler="the local executor", submitter="submitit's local executor")
    runs_cells_in_foreground = True
    ranks_log_to_tracking = False

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        submit.run(state, cells, after_each_cell, interrupts)  # after: ended already (run in the foreground)

    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        return submit.run_probe(state.path / "submitit", cell.cluster, cell.layout, spec)

    def run_health(self, folder: Path, cluster: ClusterConfig, layout: Layout, spec: NodeProbeSpec
                   ) -> tuple[str | None, str | None]:
        return submit.run_node_probe(folder, cluster, layout, spec)

    def health_nodes(self, partition: str | None, nodelist: str | None) -> list[str]:
        return [socket.gethostname()]  # one machine; more nodes are emulated on it (health.nodes)

    def nodes_fingerprint(self, cells: Sequence[Cell]) -> str:
        """This machine and the CPUs its ranks may use."""
        return f"{socket.gethostname()}: {len(os.sched_getaffinity(0))} CPUs"

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """This machine has the GPUs the cells ask for (nvidia-smi), and a memory cgroup can be made
        for cluster.mem_gb."""
        return resources.check(cells)

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
