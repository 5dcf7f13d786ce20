"""Slurm's own settings (``cluster.*`` with cluster=slurm), beside the ones every backend shares
(launcher/plan/clusterschema.py): the nodes a job may use (partition, nodelist, exclude), the
account and QOS a job is charged to, more sbatch and srun options, the container each task runs in,
and how job arrays are cut. Another backend refuses these keys naming Slurm (the schema's
``ClusterConfig.variant``). Read when a grid is composed, so they import nothing that talks to
Slurm (submit.py and resources.py do)."""

from __future__ import annotations

import enum
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar

from contract.spec import ConfigError
from launcher.plan.clusterschema import ClusterConfig, shell


class ContainerRuntime(enum.Enum):
    none = "none"
    pyxis = "pyxis"  # srun --container-image (enroot)
    apptainer = "apptainer"  # apptainer exec <image> python ...
    oci = "oci"  # srun --container=<OCI bundle directory>: Slurm's own OCI support (oci.conf, runc)


ONE_WORD = "write options as --name=value, one per entry."


@dataclass
class ContainerConfig:
    runtime: ContainerRuntime = ContainerRuntime.none
    image: str | None = field(default=None, metadata=shell(
        "word", "use a registry path or file path, e.g. nvcr.io#nvidia/pytorch:24.05-py3 or /shared/images/bench.sif."))
    mounts: list[str] = field(default_factory=list, metadata=shell("word", ONE_WORD))


@dataclass
class SlurmSettings(ClusterConfig):
    name: str = "slurm"
    # The nodes a job may use: a partition (the launcher spreads a grid point's runs over its nodes,
    # launcher/cluster/slurm/spread.py, and health=auto keeps its slow ones out), nodes asked for
    # (sbatch --nodelist: "node[1-2]") or kept out (sbatch --exclude). Only this backend rewrites them
    # (SlurmBackend.excluding, .placing_apart, its resource check's placements).
    partition: str | None = field(default=None, metadata=shell("plain"))
    exclude: str | None = field(default=None, metadata=shell("plain"))
    nodelist: str | None = field(default=None, metadata=shell("plain"))
    # submitit's parameter names where they exist.
    account: str | None = field(default=None, metadata=shell("plain"))
    qos: str | None = field(default=None, metadata=shell("plain"))
    constraint: str | None = field(default=None, metadata=shell("plain"))
    # More sbatch options, e.g. {reservation: bench}: each key an sbatch option's name, each value plain.
    additional_parameters: dict[str, Any] = field(default_factory=dict, metadata=shell(
        "plain", "write the value plainly, e.g. cluster.additional_parameters.reservation=bench."))
    srun_args: list[str] = field(default_factory=list, metadata=shell("word", ONE_WORD))
    container: ContainerConfig = field(default_factory=ContainerConfig)
    array_parallelism: int = 64
    # Largest job array per sbatch call; None: the cluster's MaxArraySize (scontrol show config).
    max_array_size: int | None = None

    excludes_nodes: ClassVar[bool] = True  # sbatch --exclude
    asks_gpu_type: ClassVar[bool] = True  # a gres type: sbatch --gpus-per-node=<type>:<n>

    def pool(self) -> str | None:
        return self.partition

    def pool_words(self) -> str:
        return f"partition {self.partition or '(default)'}"

    def validate(self) -> None:
        """A container runtime needs its image; an OCI bundle must be one the nodes can run."""
        super().validate()
        container = self.container
        if container.runtime is not ContainerRuntime.none and not container.image:
            raise ConfigError("cluster.container.image", None,
                              f"cluster.container.runtime={container.runtime.value} needs an image.",
                              "set cluster.container.image to the worker image (see docker/).")
        if container.runtime is ContainerRuntime.oci:
            check_oci_bundle(container)

    def python_command(self) -> str:
        """The interpreter command inside the container, when the tasks run in one."""
        runtime = self.container.runtime
        if runtime is ContainerRuntime.apptainer:
            binds = " ".join(f"--bind {shlex.quote(m)}" for m in self.container.mounts)
            gpu = " --nv" if self.gpus_per_node else ""
            return f"apptainer exec{gpu} {binds} {shlex.quote(self.container.image or '')} {self.python or 'python'}"
        if runtime in (ContainerRuntime.pyxis, ContainerRuntime.oci):
            return self.python or "python"
        return super().python_command()

    def software(self) -> str:
        """The container the ranks run in, as the fabric record's identity names it."""
        return f"{self.container.runtime.value}:{self.container.image or ''}"


def check_oci_bundle(container: ContainerConfig) -> None:
    """Slurm's OCI mode runs each task in a bundle directory on a shared file system: one the login
    node cannot see is one the nodes will not run, so it is refused here, before sbatch."""
    bundle = str(container.image)
    if not os.path.isfile(os.path.join(bundle, "config.json")):
        raise ConfigError("cluster.container.image", bundle, "is not an OCI bundle (a directory with config.json and "
                          "rootfs/), which cluster.container.runtime=oci runs each task in.",
                          "make one from the worker image: scripts/oci-bundle localhost/ddp-fsdp-bench:cpu "
                          "/shared/bundles/cpu /shared (see docker/README.md), and give its directory.")
    if container.mounts:
        raise ConfigError("cluster.container.mounts", container.mounts, "is not read in the oci mode: the bundle's "
                          "config.json holds its mounts.", "pass the directories to scripts/oci-bundle instead.")


def of(cluster: ClusterConfig) -> SlurmSettings:
    """A cell's cluster settings as Slurm's: every cell of a Slurm sweep is composed with them
    (plan/schema.py checks the class), so anything else here is a bug, said as one."""
    if not isinstance(cluster, SlurmSettings):
        raise TypeError(f"cluster={cluster.name} settings ({type(cluster).__name__}) given to the Slurm backend")
    return cluster
