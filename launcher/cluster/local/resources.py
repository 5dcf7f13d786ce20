"""What this machine can give, asked before anything is created: its GPUs (nvidia-smi, no CUDA
initialisation here) and whether a memory cgroup can hold a cell's cluster.mem_gb.

:func:`check` is pure: it returns what it resolved for each cell and what is wrong, and changes no
cell; the caller (launcher/preflight.py) applies what was resolved.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from launcher.cluster.base import Resolved, ResourceCheck
from launcher.cluster.local import memlimit
from launcher.plan.cell import Cell


def check(cells: Sequence[Cell]) -> ResourceCheck:
    out = ResourceCheck()
    _gpus(cells, out)
    _memory(cells, out)
    return out


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


def _gpus(cells: Sequence[Cell], out: ResourceCheck) -> None:
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
    for cell in cells:  # fit is checked against the smallest GPU the cell may get
        if cell.layout.gpus_per_node and cell.cluster.gpu_mem_gib is None:
            out.resolved[cell.index] = Resolved(gpu_mem_gib=round(min(gib for _, gib in found), 1))


def _memory(cells: Sequence[Cell], out: ResourceCheck) -> None:
    """cluster.mem_gb on the local cluster is a memory cgroup per cell: refused where none can be made."""
    if not any(c.cluster.mem_gb for c in cells):
        return
    problem = memlimit.problem()
    if problem:
        out.errors.append(f"cluster.mem_gb: on cluster=local it is a memory cgroup around each cell, and {problem}. "
                          f"Fix: drop cluster.mem_gb (no host memory limit), run where memory cgroups can be created "
                          f"(root, or a delegated cgroup), or use cluster=slurm.")
