"""cluster=torchrun: one machine (a multi-GPU box, or CPU ranks on gloo) without a scheduler.

Each cell's ranks are started by ``torchrun --standalone --nproc-per-node N -m jobs spec.json``:
no pickle, the same command a user reproduces the cell with (its reproduce.sh); the fabric and
node-health probes start the same way, from their spec files. How a launch command's ranks run as
one process group, to their end, a stop or their time limit, is every one-machine backend's
without submitit (launcher/cluster/processes.py); what follows a cell's end, its co-location
evidence and its failure classes are every one-machine backend's (launcher/cluster/onemachine.py).
Cells run one after another in the foreground (they share the machine), so the launcher logs each
cell's MLflow records itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster import processes
from launcher.cluster.base import ResourceCheck, Wording, torchrun_launch
from launcher.cluster.onemachine import OneMachineBackend
from launcher.plan.cell import Cell
from launcher.state import SweepState

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from contract.health import NodeProbeSpec
    from contract.spec import Layout
    from launcher.cluster.interrupt import Interrupts
    from launcher.plan.clusterschema import ClusterConfig


class TorchrunBackend(OneMachineBackend):
    name = "torchrun"
    words = Wording(where="on this machine", scheduler="torchrun", submitter="torchrun")

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        processes.run_cells(state, cells, self.rank_launch, after_each_cell, interrupts)  # after: ended already

    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        return processes.run_probe(Path(spec.out_dir), cell.cluster, torchrun_launch(cell.cluster, cell.world_size), spec)

    def run_health(self, folder: Path, cluster: ClusterConfig, layout: Layout, spec: NodeProbeSpec,
                   nodes: Sequence[str]) -> tuple[str | None, str | None]:
        """Every emulated node a process of one torchrun (``python -m jobs`` regroups them)."""
        return processes.run_probe(folder, cluster, torchrun_launch(cluster, layout.world_size), spec)

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """This machine's GPUs (as every one-machine backend's), and one node per cell with no memory
        limit: torchrun starts one machine's ranks here, with no cgroup around them."""
        out = super().check_resources(cells)
        if any(c.cluster.mem_gb for c in cells):
            out.errors.append("cluster.mem_gb is set: cluster=torchrun puts no memory limit around a cell. Fix: drop "
                              "it (cluster.mem_gb=null), or use cluster=local, which runs each cell in a memory cgroup.")
        for nodes in sorted({c.layout.nodes for c in cells if c.layout.nodes > 1}):
            out.errors.append(f"nodes={nodes}: cluster=torchrun runs a cell's ranks on this one machine. Fix: use "
                              f"nodes=1 with cluster.tasks_per_node ranks, or cluster=local to emulate {nodes} nodes "
                              f"here, or cluster=slurm.")
        return out

    def describe_submission(self, cells: Sequence[Cell], folder: Path, max_array_size: int | None) -> list[str]:
        return [f"torchrun: {len(cells)} cell(s), one after another on this machine, each as "
                f"`{self.rank_launch(cells[0]) if cells else 'torchrun -m jobs'} <cell>/spec.json`."]
