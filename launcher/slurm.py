"""Direct Slurm queries: partitions (sinfo), job states (sacct), cancellation (scancel).

Submission itself goes through submitit only (launcher/submit.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

from jobs.dist import expand_nodelist
from launcher import fit
from launcher.plan import Cell, SweepError

__all__ = ["cancel", "check_partitions", "job_states", "max_array_size", "partitions"]


# Where Slurm's own commands look for their configuration (besides $SLURM_CONF), including the
# configless cache that slurmd keeps on a node.
CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
              "/run/slurm/conf/slurm.conf")


def configured() -> bool:
    return bool(os.environ.get("SLURM_CONF")) or any(Path(p).exists() for p in CONF_PATHS)


def partitions() -> dict[str, dict]:
    """{partition: {"nodes", "max_nodes", "default", "cpus", "mem_mb", "gpu_types"}} from sinfo."""
    if not shutil.which("sinfo"):
        raise SweepError("cluster=slurm: sinfo is not on PATH, so this machine cannot reach a Slurm cluster. "
                         "Fix: run from a login node (or export SLURM_CONF for the local test cluster), or use cluster=local.")
    if not configured():
        raise SweepError("cluster=slurm: no Slurm configuration on this machine (SLURM_CONF is not set and none of "
                         f"{', '.join(CONF_PATHS)} exists), and asking Slurm anyway would look its controller up in "
                         "DNS. Fix: export SLURM_CONF=/path/to/slurm.conf (the local test cluster prints it), or run "
                         "from a login node of the cluster.")
    proc = subprocess.run(["sinfo", "--noheader", "--format=%P|%D|%l|%c|%m|%G"], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        raise SweepError(f"cluster=slurm: sinfo failed ({proc.stderr.strip()}). Fix: check that Slurm answers "
                         f"(sinfo) before submitting.")
    out = parse_sinfo(proc.stdout)
    proc = subprocess.run(["scontrol", "show", "partition", "--oneliner"], capture_output=True, text=True, timeout=30)
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields.get("PartitionName", "")
        if name in out:
            max_nodes = fields.get("MaxNodes", "UNLIMITED")
            out[name]["max_nodes"] = None if max_nodes == "UNLIMITED" else int(max_nodes)
    return out


def parse_sinfo(text: str) -> dict[str, dict]:
    """Partitions from ``sinfo --format=%P|%D|%l|%c|%m|%G`` (one line per partition and node kind)."""
    out: dict[str, dict] = {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        name, nodes, _limit, cpus, mem_mb, gres = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = out.setdefault(name, {"nodes": 0, "default": default, "cpus": None, "mem_mb": None,
                                      "gpu_types": set()})
        entry["nodes"] += int(nodes)
        # gres such as "gpu:h100:8(S:0-1),nvme:1": the GPU models this kind of node holds.
        entry["gpu_types"] |= set(re.findall(r"(?:^|,)gpu:([A-Za-z][\w.-]*):\d", gres))
        node_cpus = int(cpus.rstrip("+")) if cpus.rstrip("+").isdigit() else None
        node_mem = int(mem_mb.rstrip("+")) if mem_mb.rstrip("+").isdigit() else None
        # The smallest node of the partition decides what every node can give.
        if node_cpus:
            entry["cpus"] = min(entry["cpus"] or node_cpus, node_cpus)
        if node_mem:
            entry["mem_mb"] = min(entry["mem_mb"] or node_mem, node_mem)
    return out


def check_partitions(cells: list[Cell]) -> None:
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
        if c.cpus_per_task is None and cell.layout.gpus_per_node and parts[name]["cpus"]:
            # A GPU rank needs cores for its DataLoader workers, NCCL's proxy threads and (offload) the
            # CPU optimizer: by default it gets its share of the node, not Slurm's single core.
            cell.layout.cpus_per_task = max(1, parts[name]["cpus"] // cell.layout.tasks_per_node)
        if c.mem_gb is None and cell.layout.gpus_per_node and parts[name]["mem_mb"]:
            # ... and its share of the node's memory (pinned host buffers, offloaded optimizer state).
            share = cell.layout.tasks_per_node / cell.layout.gpus_per_node
            c.mem_gb = int(parts[name]["mem_mb"] * share) / 1024  # whole MiB: never above the node
        if cell.layout.gpus_per_node:
            _gpu_memory(cell, name, parts[name]["gpu_types"], errors)
    if errors:
        raise SweepError("\n".join(errors))


def _gpu_memory(cell: Cell, partition: str, gpu_types: set[str], errors: list[str]) -> None:
    """The cell's GPU type must be one the partition has; its memory (or that of the partition's only
    GPU type) becomes cluster.gpu_mem_gib when none was given, so fit is checked against it."""
    c = cell.config.cluster
    if c.gpu_type and gpu_types and c.gpu_type not in gpu_types:
        errors.append(f"[{cell.name}] cluster.gpu_type={c.gpu_type}: partition {partition} has GPU type(s) "
                      f"{', '.join(sorted(gpu_types))} (sinfo's gres). Fix: use one of them, or another partition.")
        return
    types = {c.gpu_type} if c.gpu_type else gpu_types
    known = {fit.gpu_mem_gib_of(t) for t in types}
    if c.gpu_mem_gib is None and len(known) == 1 and None not in known:
        c.gpu_mem_gib = known.pop()


def _run(args: list[str]) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return proc.stdout if proc.returncode == 0 else ""


def expand_array_ids(job: str) -> list[str]:
    """``123_[0-2,5%4]`` -> 123_0, 123_1, 123_2, 123_5 (sacct and squeue fold pending array tasks)."""
    base, sep, rest = job.partition("_[")
    if not sep:
        return [job]
    ids: list[str] = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return ids


def parse_states(text: str) -> dict[str, str]:
    """``JobID|State`` lines (sacct -X -n -P, squeue -h -o '%i|%T') -> {job id: raw state}.

    A requeued job shows several records: the last one wins.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        job, state = line.split("|", 1)
        for one in expand_array_ids(job.strip()):
            states[one] = state.strip()
    return states


def job_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: Slurm state, e.g. RUNNING or "CANCELLED by 0"} from one sacct call, plus one squeue call
    for the ids sacct does not know yet (array tasks that have not started); ids neither knows are absent.
    launcher.state.slurm_status turns a state into a cell status."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    raw = parse_states(_run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(arrays)]))
    unknown = [j for j in job_ids if j not in raw]
    if unknown:
        queued = parse_states(_run(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(arrays)]))
        raw.update({j: queued[j] for j in unknown if j in queued})
    return {j: raw[j] for j in job_ids if j in raw}


def job_times(job_ids: list[str]) -> dict[str, tuple[float, float, list[str]]]:
    """{job id: (start epoch s, end epoch s, hosts)} of the jobs that have started, from one sacct call."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    return parse_sacct_times(_run(["sacct", "-X", "-n", "-P", "-o", "JobID,Start,End,NodeList", "-j", ",".join(arrays)]))


def parse_sacct_times(text: str) -> dict[str, tuple[float, float, list[str]]]:
    """``JobID|Start|End|NodeList`` lines (sacct -X -n -P) -> {job id: (start_s, end_s, hosts)}; jobs that
    have not started are left out, and a running job ends now."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 4 or parts[1] in ("Unknown", "None", ""):
            continue
        job, start, end, nodes = parts
        end_s = datetime.now().timestamp() if end in ("Unknown", "None", "") else _epoch(end)
        if nodes and nodes != "None assigned":
            out[job] = (_epoch(start), end_s, expand_nodelist(nodes))
    return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def max_array_size() -> int | None:
    """The cluster's MaxArraySize (``scontrol show config``): an array may hold that many tasks."""
    return parse_max_array_size(_run(["scontrol", "show", "config"]))


def parse_max_array_size(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return None


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
