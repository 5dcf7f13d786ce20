"""The one submission path: every run, resume and resubmission of cells goes through :func:`submit`.

The only module that talks to submitit. Each cell carries its own resolved cluster settings
(``CellState.cluster``) and layout; cells share a job array only when everything sbatch would be
given is identical (:func:`group_key`), and an array never exceeds the cluster's MaxArraySize.
Local cells run one after another in the foreground: they share this machine's cores, and two
benchmarks running at once would measure each other.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jobs.codec import to_plain
from jobs.spec import Layout
from launcher import memlimit
from launcher.schema import ClusterConfig, ContainerRuntime
from launcher.state import CellState, CellStatus, SweepState, this_process


def slurm_parameters(cluster: ClusterConfig, layout: Layout, job_name: str) -> dict[str, Any]:
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


def group_key(cell: CellState) -> str:
    """Cells with equal keys may share one sbatch call: every submission parameter is identical."""
    params = slurm_parameters(cell.cluster, cell.layout, "")
    return json.dumps([to_plain(params), python_command(cell.cluster)], sort_keys=True, default=str)


def groups(cells: Sequence[CellState], max_array_size: int | None) -> list[list[CellState]]:
    """Cells in submission order, split by :func:`group_key`, each group at most max_array_size long."""
    by_key: dict[str, list[CellState]] = {}
    for cell in cells:
        by_key.setdefault(group_key(cell), []).append(cell)
    size = max_array_size or max(1, len(cells))
    return [g[i : i + size] for g in by_key.values() for i in range(0, len(g), size)]


def submit(state: SweepState, cells: Sequence[CellState], *,
           after_local_cell: Callable[[CellState], None] | None = None) -> None:
    """Submit ``cells`` of ``state`` with each cell's own settings; the state is saved as jobs get ids.

    Slurm: one sbatch per group, returning at once. Local: each cell runs to its end before the next
    starts, then ``after_local_cell`` is called (tracking, progress).
    """
    for cell in cells:
        for stale in state.cell_dir(cell).glob("error-rank*.txt"):
            stale.unlink()  # a new attempt: the previous attempt's errors must not be read as this one's
    state.submitter = this_process()  # while it lives, a planned cell is still to be submitted
    if state.cluster == "slurm":
        _submit_slurm(state, cells, max_array_size_for(cells))
    else:
        _run_local(state, cells, after_local_cell)


def _submit_slurm(state: SweepState, cells: Sequence[CellState], max_array_size: int | None) -> None:
    from jobs.worker import Worker

    calls = groups(cells, max_array_size)
    refused = 0
    for group in calls:
        executor = slurm_executor(state.path / "submitit", group[0].cluster, group[0].layout, state.name)
        try:
            with executor.batch():
                jobs = [executor.submit(Worker(), state.load_spec(cell)) for cell in group]
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


def _refused(state: SweepState, group: Sequence[CellState], exc: Exception) -> None:
    """Cells sbatch refused are failed with sbatch's own words and what to do: the sweep can be fixed
    and run again (same command, same sweep_dir) or resubmitted; none stays planned."""
    from launcher.failures import SUBMIT_REFUSED

    said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    for cell in group:
        cell.status, cell.job_id, cell.failure_class = CellStatus.failed, None, SUBMIT_REFUSED
        cell.error = (f"sbatch refused the job: {said}. Fix: change the cell's cluster.* settings to what the "
                      f"partition offers (sinfo -N -l shows each node), then run the same command again with "
                      f"sweep_dir={state.sweep_dir}")
    state.save()
    print(f"error: sbatch refused {len(group)} cell(s) ({', '.join(c.name for c in group[:3])}"
          f"{' ...' if len(group) > 3 else ''}): {said}", file=sys.stderr, flush=True)


def max_array_size_for(cells: Sequence[CellState]) -> int | None:
    """The cells' own cluster.max_array_size where set, else the cluster's MaxArraySize."""
    configured = [c.cluster.max_array_size for c in cells if c.cluster.max_array_size]
    if configured:
        return min(configured)
    from launcher.slurm import max_array_size

    return max_array_size()


def _run_local(state: SweepState, cells: Sequence[CellState],
               after_local_cell: Callable[[CellState], None] | None) -> None:
    from jobs.worker import Worker

    for cell in cells:
        # The cell's own memory limit (cluster.mem_gb per emulated node), as sbatch --mem would set.
        cgroup = memlimit.create(cell.cluster.mem_gb * cell.layout.nodes) if cell.cluster.mem_gb else None
        executor = local_executor(state.path / "submitit", cell.cluster, cell.layout, cgroup)
        job = executor.submit(Worker(), state.load_spec(cell))
        cell.job_id, cell.status, cell.error, cell.failure_class = job.job_id, CellStatus.running, None, None
        cell.submitted_at = time.time()
        state.save()
        print(f"[{cell.index + 1}/{len(state.cells)}] {cell.name}: job {job.job_id}, {cell.world_size} rank(s), "
              f"{state.cell_dir(cell)}", flush=True)
        try:
            _follow(job, state.cell_dir(cell), state.load_spec(cell).train.steps)
            job.results()
            cell.status = CellStatus.done
        except Exception as exc:  # a failed cell is recorded; the sweep goes on
            _record_local_failure(state, cell, exc, cgroup)
        finally:
            if cgroup is not None:
                memlimit.remove(cgroup)
        state.save()
        if after_local_cell is not None:
            after_local_cell(cell)


def _record_local_failure(state: SweepState, cell: CellState, exc: Exception, cgroup: Path | None) -> None:
    """The first failure and its class; the cell's memory cgroup is what sacct is on Slurm: an OOM kill
    it counted is decisive, whatever the other ranks then reported."""
    from launcher.failures import classify, first_failure

    cell_dir = state.cell_dir(cell)
    cell.status = CellStatus.failed
    cell.error = first_failure(cell_dir) or _last_line(exc)
    kills = memlimit.oom_kills(cgroup) if cgroup is not None else 0
    if kills:
        cell.error = (f"out of memory: the kernel's OOM killer ended {kills} process(es) at the cell's memory limit "
                      f"(cluster.mem_gb={cell.cluster.mem_gb:g} per node); {cell.error}")
    cell.failure_class = classify(cell_dir, "OUT_OF_MEMORY" if kills else None, f"{cell.error}\n{exc}")


def _follow(job, cell_dir: Path, steps: int, poll_s: float = 1.0, plain_every_s: float = 30.0) -> None:
    """Step progress from rank 0's heartbeat until the job ends: a live line on a terminal, a plain
    line every ``plain_every_s`` otherwise (logs stay short)."""
    live = sys.stdout.isatty()
    beat = cell_dir / "ranks" / "rank0.json"
    shown, last_plain = None, time.monotonic()
    while not job.done():
        time.sleep(poll_s)
        try:
            step = json.loads(beat.read_text()).get("step")
        except (OSError, ValueError):
            continue
        if step is None or step == shown:
            continue
        shown = step
        if live:
            print(f"\r    step {step + 1}/{steps}", end="", flush=True)
        elif time.monotonic() - last_plain >= plain_every_s:
            print(f"    step {step + 1}/{steps}", flush=True)
            last_plain = time.monotonic()
    if live and shown is not None:
        print("\r" + " " * 30 + "\r", end="", flush=True)


def _last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def local_executor(folder: Path, cluster: ClusterConfig, layout: Layout, cgroup: Path | None = None):
    """submitit's LocalExecutor with the cell's settings: the time limit and its warning, the setup
    lines and interpreter, and the memory cgroup the job joins before its ranks start."""
    import submitit

    executor = submitit.LocalExecutor(folder=str(folder), python=python_command(cluster))
    # The local executor has one "node": all ranks of the emulated nodes are its tasks, and each
    # rank gets one of this machine's GPUs when the cell asks for GPUs.
    setup = [*([memlimit.join_line(cgroup)] if cgroup is not None else []), *cluster.setup]
    executor.update_parameters(tasks_per_node=layout.world_size, timeout_min=cluster.timeout_min, nodes=1,
                               gpus_per_node=layout.gpus_per_node * layout.nodes,
                               signal_delay_s=cluster.signal_delay_s, setup=setup)
    return executor


def sbatch_script(group: Sequence[CellState], folder: Path, job_name: str) -> str:
    """The sbatch script submitit would write for ``group`` (a job array when it holds several cells):
    submitit's own rendering, and nothing is written."""
    from submitit.slurm.slurm import _make_sbatch_string

    executor = slurm_executor(folder, group[0].cluster, group[0].layout, job_name)
    params: dict[str, Any] = dict(executor.parameters)
    if len(group) > 1:
        params["map_count"] = len(group)
    return _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)


def slurm_executor(folder: Path, cluster: ClusterConfig, layout: Layout, job_name: str):
    import submitit

    executor = submitit.SlurmExecutor(folder=str(folder), python=python_command(cluster))
    executor.update_parameters(**slurm_parameters(cluster, layout, job_name))
    return executor
