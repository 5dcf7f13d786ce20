"""Host memory limits for local cells: what ``--mem`` is on Slurm, a memory cgroup on this machine.

A local cell with ``cluster.mem_gb`` runs inside its own memory cgroup (cgroup v1's memory
controller, or v2 with memory delegated), created under this process's own cgroup so that
limits nest. The job's controller joins it before it starts the ranks (submitit's local
``setup`` line), so every rank and everything it allocates counts, as under Slurm's
``ConstrainRAMSpace``. When the limit is hit the kernel's OOM killer ends a rank, and the
cgroup's own ``oom_kill`` counter is the evidence the failure class reads (as sacct's
``OUT_OF_MEMORY`` is on Slurm). Where no memory cgroup can be created the setting is refused
before submission (:func:`problem`), never silently dropped.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "ddp-fsdp-bench-"


def own_cgroup() -> tuple[Path, int] | None:
    """(this process's memory cgroup directory, cgroup version) or None where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "4:memory:/path"
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = ROOT / "memory" / path.lstrip("/")
            if (directory / "memory.limit_in_bytes").exists():
                return directory, 1
    for line in lines:  # v2: "0::/path", memory delegated to children
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            for base in (ROOT, ROOT / "unified"):
                directory = base / path.lstrip("/")
                try:
                    delegated = "memory" in (directory / "cgroup.subtree_control").read_text().split()
                except OSError:
                    continue
                if delegated:
                    return directory, 2
    return None


def problem() -> str | None:
    """Why a memory cgroup cannot be created here, or None when one can."""
    parent = own_cgroup()
    if parent is None:
        return ("no memory cgroup this process may use was found (/proc/self/cgroup names no cgroup v1 memory "
                "controller, nor a v2 cgroup with memory in cgroup.subtree_control)")
    if not os.access(parent[0], os.W_OK):
        return f"this user may not create a cgroup under {parent[0]}"
    return None


def create(limit_gib: float) -> Path:
    """A new memory cgroup capped at ``limit_gib``; raises OSError where that is not possible."""
    parent = own_cgroup()
    if parent is None:
        raise OSError(problem())
    directory, version = parent
    cgroup = directory / f"{PREFIX}{uuid.uuid4().hex[:12]}"
    cgroup.mkdir()
    limit_bytes = str(int(limit_gib * 1024**3))
    if version == 1:
        (cgroup / "memory.limit_in_bytes").write_text(limit_bytes)
        # Swap would turn an out-of-memory failure into a slow benchmark: cap memory and swap alike.
        memsw = cgroup / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(limit_bytes)
    else:
        (cgroup / "memory.max").write_text(limit_bytes)
        if (cgroup / "memory.swap.max").exists():
            (cgroup / "memory.swap.max").write_text("0")
    return cgroup


def join_line(cgroup: Path) -> str:
    """The shell line that moves the job's shell, and so everything it starts, into ``cgroup``."""
    return f"echo $$ > {cgroup / 'cgroup.procs'}"


def oom_kills(cgroup: Path) -> int:
    """How many processes the kernel's OOM killer ended inside ``cgroup`` (0 when unknown)."""
    for name in ("memory.oom_control", "memory.events"):  # v1, v2
        try:
            found = re.search(r"^oom_kill (\d+)$", (cgroup / name).read_text(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return 0


def remove(cgroup: Path) -> None:
    """Remove ``cgroup`` once its processes are gone (left in place if one still lives)."""
    try:
        cgroup.rmdir()
    except OSError:
        pass
