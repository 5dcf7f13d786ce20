"""What this machine can give cluster=local beyond its GPUs (launcher/cluster/onemachine.py): whether
a memory cgroup can hold a cell's cluster.mem_gb, asked before anything is created.

:func:`check_memory` is pure: it adds what is wrong and changes no cell.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.cluster.base import ResourceCheck
from launcher.cluster.local import memlimit
from launcher.plan.cell import Cell


def check_memory(cells: Sequence[Cell], out: ResourceCheck) -> None:
    """cluster.mem_gb on the local cluster is a memory cgroup per cell: refused where none can be made."""
    if not any(c.cluster.mem_gb for c in cells):
        return
    problem = memlimit.problem()
    if problem:
        out.errors.append(f"cluster.mem_gb: on cluster=local it is a memory cgroup around each cell, and {problem}. "
                          f"Fix: drop cluster.mem_gb (no host memory limit), run where memory cgroups can be created "
                          f"(root, or a delegated cgroup), or use cluster=slurm.")
