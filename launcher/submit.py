"""The only module that talks to submitit: executors, parameters, job arrays by resource shape."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from jobs.spec import Layout, RunSpec
from launcher.schema import ClusterConfig, ClusterKind, ContainerRuntime


def slurm_parameters(cluster: ClusterConfig, layout: Layout, job_name: str) -> Dict[str, Any]:
    """submitit SlurmExecutor parameters for one resource shape (submitit renders and quotes them)."""
    params: Dict[str, Any] = dict(
        job_name=job_name, nodes=layout.nodes, ntasks_per_node=layout.tasks_per_node,
        cpus_per_task=layout.cpus_per_task, time=cluster.timeout_min, signal_delay_s=cluster.signal_delay_s,
        array_parallelism=cluster.array_parallelism,
        # A rank that dies ends the whole step instead of leaving the others in a collective.
        srun_args=["--kill-on-bad-exit=1", *cluster.srun_args],
        additional_parameters={"requeue": True, **cluster.additional_parameters},
    )
    if layout.gpus_per_node:
        params["gpus_per_node"] = layout.gpus_per_node
    for key in ("partition", "account", "qos", "constraint", "exclude"):
        if getattr(cluster, key):
            params[key] = getattr(cluster, key)
    if cluster.mem_gb:
        params["mem"] = f"{int(cluster.mem_gb * 1024)}M"
    if cluster.exclusive:
        params["exclusive"] = True
    if cluster.setup:
        params["setup"] = list(cluster.setup)
    if cluster.container.runtime is ContainerRuntime.pyxis:
        params["srun_args"] += [f"--container-image={cluster.container.image}",
                                *(f"--container-mounts={m}" for m in cluster.container.mounts)]
    return params


def python_command(cluster: ClusterConfig) -> str:
    python = cluster.python or shlex.quote(sys.executable)
    if cluster.container.runtime is ContainerRuntime.apptainer:
        binds = " ".join(f"--bind {shlex.quote(m)}" for m in cluster.container.mounts)
        gpu = " --nv" if cluster.gpus_per_node else ""
        return f"apptainer exec{gpu} {binds} {shlex.quote(cluster.container.image or '')} {cluster.python or 'python'}"
    if cluster.container.runtime is ContainerRuntime.pyxis:
        return cluster.python or "python"
    return python


def local_executor(folder: Path, layout: Layout, timeout_min: int):
    import submitit

    executor = submitit.LocalExecutor(folder=str(folder))
    # The local executor has one "node": all ranks of the emulated nodes are its tasks.
    executor.update_parameters(tasks_per_node=layout.world_size, timeout_min=timeout_min, nodes=1)
    return executor


def slurm_executor(folder: Path, cluster: ClusterConfig, layout: Layout, job_name: str):
    import submitit

    executor = submitit.SlurmExecutor(folder=str(folder), python=python_command(cluster))
    executor.update_parameters(**slurm_parameters(cluster, layout, job_name))
    return executor


def submit_arrays(folder: Path, cluster: ClusterConfig, groups: Sequence[Tuple[Layout, List[RunSpec]]], job_name: str):
    """One sbatch per resource shape: cells of the same shape become one job array."""
    from jobs.worker import Worker

    jobs = []
    for layout, specs in groups:
        executor = slurm_executor(folder, cluster, layout, job_name)
        with executor.batch():
            batch = [executor.submit(Worker(), spec) for spec in specs]
        jobs.extend(batch)
    return jobs


def job_for(folder: Path, cluster: ClusterKind, job_id: str):
    """Re-attach to a submitted job from its id (status, wait, cancel from a later command)."""
    import submitit

    if cluster is ClusterKind.slurm:
        return submitit.SlurmJob(folder=str(folder), job_id=job_id, tasks=(0,))
    return submitit.local.local.LocalJob(folder=str(folder), job_id=job_id, tasks=(0,))
