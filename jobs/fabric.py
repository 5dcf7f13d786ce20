"""The fabric probe on the ranks: how fast the job's own ranks move bytes.

A job of its own, started from its spec file as a cell of the same shape is (``python -m jobs
probe-spec.json``, through the sweep's backend) and run before the cells, so it is inside no
measured window. For each scope (``intra_node``: the ranks of
one node; ``inter_node``: every rank, across nodes), each collective (all-reduce, all-gather,
reduce-scatter) and each message size it times ``iters`` back-to-back operations after
``warmup_iters``; the figures and the fit are nccl-tests' (contract/fabric.py).

Each rank also says which cores it really has (its CPU affinity and its cgroup's CPU quota), and the
result says where that, or emulated nodes, distorts a figure (:func:`distortions`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contract import records
from contract.fabric import COLLECTIVES, ELEMENT_BYTES, RESULT_FILE, SCOPES, ProbeSpec, fits, point, whole_count
from contract.spec import Layout

__all__ = ["COLLECTIVES", "RESULT_FILE", "SCOPES", "ProbeSpec", "main"]


# ---- the cores a rank really has ----------------------------------------------------------------

def parse_cpu_max(text: str) -> float | None:
    """cgroup v2's ``cpu.max`` (``"200000 100000"``: 2 CPUs; ``"max 100000"``: no limit) -> CPUs."""
    quota, _, period = text.strip().partition(" ")
    if quota in ("", "max") or not period:
        return None
    return int(quota) / int(period)


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (a quota of -1: no limit) -> CPUs."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def cgroup_paths(proc_self_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> {"v2": path} and/or {"v1": path of the cpu controller}."""
    out = {}
    for line in proc_self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            out["v2"] = path
        elif "cpu" in controllers.split(","):
            out["v1"] = path
    return out


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota this process's cgroup, or any cgroup above it, allows (the smallest); None: none."""
    try:
        paths = cgroup_paths(proc.read_text())
    except (OSError, ValueError):
        return None
    limits = []
    for version, path in paths.items():
        base = root if version == "v2" else next((root / d for d in ("cpu", "cpu,cpuacct") if (root / d).is_dir()), root)
        for level in [Path(path), *Path(path).parents]:
            limits.append(_cgroup_limit(base / str(level).lstrip("/"), version))
    found = [x for x in limits if x is not None]
    return min(found) if found else None


def _cgroup_limit(directory: Path, version: str) -> float | None:
    try:
        if version == "v2":
            return parse_cpu_max((directory / "cpu.max").read_text())
        return parse_cfs((directory / "cpu.cfs_quota_us").read_text(), (directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def rank_cores(rank: int, node: int, host: str, threads: int) -> dict[str, Any]:
    """What this rank may run on: its CPUs (affinity), its cgroup's quota, its torch threads."""
    from jobs.interference import kernel_id

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    return {"rank": rank, "node": node, "host": host, "kernel": kernel_id() or host, "cpus": cpus,
            "cgroup_cpus": cgroup_cpus(), "threads": threads}


def cores_per_rank(ranks: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per machine (ranks that share a kernel share its cores, whatever their host names): the CPUs
    its ranks may use together (their affinities' union, capped by the smallest cgroup quota), how
    many ranks share them, of how many nodes, and the cores each rank really has."""
    out: dict[str, dict[str, Any]] = {}
    for kernel in dict.fromkeys(r["kernel"] for r in ranks):
        mine = [r for r in ranks if r["kernel"] == kernel]
        cpus = float(len(set().union(*(r["cpus"] for r in mine))))
        quotas = [r["cgroup_cpus"] for r in mine if r["cgroup_cpus"]]
        cores = min([cpus, *quotas])
        out[kernel] = {"hosts": sorted({r["host"] for r in mine}), "cpus": cpus, "cgroup_cpus": min(quotas, default=None),
                       "ranks": len(mine), "nodes": len({r["node"] for r in mine}),
                       "threads_per_rank": max(r["threads"] for r in mine), "cores_per_rank": cores / len(mine)}
    return out


def distortions(machines: dict[str, dict[str, Any]], nodes: int) -> list[str]:
    """Where the figures are not the fabric's: emulated nodes on one machine, ranks sharing cores."""
    notes = []
    for m in machines.values():
        where = ", ".join(m["hosts"])
        if m["nodes"] > 1:
            notes.append(f"{m['nodes']} of the {nodes} nodes are emulated on one machine ({where}): the inter_node "
                         f"figures are copies between processes on it (loopback), not a network.")
        if m["cores_per_rank"] < 1:
            notes.append(f"{m['ranks']} ranks share {m['cpus']:g} CPUs on {where}"
                         + (f" (cgroup quota {m['cgroup_cpus']:g})" if m["cgroup_cpus"] else "")
                         + f": {m['cores_per_rank']:.2g} core per rank, so every time includes waiting for a core "
                           f"and the bandwidths are those of shared cores, not of the link.")
    return notes


# ---- the probe on the ranks ---------------------------------------------------------------------

def main(spec: ProbeSpec) -> dict[str, Any]:
    """Measure every scope this shape has; rank 0 writes the result (fabric.json) and returns it."""
    entered = time.perf_counter()

    import torch

    from jobs.dist import DistEnv, backend_for, process_group, resolve_device

    env = DistEnv.detect(os.environ)
    torch.set_num_threads(max(1, spec.layout.cpus_per_task))
    device, backend = resolve_device(spec.layout.gpus_per_node, env)
    with process_group(env, backend_for(device.type), timeout_s=spec.collective_timeout_s,
                       device=device if device.type == "cuda" else None):
        started = time.perf_counter()
        points = measure_scopes(spec, env, device)
        probe_s = time.perf_counter() - started
        cores = _gathered(rank_cores(env.rank, env.node_rank, env.hostname, torch.get_num_threads()))
    result = describe(spec, points, cores, probe_s, backend, device, torch.__version__)
    result["job_s"] = time.perf_counter() - entered  # torch's import, the process group, the collectives
    if env.is_head:
        out = Path(spec.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        records.write_document(out / RESULT_FILE, result)
    return result


def describe(spec: ProbeSpec, points: list[dict[str, Any]], cores: list[dict[str, Any]], probe_s: float,
             backend: str, device, torch_version: str) -> dict[str, Any]:
    """The probe's result: what ran, the table, the fits, the cores, and what distorts them."""
    machines = cores_per_rank(cores)
    return {"shape": {"nodes": spec.layout.nodes, "tasks_per_node": spec.layout.tasks_per_node,
                      "gpus_per_node": spec.layout.gpus_per_node},
            "backend": backend, "device": device.type, "torch": torch_version, "nccl": _nccl_version(device),
            "iters": spec.iters, "warmup_iters": spec.warmup_iters, "probe_s": probe_s,
            "points": points, "fits": fits(points), "cores": cores, "machines": machines,
            "cores_per_rank": min(m["cores_per_rank"] for m in machines.values()),
            "distortions": distortions(machines, spec.layout.nodes),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def scope_members(layout: Layout) -> dict[str, list[int]]:
    """The ranks of each scope this shape has: node 0's ranks, and every rank when there are nodes
    to cross. A scope of one rank moves nothing and is left out."""
    scopes = {"intra_node": list(range(layout.tasks_per_node)), "inter_node": list(range(layout.world_size))}
    if layout.nodes < 2:
        scopes.pop("inter_node")
    return {name: ranks for name, ranks in scopes.items() if len(ranks) > 1}


def measure_scopes(spec: ProbeSpec, env, device) -> list[dict[str, Any]]:
    """Every scope in turn; the ranks outside a scope wait at a barrier meanwhile (node 0 alone
    stands for every node: the nodes are alike, and on one machine their emulations would compete)."""
    import torch.distributed as dist

    points: list[dict[str, Any]] = []
    for scope, members in scope_members(spec.layout).items():
        # new_group is collective over the world: every rank makes every group, members or not.
        group = None if len(members) == env.world_size else dist.new_group(ranks=members)
        if env.rank in members:
            for collective in COLLECTIVES:
                for size in spec.sizes_bytes:
                    seconds = time_collective(collective, group, len(members), size, spec, device)
                    points.append(point(collective, scope, len(members), whole_count(size, len(members)) * ELEMENT_BYTES, seconds))
        dist.barrier()  # a sync point: the next scope starts on idle ranks
    return points


def time_collective(collective: str, group, ranks: int, size_bytes: int, spec: ProbeSpec, device) -> float:
    """The average time of one operation: ``iters`` back to back after ``warmup_iters``, the loop's
    time over ``iters``, then averaged over the group's ranks (outside the timed loop)."""
    import torch
    import torch.distributed as dist

    run = _operation(collective, group, ranks, whole_count(size_bytes, ranks), device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(spec.warmup_iters):
        run()
    sync()
    dist.barrier(group=group)  # a sync point: every rank starts the timed loop together
    started = time.perf_counter()
    for _ in range(spec.iters):
        run()
    sync()  # a sync point: CUDA collectives are asynchronous until here
    mine = torch.tensor([(time.perf_counter() - started) / spec.iters], dtype=torch.float64, device=device)
    dist.all_reduce(mine, group=group)
    return float(mine.item()) / ranks  # .item(): a sync point, after the timing


def _operation(collective: str, group, ranks: int, count: int, device) -> Callable[[], Any]:
    """One call of ``collective`` on buffers of the whole array's ``count`` float32 elements."""
    import torch
    import torch.distributed as dist

    whole = torch.ones(count, dtype=torch.float32, device=device)
    part = torch.ones(count // ranks, dtype=torch.float32, device=device)
    # torch 2.13 names them *_single; 2.6-2.12 have only *_tensor (the same operation).
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if collective == "all_reduce":
        return lambda: dist.all_reduce(whole, group=group)
    if collective == "all_gather":
        return lambda: gather(whole, part, group=group)
    return lambda: scatter(part, whole, group=group)


def _gathered(mine: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _nccl_version(device) -> str | None:
    if device.type != "cuda":
        return None
    import torch

    return ".".join(map(str, torch.cuda.nccl.version()))
