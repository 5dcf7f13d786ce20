"""Submission with submitit, for the backends (launcher/cluster/): every run, resume and resubmission
of cells goes through ``Backend.submit``, which ends here.

The only module that talks to submitit. Each cell carries its own resolved cluster settings
(``Cell.cluster``) and layout; cells share a job array only when everything sbatch would be
given is identical (:func:`group_key`), and an array never exceeds the cluster's MaxArraySize.
Local cells run one after another in the foreground: they share this machine's cores, and two
benchmarks running at once would measure each other.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.codec import to_plain
from contract.spec import Layout
from launcher.cluster import memlimit
from launcher.plan.cell import Cell, CellStatus
from launcher.plan.schema import ClusterConfig, ContainerRuntime
from launcher.state import SweepState

if TYPE_CHECKING:
    from launcher.cluster.interrupt import Interrupts


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
    if cluster.container.runtime is ContainerRuntime.oci:  # the bundle's config.json holds its mounts
        params["srun_args"] += [f"--container={cluster.container.image}"]
    return params


def python_command(cluster: ClusterConfig) -> str:
    python = cluster.python or shlex.quote(sys.executable)
    if cluster.container.runtime is ContainerRuntime.apptainer:
        binds = " ".join(f"--bind {shlex.quote(m)}" for m in cluster.container.mounts)
        gpu = " --nv" if cluster.gpus_per_node else ""
        return f"apptainer exec{gpu} {binds} {shlex.quote(cluster.container.image or '')} {cluster.python or 'python'}"
    if cluster.container.runtime in (ContainerRuntime.pyxis, ContainerRuntime.oci):
        return cluster.python or "python"
    return python


def group_key(cell: Cell) -> str:
    """Cells with equal keys may share one sbatch call: every submission parameter is identical."""
    params = slurm_parameters(cell.cluster, cell.layout, "")
    return json.dumps([to_plain(params), python_command(cell.cluster)], sort_keys=True, default=str)


def groups(cells: Sequence[Cell], max_array_size: int | None) -> list[list[Cell]]:
    """Cells in submission order, split by :func:`group_key`, each group at most max_array_size long."""
    by_key: dict[str, list[Cell]] = {}
    for cell in cells:
        by_key.setdefault(group_key(cell), []).append(cell)
    size = max_array_size or max(1, len(cells))
    return [g[i : i + size] for g in by_key.values() for i in range(0, len(g), size)]


def submit_slurm(state: SweepState, cells: Sequence[Cell], max_array_size: int | None) -> None:
    """One sbatch per group, returning at once (launcher.cluster.slurm)."""
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


def _refused(state: SweepState, group: Sequence[Cell], exc: Exception) -> None:
    """Cells sbatch refused are failed with sbatch's own words and what to do: the sweep can be fixed
    and run again (same command, same sweep_dir) or resubmitted; none stays planned."""
    from launcher.cluster.failures import SUBMIT_REFUSED

    said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    for cell in group:
        cell.status, cell.job_id, cell.failure_class = CellStatus.failed, None, SUBMIT_REFUSED
        cell.error = (f"sbatch refused the job: {said}. Fix: change the cell's cluster.* settings to what the "
                      f"partition offers (sinfo -N -l shows each node), then run the same command again with "
                      f"sweep_dir={state.sweep_dir}")
    state.save()
    print(f"error: sbatch refused {len(group)} cell(s) ({', '.join(c.name for c in group[:3])}"
          f"{' ...' if len(group) > 3 else ''}): {said}", file=sys.stderr, flush=True)


def max_array_size_for(cells: Sequence[Cell]) -> int | None:
    """The cells' own cluster.max_array_size where set, else the cluster's MaxArraySize."""
    configured = [c.cluster.max_array_size for c in cells if c.cluster.max_array_size]
    if configured:
        return min(configured)
    from launcher.cluster.slurm_commands import max_array_size

    return max_array_size()


def run_local(state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
              interrupts: Interrupts | None = None) -> None:
    """Each cell to its end, one after another (launcher.cluster.local), then ``after_each_cell``
    (tracking, progress). Ctrl-C, SIGTERM or SIGHUP (``interrupts``, or handlers of this call's own)
    stop the running cell at a step boundary and start no further cell (launcher/cluster/interrupt.py); the
    cells stopped or never started are cancelled, and ``after_each_cell`` sees them too (their MLflow
    runs end KILLED)."""
    from launcher.cluster.interrupt import Interrupts

    own = interrupts is None
    stops = interrupts if interrupts is not None else Interrupts()
    if stops.on_abort is None:
        stops.on_abort = lambda reason: _abandon(state, cells, reason)
    with stops if own else contextlib.nullcontext():
        for cell in cells:
            if stops.requested:
                break
            _run_local_cell(state, cell, stops)
            if after_each_cell is not None:
                after_each_cell(cell)
        if stops.requested:
            for cell in _abandon(state, cells, stops.reason):
                if after_each_cell is not None:
                    after_each_cell(cell)
            print(f"{stops.reason}: the sweep stopped; {_stopped_summary(cells)}.\nResume with: python -m "
                  f"launcher.status {state.sweep_dir} --resubmit-failed", file=sys.stderr, flush=True)


def _run_local_cell(state: SweepState, cell: Cell, stops: Interrupts) -> None:
    from jobs.worker import Worker

    # The cell's own memory limit (cluster.mem_gb per emulated node), as sbatch --mem would set.
    cgroup = memlimit.create(cell.cluster.mem_gb * cell.layout.nodes) if cell.cluster.mem_gb else None
    executor = local_executor(state.path / "submitit", cell.cluster, cell.layout, cgroup)
    job = executor.submit(Worker(), state.load_spec(cell))
    stops.watch(int(job.job_id), f"[{cell.index + 1}/{len(state.cells)}] {cell.name}", cell.cluster.signal_delay_s)
    cell.job_id, cell.status, cell.error, cell.failure_class = job.job_id, CellStatus.running, None, None
    cell.submitted_at = time.time()
    state.save()
    print(f"[{cell.index + 1}/{len(state.cells)}] {cell.name}: job {job.job_id}, {cell.world_size} rank(s), "
          f"{state.cell_dir(cell)}", flush=True)
    try:
        _follow(job, state.cell_dir(cell), state.load_spec(cell).train.steps, stops=stops)
        if stops.requested and not (state.cell_dir(cell) / "result.json").exists():
            _record_interrupted(state, cell, stops)  # stopped before its window completed: no result
        else:
            job.results()
            cell.status = CellStatus.done
    except Exception as exc:  # a failed cell is recorded; the sweep goes on
        _record_local_failure(state, cell, exc, cgroup)
    finally:
        stops.release()
        if cgroup is not None:
            memlimit.remove(cgroup)
    state.save()


# The error of a cell an interrupted sweep never started (launcher.sweep prints no line for it).
NOT_STARTED = "not started: the sweep was interrupted by "


def _abandon(state: SweepState, cells: Sequence[Cell], reason: str) -> list[Cell]:
    """Cancel what an interrupt leaves: a cell still running (its processes were killed) and the cells
    not started. Returns the cells it changed; the document is saved."""
    changed = [c for c in cells if not c.status.terminal]
    for cell in changed:
        if cell.status is CellStatus.planned:
            cell.status, cell.error = CellStatus.cancelled, f"{NOT_STARTED}{reason}"
        else:
            cell.status, cell.error = CellStatus.cancelled, f"killed at once by {reason}; no checkpoint"
    state.save()
    return changed


def _record_interrupted(state: SweepState, cell: Cell, stops: Interrupts) -> None:
    """A cell the interrupt stopped before its measured window completed: cancelled, never done."""
    cell_dir = state.cell_dir(cell)
    try:
        step = json.loads((cell_dir / "ranks" / "rank0.json").read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    at = f" at step {step + 1} of {state.load_spec(cell).train.steps}" if isinstance(step, int) else ""
    marker = cell_dir / "preempted.txt"  # rank 0 writes it after the checkpoint is saved
    saved = (marker.exists() and marker.stat().st_mtime >= (cell.submitted_at or 0.0)
             and "checkpoint saved" in marker.read_text())
    how = (f"its ranks were killed after {cell.cluster.signal_delay_s:g} s (cluster.signal_delay_s)" if stops.killed
           else "checkpoint saved: --resubmit-failed resumes it from there" if saved else "no checkpoint")
    cell.status, cell.failure_class = CellStatus.cancelled, None
    cell.error = f"interrupted by {stops.reason}{at}, before its measured window completed; {how}"


def _stopped_summary(cells: Sequence[Cell]) -> str:
    cancelled = [c for c in cells if c.status is CellStatus.cancelled]
    unstarted = sum((c.error or "").startswith(NOT_STARTED) for c in cancelled)
    return (f"{len(cancelled) - unstarted} cell(s) stopped, {unstarted} not started, all marked cancelled in "
            f"sweep.json")


def _record_local_failure(state: SweepState, cell: Cell, exc: Exception, cgroup: Path | None) -> None:
    """The first failure and its class; the cell's memory cgroup is what sacct is on Slurm: an OOM kill
    it counted is decisive, whatever the other ranks then reported."""
    from launcher.cluster.failures import classify, first_failure

    cell_dir = state.cell_dir(cell)
    cell.status = CellStatus.failed
    cell.error = first_failure(cell_dir) or _last_line(exc)
    kills = memlimit.oom_kills(cgroup) if cgroup is not None else 0
    if kills:
        cell.error = (f"out of memory: the kernel's OOM killer ended {kills} process(es) at the cell's memory limit "
                      f"(cluster.mem_gb={cell.cluster.mem_gb:g} per node); {cell.error}")
    cell.failure_class = classify(cell_dir, "OUT_OF_MEMORY" if kills else None, f"{cell.error}\n{exc}")


def _follow(job, cell_dir: Path, steps: int, poll_s: float = 0.2, plain_every_s: float = 30.0,
            stops: Interrupts | None = None) -> None:
    """Step progress from rank 0's heartbeat until the job ends: a live line on a terminal, a plain
    line every ``plain_every_s`` otherwise (logs stay short). After a stop request, ranks that
    outlive their grace are killed (``stops.enforce``)."""
    # A short poll: a cell's end is noticed within poll_s (the next cell waits for it), and 5 reads of
    # a small file per second cost the measured ranks nothing visible.
    live = sys.stdout.isatty()
    beat = cell_dir / "ranks" / "rank0.json"
    shown, last_plain = None, time.monotonic()
    while not job.done():
        time.sleep(poll_s)
        if stops is not None:
            stops.enforce()
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
    executor = _own_session_executor()(folder=str(folder), python=python_command(cluster))
    # The local executor has one "node": all ranks of the emulated nodes are its tasks, and each
    # rank gets one of this machine's GPUs when the cell asks for GPUs.
    setup = [*([memlimit.join_line(cgroup)] if cgroup is not None else []), *cluster.setup]
    executor.update_parameters(tasks_per_node=layout.world_size, timeout_min=cluster.timeout_min, nodes=1,
                               gpus_per_node=layout.gpus_per_node * layout.nodes,
                               signal_delay_s=cluster.signal_delay_s, setup=setup)
    return executor


@functools.cache
def _own_session_executor():
    """submitit's LocalExecutor, whose controller (and so its ranks) runs in a session of its own.

    In the terminal's process group, a Ctrl-C reaches the controller too, which then kills its
    ranks within a second (SIGINT, then SIGKILL): no checkpoint, and a step counter that stops
    mid-window. Apart, only the launcher gets it, and stops the ranks at a step boundary
    (launcher/cluster/interrupt.py); the whole cell is also one process group to kill.
    """
    import submitit
    from submitit.local.local import LocalJob

    class OwnSessionLocalExecutor(submitit.LocalExecutor):
        def _submit_command(self, command: str):
            tasks = self.parameters.get("tasks_per_node", 1)
            process = _start_controller(Path(self.folder), command, self.parameters)
            return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(tasks)))

    return OwnSessionLocalExecutor


def _start_controller(folder: Path, command: str, params: dict[str, Any]) -> subprocess.Popen:
    """``submitit.local.local.start_controller`` (submitit 1.5, the same environment for its
    controller) in a new session; setup lines run in a shell that then execs the controller, so the
    process's pid is the controller's (the job id) and its process group the whole cell."""
    env = dict(os.environ, SUBMITIT_LOCAL_NTASKS=str(params.get("tasks_per_node", 1)),
               SUBMITIT_LOCAL_COMMAND=command, SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * params.get("timeout_min", 2.0))),
               SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(params.get("signal_delay_s", 30))), SUBMITIT_LOCAL_NODEID="0",
               SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_STDERR_TO_STDOUT="1" if params.get("stderr_to_stdout") else "",
               SUBMITIT_EXECUTOR="local", CUDA_VISIBLE_DEVICES=",".join(map(str, range(params.get("gpus_per_node", 0)))),
               SUBMITIT_LOCAL_WITH_SHELL="")  # the controller is the process itself, never a shell's child
    controller = [sys.executable, "-m", "submitit.local._local", str(folder)]
    setup = list(params.get("setup", ()))
    if setup:
        return subprocess.Popen(" && ".join([*setup, f"exec {shlex.join(controller)}"]), shell=True, env=env,
                                start_new_session=True)
    return subprocess.Popen(controller, env=env, start_new_session=True)


def sbatch_script(group: Sequence[Cell], folder: Path, job_name: str) -> str:
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
