"""The rank layout, read once, and the process group built from it.

This module is the ONLY reader of the rank's variables; everything else receives the frozen
:class:`DistEnv`. It reads no scheduler's own variables (no SLURM_*): a backend gives its ranks
torchrun's (contract/rank_env.py; Slurm's are translated in launcher/cluster/slurm/ranks.py, submitit's
local executor's in launcher/cluster/local/ranks.py).
Sources, in priority order:

1. torchrun's variables (TORCHELASTIC_RUN_ID, or RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT
   all set): from torchrun, or from a backend that translated its scheduler's (``DDP_BENCH_LAUNCHER``
   names it; its job id, node name and requeue command come beside them).
   The local cluster's are translated too (launcher/cluster/local/ranks.py: its emulated nodes
   are groups of ``tasks_per_node`` consecutive ranks, as a real cluster numbers them).
2. Nothing: a single process.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from contract import rank_env

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    hostname: str = "localhost"
    job_id: str = ""
    source: str = "single"  # torchrun | slurm (translated by its backend) | submitit-local | single
    # The command that requeues this job (its scheduler's, from its backend); "" where none can.
    requeue_command: str = ""
    # This rank's index among the ranks that share its machine's GPUs, and their number: its node's
    # (local_rank, local_world_size) unless its backend emulates several nodes on one machine.
    machine_rank: int | None = None
    machine_ranks: int | None = None

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> DistEnv:
        """Read the layout from ``environ`` (pass ``os.environ``; tests pass tables)."""
        env = environ
        hostname = env.get(rank_env.NODE_NAME) or socket.gethostname()
        if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in rank_env.TORCHRUN):
            world = int(env["WORLD_SIZE"])
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
            rank = int(env["RANK"])
            return cls(
                rank=rank, world_size=world, local_rank=int(env["LOCAL_RANK"]),
                local_world_size=local_world,
                node_rank=int(env.get("GROUP_RANK", rank // local_world)),
                num_nodes=max(1, world // local_world),
                master_addr=env["MASTER_ADDR"], master_port=int(env["MASTER_PORT"]),
                hostname=hostname, job_id=env.get(rank_env.JOB_ID) or env.get("TORCHELASTIC_RUN_ID", ""),
                source=env.get(rank_env.LAUNCHER, "torchrun"), requeue_command=env.get(rank_env.REQUEUE, ""),
                machine_rank=int(env[rank_env.MACHINE_RANK]) if rank_env.MACHINE_RANK in env else None,
                machine_ranks=int(env[rank_env.MACHINE_RANKS]) if rank_env.MACHINE_RANKS in env else None,
            )
        return cls(hostname=hostname, master_port=free_port(), source="single")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port_free(port: int, wait_s: float = 10.0) -> None:
    """Fail fast with a clear message instead of a rendezvous that never completes.

    The probe binds the way torch's TCPStore does, with SO_REUSEADDR: a requeued job gets the
    same job id, hence the same port, and its previous run's store leaves that port in TIME_WAIT
    for a minute; a plain bind would refuse it although the store binds fine. A live listener
    (another job, or the previous run's ranks still exiting) is refused either way; it gets
    ``wait_s`` to go away before the job fails.
    """
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"MASTER_PORT {port} is already in use on {socket.gethostname()}; another process "
                        f"holds it. The port derives from the job id: resubmit the cell (python -m "
                        f"launcher.status <sweep> --resubmit-failed) for a new id and port, free the port, or "
                        f"set MASTER_PORT explicitly (torchrun)."
                    ) from exc
        time.sleep(0.5)


def export(env: DistEnv) -> None:
    """Set the variables torch.distributed's env:// rendezvous and child processes read."""
    os.environ.update(
        MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port), RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.local_world_size),
    )


# ---- device -------------------------------------------------------------------------------------

def choose_device(gpus_per_node: int, local_rank: int, local_world_size: int, visible_count: int) -> tuple[str, str]:
    """(device, backend) from the configuration, never from ``torch.cuda.is_available()`` alone.

    ``gpus_per_node == 0``: ("cpu", "gloo"), whatever GPUs the host has. Otherwise one GPU per
    rank on NCCL: with one visible device (Slurm binds one GPU per task, or CUDA_VISIBLE_DEVICES
    names one) it is ``cuda:0``; with one per local rank visible (a whole node: local runs,
    torchrun) it is ``cuda:<local_rank>``. Any other count fails here, with the count and the fix,
    instead of putting two ranks on one GPU (NCCL: "Duplicate GPU detected").
    """
    if gpus_per_node <= 0:
        return "cpu", "gloo"
    if visible_count <= 0:
        raise RuntimeError(
            f"cluster.gpus_per_node={gpus_per_node} but local rank {local_rank} sees no CUDA device "
            f"(torch.cuda.device_count()=0). Fix: run on GPU nodes with a CUDA build of torch and check "
            f"CUDA_VISIBLE_DEVICES, or set cluster.gpus_per_node=0 for CPU ranks.")
    if visible_count == 1:
        return "cuda:0", "nccl"
    if visible_count == local_world_size:
        return f"cuda:{local_rank}", "nccl"
    raise RuntimeError(
        f"local rank {local_rank} of {local_world_size} on this node sees {visible_count} CUDA devices; each rank "
        f"needs exactly one GPU: either 1 visible device per rank (Slurm: --gpus-per-task=1 or "
        f"--gpu-bind=single:1) or all {local_world_size} of the node's ranks' GPUs. Fix: set "
        f"cluster.tasks_per_node=cluster.gpus_per_node={visible_count} to use them all, or restrict "
        f"CUDA_VISIBLE_DEVICES to {local_world_size} devices (e.g. "
        f"CUDA_VISIBLE_DEVICES={','.join(map(str, range(local_world_size)))}).")


def resolve_device(gpus_per_node: int, env: DistEnv):
    """This rank's device and collective backend, from the configuration (:func:`choose_device`);
    on CUDA the device is made current before the process group exists."""
    import torch

    visible = torch.cuda.device_count() if gpus_per_node > 0 else 0
    name, backend = choose_device(gpus_per_node, *machine_slot(env), visible)
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, backend


def machine_slot(env: DistEnv) -> tuple[int, int]:
    """(this rank's index among the ranks on its machine, how many there are). A backend that
    emulates nodes as groups of processes on ONE machine (cluster=local) says so in the rank's
    variables (contract/rank_env.py's MACHINE_RANK): there every rank shares the machine's GPUs."""
    if env.machine_rank is not None and env.machine_ranks is not None:
        return env.machine_rank, env.machine_ranks
    return env.local_rank, env.local_world_size


def check_gpu_placement(env: DistEnv, device, group=None) -> list:
    """Collective on CUDA: every rank's (host, GPU UUID), gathered over ``group`` (the gloo control
    group: no NCCL traffic before the check); fails when two ranks share a GPU."""
    if device.type != "cuda":
        return []
    import torch.distributed as dist

    placements: list = [None] * env.world_size
    dist.all_gather_object(placements, (env.hostname, gpu_uuid(device)), group=group)
    check_unique_gpus(placements)
    return placements


def backend_for(device_type: str) -> str:
    """The default group's backend: CUDA ranks get NCCL for CUDA tensors AND gloo for CPU tensors
    (fp16 found-inf flags and optimizer state under CPU offload are all-reduced on the CPU; an
    NCCL-only group fails there), as torchtitan does whenever offload is on."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def nvml_uuid(uuid: str) -> str:
    """A CUDA device UUID as NVML and nvidia-smi write it: "GPU-<8-4-4-4-12 hex>". torch prints the
    bare hex (PyTorch's ``_CUuuid.__str__``), so the prefix is added here, once (R3 of the GPU review)."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def gpu_uuid(device) -> str:
    """This CUDA device's UUID, NVML's form: the identity the placement check, the ``gpu_uuids`` tag
    and the NVML sampler (jobs/interference.py) share."""
    import torch

    return nvml_uuid(str(torch.cuda.get_device_properties(device).uuid))


def duplicate_gpus(placements: Sequence[Sequence[str]]) -> list[str]:
    """Problems in a (host, GPU UUID) list indexed by rank: one line per GPU used by 2+ ranks."""
    seen: dict[tuple[str, str], list[int]] = {}
    for rank, (host, uuid) in enumerate(placements):
        seen.setdefault((host, uuid), []).append(rank)
    return [f"ranks {ranks} share GPU {uuid} on {host}" for (host, uuid), ranks in seen.items() if len(ranks) > 1]


def check_unique_gpus(placements: Sequence[Sequence[str]]) -> None:
    problems = duplicate_gpus(placements)
    if problems:
        raise RuntimeError(
            "two or more ranks run on the same GPU: " + "; ".join(problems) + ". Each rank needs its own GPU. "
            "Fix: cluster.tasks_per_node=cluster.gpus_per_node, and on Slurm bind one GPU per task "
            "(--gpus-per-task=1) or let every rank see all of the node's GPUs.")


def gloo_interface_problem(host_ip: str, num_nodes: int, environ: Mapping[str, str]) -> str | None:
    """Multi-node gloo binds to the address the host name resolves to; a loopback one (Debian's
    127.0.1.1 line in /etc/hosts) leaves other nodes unable to connect."""
    if num_nodes <= 1 or environ.get("GLOO_SOCKET_IFNAME") or not host_ip.startswith("127."):
        return None
    return (f"this host's name resolves to {host_ip} (loopback) and the job spans {num_nodes} nodes: gloo would "
            f"listen where no other node can reach it. Fix: export GLOO_SOCKET_IFNAME=<the interface between "
            f"nodes, e.g. eth0 or ib0> (and NCCL_SOCKET_IFNAME), or fix /etc/hosts.")


def resolve_host(hostname: str) -> str:
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return ""


def bound_device(device, torch_version: str) -> dict:
    """``init_process_group``'s ``device_id`` for a CUDA rank, on torch 2.9 and later only.

    A bound device makes DeviceMesh carve its sub-groups with ``split_group``, which before torch
    2.9 knows only a plain "nccl" parent and asserts on our "cpu:gloo,cuda:nccl" group ("Unknown
    c10d backend type CUDA:NCCL", pytorch#159200) for every 2-D mesh (hybrid and no-shard FSDP).
    Unbound, the mesh falls back to ``new_group``, which inherits both backends (the gloo half still
    carries CPU tensors), and NCCL connects at the first collective instead of eagerly."""
    if device is None or getattr(device, "type", "") != "cuda":
        return {}
    major, minor = (int(part) for part in re.findall(r"\d+", torch_version)[:2])
    return {"device_id": device} if (major, minor) >= (2, 9) else {}


@contextlib.contextmanager
def process_group(env: DistEnv, backend: str, timeout_s: float, device=None) -> Iterator[ProcessGroup]:
    """Open the default process group and destroy it on every exit path.

    ``device``: this rank's CUDA device (after ``set_device``); passed as ``device_id`` so the
    NCCL communicator binds to it eagerly, where the torch allows it (:func:`bound_device`). Yields a second group, on gloo (CPU
    tensors), for control messages (stop requests): kept out of the training collectives' queue,
    where even one small all-reduce a second is a point at which every rank waits for the slowest
    (jobs/preempt.py).
    """
    import sys

    import torch.distributed as dist

    export(env)
    if env.is_head and env.source != "torchrun":  # torchrun's own store holds the port already
        check_port_free(env.master_port)
    if "gloo" in backend:
        problem = gloo_interface_problem(resolve_host(env.hostname), env.num_nodes, os.environ)
        if problem:
            print(f"warning: {problem}", file=sys.stderr, flush=True)
    import torch

    extra = bound_device(device, torch.__version__)
    dist.init_process_group(
        backend=backend, init_method="env://", rank=env.rank, world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s), **extra,
    )
    try:
        yield dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    finally:
        dist.destroy_process_group()
