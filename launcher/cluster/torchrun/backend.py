"""cluster=torchrun: one machine (a multi-GPU box, or CPU ranks on gloo) without a scheduler.

Each cell's ranks are started by ``torchrun --standalone --nproc-per-node N -m jobs spec.json``:
no pickle, the same command a user reproduces the cell with (its reproduce.sh). Cells run one
after another in the foreground, as on cluster=local (they share the machine), so the launcher logs
each cell's MLflow records itself; what follows a cell's end, its co-location evidence and its
failure classes are the local backend's, this machine's too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.cluster.base import ResourceCheck, Wording
from launcher.cluster.local.backend import LocalBackend
from launcher.cluster.torchrun import submit
from launcher.plan.cell import Cell
from launcher.state import SweepState

if TYPE_CHECKING:
    from launcher.cluster.interrupt import Interrupts


class TorchrunBackend(LocalBackend):
    name = "torchrun"
    words = Wording(where="on this machine", scheduler="torchrun", submitter="torchrun")

    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        submit.run(state, cells, self.rank_launch, after_each_cell, interrupts)  # after: ended already (run in the foreground)

    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """This machine's GPUs and memory (as cluster=local), and one node per cell: torchrun starts
        one machine's ranks here."""
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
