"""Slurm submission with submitit: the sbatch calls of ``SlurmBackend`` (every run, resume and
resubmission of cells reaches them through ``Backend.submit``), and the sbatch scripts ``--plan`` shows.

Each cell carries its own resolved cluster settings (``Cell.cluster``) and layout; cells share a
job array only when everything sbatch would be given is identical (:func:`group_key`), and an
array never exceeds the cluster's MaxArraySize.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contract import programs
from contract.codec import to_plain
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec
from contract.spec import Layout
from launcher.cluster.failures import SUBMIT_REFUSED, last_line
from launcher.cluster.slurm import settings
from launcher.cluster.slurm.ranks import OnSlurm
from launcher.cluster.slurm.settings import ContainerRuntime, SlurmSettings
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SPEC_FILE, SweepState


def slurm_parameters(cluster: SlurmSettings, layout: Layout, job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one resource shape (submitit renders and quotes them)."""
    params: dict[str, Any] = dict(
        job_name=job_name, nodes=layout.nodes, ntasks_per_node=layout.tasks_per_node,
        cpus_per_task=layout.cpus_per_task, time=cluster.timeout_min, signal_delay_s=cluster.signal_delay_s,
        array_parallelism=cluster.array_parallelism,
        # A rank that dies ends the whole step instead of leaving the others in a collective.
        srun_args=["--kill-on-bad-exit=1", *cluster.srun_args],
        additional_parameters={"requeue": True, **cluster.additional_parameters},
    )
    if layout.gpus_per_node:
        params["gpus_per_node"] = (f"{cluster.gpu_type}:{layout.gpus_per_node}" if cluster.gpu_type
                                   else layout.gpus_per_node)
    for key in ("partition", "account", "qos", "constraint", "exclude", "nodelist"):
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
    if cluster.container.runtime is ContainerRuntime.oci:  # the bundle's config.json holds its mounts
        params["srun_args"] += [f"--container={cluster.container.image}"]
    return params


def group_key(cell: Cell) -> str:
    """Cells with equal keys may share one sbatch call: every submission parameter is identical."""
    params = slurm_parameters(settings.of(cell.cluster), cell.layout, "")
    return json.dumps([to_plain(params), cell.cluster.python_command()], sort_keys=True, default=str)


def groups(cells: Sequence[Cell], max_array_size: int | None) -> list[list[Cell]]:
    """Cells in submission order, split by :func:`group_key`, each group at most max_array_size long."""
    by_key: dict[str, list[Cell]] = {}
    for cell in cells:
        by_key.setdefault(group_key(cell), []).append(cell)
    size = max_array_size or max(1, len(cells))
    return [g[i : i + size] for g in by_key.values() for i in range(0, len(g), size)]


def submit(state: SweepState, cells: Sequence[Cell], max_array_size: int | None, after: Sequence[str] = ()) -> None:
    """One sbatch per group, returning at once (launcher/cluster/slurm/backend.py); the jobs start once
    the jobs ``after`` have ended (sbatch --dependency=afterany)."""
    calls = groups(cells, max_array_size)
    refused = 0
    for group in calls:
        executor = slurm_executor(state.path / "submitit", settings.of(group[0].cluster), group[0].layout, state.name, after)
        try:
            with executor.batch():
                jobs = [executor.submit(from_spec_file(state.cell_dir(cell) / SPEC_FILE)) for cell in group]
        except Exception as exc:  # sbatch said no (submitit's FailedJobError holds its stderr): a fact about these cells
            _refused(state, group, exc)
            refused += len(group)
            continue
        for cell, job in zip(group, jobs, strict=True):
            cell.job_id, cell.status, cell.error, cell.failure_class = job.job_id, CellStatus.pending, None, None
            cell.submitted_at = time.time()
            cell.restarts, cell.history = 0, []
        state.save()
    print(f"{len(cells) - refused} cell(s) in {len(calls)} sbatch call(s)"
          + (f"; sbatch refused {refused} cell(s)" if refused else "") + ".", flush=True)


def _refused(state: SweepState, group: Sequence[Cell], exc: Exception) -> None:
    """Cells sbatch refused are failed with sbatch's own words and what to do: the sweep can be fixed
    and run again (same command, same sweep_dir) or resubmitted; none stays planned."""
    said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    for cell in group:
        cell.status, cell.job_id, cell.failure_class = CellStatus.failed, None, SUBMIT_REFUSED
        cell.error = (f"sbatch refused the job: {said}. Fix: change the cell's cluster.* settings to what the "
                      f"partition offers (sinfo -N -l shows each node), then run the same command again with "
                      f"sweep_dir={state.sweep_dir}")
    state.save()
    print(f"error: sbatch refused {len(group)} cell(s) ({', '.join(c.name for c in group[:3])}"
          f"{' ...' if len(group) > 3 else ''}): {said}", file=sys.stderr, flush=True)


def sbatch_script(group: Sequence[Cell], folder: Path, job_name: str) -> str:
    """The sbatch script submitit would write for ``group`` (a job array when it holds several cells):
    submitit's own rendering, and nothing is written.

    submitit renders a script only on its way to sbatch; the function and the command property it
    renders with are private (``submitit.slurm.slurm._make_sbatch_string``,
    ``SlurmExecutor._submitit_command_str``, submitit 1.5). Writing the script here instead would be
    a second renderer that can drift from what sbatch really gets, so the private pair is used and
    tests/test_private_apis.py fails, naming what moved, when a submitit release changes them."""
    from submitit.slurm.slurm import _make_sbatch_string

    executor = slurm_executor(folder, settings.of(group[0].cluster), group[0].layout, job_name)
    params: dict[str, Any] = dict(executor.parameters)
    if len(group) > 1:
        params["map_count"] = len(group)
    return _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)


def slurm_executor(folder: Path, cluster: SlurmSettings, layout: Layout, job_name: str, after: Sequence[str] = ()):
    import submitit

    executor = submitit.SlurmExecutor(folder=str(folder), python=cluster.python_command())
    params = slurm_parameters(cluster, layout, job_name)
    if after:  # beside a dependency of the site's own (cluster.additional_parameters), both must hold
        own = params["additional_parameters"].get("dependency")
        params["additional_parameters"]["dependency"] = ",".join(
            [*([str(own)] if own else []), f"afterany:{':'.join(after)}"])
    executor.update_parameters(**params)
    return executor


def from_spec_file(path: Path) -> OnSlurm:
    """What each Slurm task runs: ``python -m jobs``'s entry on ``path``, the file's path its only
    content (jobs/__main__.py), after Slurm's variables are translated. A requeued job reads the same
    file again: the launcher rewrites a cell's spec.json only when the cell runs anew."""
    from jobs.__main__ import SpecFile  # the ranks' code: imported when a job is submitted, never at start-up

    return OnSlurm(SpecFile(path))


def submit_probe(folder: Path, cluster: SlurmSettings, layout: Layout, job_name: str, spec: ProbeSpec
                 ) -> tuple[str | None, str | None]:
    """The fabric probe as a Slurm job of the cells' shape, from its spec file in its ``out_dir``
    (submitit's files in ``folder``), returning at once: (job id, sbatch's refusal)."""
    path = programs.write(Path(spec.out_dir), spec)  # the probe's own folder: one file per probe
    try:
        return slurm_executor(folder, cluster, layout, job_name).submit(from_spec_file(path)).job_id, None
    except Exception as exc:  # sbatch said no: the cells are submitted anyway, without fabric figures
        return None, last_line(exc)


def run_node_probe(folder: Path, cluster: SlurmSettings, layout: Layout, spec: NodeProbeSpec
                   ) -> tuple[str | None, str | None]:
    """The node health probe as one Slurm job, one task per node on the nodes ``cluster.nodelist``
    names, from its spec file in its ``out_dir`` (submitit's files in ``folder``), waited for (submitit
    polls sacct): (job id, why it failed)."""
    path = programs.write(Path(spec.out_dir), spec)  # the probe's own folder: one file per probe
    try:
        job = slurm_executor(folder, cluster, layout, "health-probe").submit(from_spec_file(path))
    except Exception as exc:  # sbatch said no
        return None, f"sbatch refused the probe: {last_line(exc)}"
    try:
        job.results()
    except KeyboardInterrupt:
        job.cancel()
        raise
    except Exception as exc:  # the job failed: its nodes' logs say why
        return job.job_id, last_line(exc)
    return job.job_id, None

