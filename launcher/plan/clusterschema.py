"""The cluster's settings (``cluster.*``): which backend runs the cells, the resources a cell asks
for, its container, its prices, and the keys only Slurm reads (refused on a one-machine cluster,
never silently dropped). Imports no module of the launcher: plan/schema.py composes it into Config."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from contract.codec import to_plain
from contract.spec import ConfigError


class ClusterKind(enum.Enum):
    local = "local"  # submitit's LocalExecutor: real processes on this machine
    slurm = "slurm"
    torchrun = "torchrun"  # one machine, each cell's ranks under torchrun (python -m jobs spec.json)

    @property
    def one_machine(self) -> bool:
        """Whether every node of a cell is a group of ranks on this machine: planning emulates the nodes
        and shares the machine's cores among all ranks. (What else differs is the backend's:
        launcher/cluster/base.py.)"""
        return self in (ClusterKind.local, ClusterKind.torchrun)


class ContainerRuntime(enum.Enum):
    none = "none"
    pyxis = "pyxis"  # srun --container-image (enroot)
    apptainer = "apptainer"  # apptainer exec <image> python ...
    oci = "oci"  # srun --container=<OCI bundle directory>: Slurm's own OCI support (oci.conf, runc)


@dataclass
class ContainerConfig:
    runtime: ContainerRuntime = ContainerRuntime.none
    image: str | None = None
    mounts: list[str] = field(default_factory=list)


def check_oci_bundle(container: ContainerConfig) -> None:
    """Slurm's OCI mode runs each task in a bundle directory on a shared file system: one the login
    node cannot see is one the nodes will not run, so it is refused here, before sbatch."""
    import os

    bundle = str(container.image)
    if not os.path.isfile(os.path.join(bundle, "config.json")):
        raise ConfigError("cluster.container.image", bundle, "is not an OCI bundle (a directory with config.json and "
                          "rootfs/), which cluster.container.runtime=oci runs each task in.",
                          "make one from the worker image: scripts/oci-bundle localhost/ddp-fsdp-bench:cpu "
                          "/shared/bundles/cpu /shared (see docker/README.md), and give its directory.")
    if container.mounts:
        raise ConfigError("cluster.container.mounts", container.mounts, "is not read in the oci mode: the bundle's "
                          "config.json holds its mounts.", "pass the directories to scripts/oci-bundle instead.")


@dataclass
class ClusterConfig:
    name: ClusterKind = ClusterKind.local
    tasks_per_node: int = 1  # one rank per task
    gpus_per_node: int = 0  # 0 = CPU ranks on gloo
    cpus_per_task: int | None = None  # None: this machine's cores / ranks per node (local)
    timeout_min: int = 60
    # Host memory per node: sbatch --mem on Slurm, a memory cgroup of mem_gb x nodes locally.
    mem_gb: float | None = None
    signal_delay_s: int = 90  # USR2 this long before the time limit (preemption warning)
    setup: list[str] = field(default_factory=list)  # shell lines before the ranks start: modules, venv
    python: str | None = None  # interpreter of the ranks; default: this one
    # Whole nodes per cell: a benchmark that shares a node measures its neighbours too (local cells
    # never share: they run one after another).
    exclusive: bool = True
    # Slurm only (submitit's parameter names where they exist); refused on cluster=local.
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    nodelist: str | None = None  # sbatch --nodelist: these nodes (at least), e.g. "node[1-2]"
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    srun_args: list[str] = field(default_factory=list)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    array_parallelism: int = 64
    # Prices, for cost_per_1m_samples / cost_per_1m_tokens: per device-hour (GPU, or CPU rank) or per
    # node-hour (the device price wins when both are set).
    cost_per_device_hour: float | None = None
    cost_per_node_hour: float | None = None
    # GPU memory per GPU: a cell whose predicted model state exceeds it is refused before submission.
    # None: known from gpu_type, the partition's GPU type (sinfo's gres) or the local GPUs (nvidia-smi).
    gpu_mem_gib: float | None = None
    # The GPU model to ask Slurm for, as its gres type (e.g. h100): sbatch --gpus-per-node=<type>:<n>.
    gpu_type: str | None = None
    # Largest job array per sbatch call; None: the cluster's MaxArraySize (scontrol show config).
    max_array_size: int | None = None
    # Nodes declared, not asked: --plan checks the cells against these settings alone (GPUs per node,
    # cluster.gpu_mem_gib or cluster.gpu_type), without sinfo, scontrol or nvidia-smi, so that a laptop
    # can ask "does it fit on 24 GB GPUs?". Such a grid is planned, never submitted.
    declared: bool = False


SLURM_ONLY = ("partition", "account", "qos", "constraint", "exclude", "nodelist", "additional_parameters", "srun_args",
              "container", "array_parallelism", "max_array_size", "gpu_type")


def refuse_slurm_only(c: ClusterConfig) -> None:
    """A Slurm setting on the local cluster would be silently dropped: refuse it instead. A declared
    machine's cluster.gpu_type says its GPUs' memory (nothing asks Slurm for it)."""
    default = ClusterConfig()
    for key in SLURM_ONLY:
        if key == "gpu_type" and c.declared:
            continue
        if getattr(c, key) != getattr(default, key):
            raise ConfigError(f"cluster.{key}", to_plain(getattr(c, key)),
                              "only Slurm reads it, and this cell runs on cluster=local (processes on this machine).",
                              f"drop cluster.{key}, or use cluster=slurm.")
