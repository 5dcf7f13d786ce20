"""The local cluster: submitit's LocalExecutor, real processes on this machine, one cell at a time.

Cells run one after another in the foreground: they share this machine's cores, and two
benchmarks running at once would measure each other. What follows a cell's end (its state, its
co-location evidence, its failure class) is every one-machine backend's
(launcher/cluster/onemachine.py); what is this backend's own is how a cell starts (submit.py: a
memory cgroup per cell, submitit's local executor) and the memory check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster.base import ResourceCheck, Wording
from launcher.cluster.local import resources, submit
from launcher.cluster.onemachine import OneMachineBackend
from launcher.plan.cell import Cell
from launcher.state import SweepState

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from contract.health import NodeProbeSpec
    from contract.spec import Layout
    from launcher.cluster.interrupt import Interrupts
    from launcher.plan.clusterschema import ClusterConfig


class LocalBackend(OneMachineBackend):
    name = "local"
    words = Wording(where="on this machine", scheduler="the local executor", submitter="submitit's local executor")

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        submit.run(state, cells, after_each_cell, interrupts)  # after: ended already (run in the foreground)

    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        return submit.run_probe(state.path / "submitit", cell.cluster, cell.layout, spec)

    def run_health(self, folder: Path, cluster: ClusterConfig, layout: Layout, spec: NodeProbeSpec,
                   nodes: Sequence[str]) -> tuple[str | None, str | None]:
        return submit.run_probe(folder, cluster, layout, spec)  # nodes: this machine, emulated

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """This machine has the GPUs the cells ask for (nvidia-smi), and a memory cgroup can be made
        for cluster.mem_gb."""
        out = super().check_resources(cells)
        resources.check_memory(cells, out)
        return out

    def describe_submission(self, cells: Sequence[Cell], folder: Path, max_array_size: int | None) -> list[str]:
        return [f"local: {len(cells)} job(s), one after another on this machine (submitit LocalExecutor)."]
