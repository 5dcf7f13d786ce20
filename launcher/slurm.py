"""Direct Slurm queries: partitions (sinfo), job states (sacct), cancellation (scancel).

Submission itself goes through submitit only (launcher/submit.py).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Dict, List

from launcher.plan import Cell, SweepError

__all__ = ["cancel", "check_partitions", "job_states", "partitions"]


def partitions() -> Dict[str, dict]:
    """{partition: {"nodes": int, "max_nodes": int|None, "default": bool}} from sinfo."""
    if not shutil.which("sinfo"):
        raise SweepError("cluster=slurm: sinfo is not on PATH, so this machine cannot reach a Slurm cluster. "
                         "Fix: run from a login node (or export SLURM_CONF for the local test cluster), or use cluster=local.")
    proc = subprocess.run(["sinfo", "--noheader", "--format=%P|%D|%l"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SweepError(f"cluster=slurm: sinfo failed ({proc.stderr.strip()}). Fix: check that Slurm answers "
                         f"(sinfo) before submitting.")
    out: Dict[str, dict] = {}
    for line in proc.stdout.split("\n"):
        if not line.strip():
            continue
        name, nodes, _limit = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = out.setdefault(name, {"nodes": 0, "default": default})
        entry["nodes"] += int(nodes)
    proc = subprocess.run(["scontrol", "show", "partition", "--oneliner"], capture_output=True, text=True, timeout=30)
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields.get("PartitionName")
        if name in out:
            max_nodes = fields.get("MaxNodes", "UNLIMITED")
            out[name]["max_nodes"] = None if max_nodes == "UNLIMITED" else int(max_nodes)
    return out


def check_partitions(cells: List[Cell]) -> None:
    parts = partitions()
    errors = []
    for cell in cells:
        c = cell.config.cluster
        name = c.partition or next((p for p, v in parts.items() if v["default"]), None)
        if name not in parts:
            errors.append(f"[{cell.name}] cluster.partition={c.partition!r}: no such partition on this cluster. "
                          f"Fix: use one of {', '.join(sorted(parts))}.")
            continue
        limit = min(x for x in (parts[name]["nodes"], parts[name].get("max_nodes")) if x is not None)
        if cell.layout.nodes > limit:
            errors.append(f"[{cell.name}] nodes={cell.layout.nodes}: partition {name} allows at most {limit} "
                          f"node(s) per job. Fix: use nodes<={limit} or another partition.")
    if errors:
        raise SweepError("\n".join(errors))


# Slurm job states (sacct) -> the sweep's cell states.
_STATES = {
    "PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
    "CONFIGURING": "pending", "RESIZING": "pending", "SUSPENDED": "pending",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "COMPLETED": "completed", "CANCELLED": "cancelled", "FAILED": "failed", "TIMEOUT": "failed",
    "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed",
    "PREEMPTED": "pending",  # preempted jobs are requeued (--requeue)
}


def job_states(job_ids: List[str]) -> Dict[str, str]:
    """{job id: pending|running|completed|failed|cancelled} with one sacct call; unknown ids absent."""
    if not job_ids:
        return {}
    proc = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                          capture_output=True, text=True, timeout=60)
    states: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if "|" not in line:
            continue
        job, state = line.split("|", 1)
        # "CANCELLED by 0" -> CANCELLED. A requeued job shows several records: the last wins.
        states[job] = _STATES.get(state.split()[0].rstrip("+"), "failed")
    return states


def cancel(job_ids: List[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
