"""Local submission with submitit's LocalExecutor: ``LocalBackend`` runs each cell to its end, one
after another (every run, resume and resubmission of cells reaches this through ``Backend.submit``).

Cells run in the foreground: they share this machine's cores, and two benchmarks running at once
would measure each other. Each cell's controller runs in a session of its own, inside the cell's
memory cgroup where it has a memory limit (memlimit.py), and a Ctrl-C stops it at a step boundary
(launcher/cluster/interrupt.py).
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contract import programs, records
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec
from contract.spec import Layout
from launcher.cluster.failures import OOM, classify, first_failure, last_line
from launcher.cluster.interrupt import Interrupts, run_in_turn
from launcher.cluster.local import memlimit
from launcher.cluster.local.ranks import OnLocal
from launcher.plan.cell import Cell, CellStatus
from launcher.plan.clusterschema import ClusterConfig
from launcher.state import SPEC_FILE, SweepState


def run(state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
        interrupts: Interrupts | None = None) -> None:
    """Each cell to its end, one after another, then ``after_each_cell`` (tracking, progress)."""
    run_in_turn(state, cells, functools.partial(_run_cell, state), after_each_cell, interrupts)


def _run_cell(state: SweepState, cell: Cell, stops: Interrupts) -> None:
    # The cell's own memory limit (cluster.mem_gb per emulated node), as sbatch --mem would set.
    cgroup = memlimit.create(cell.cluster.mem_gb * cell.layout.nodes) if cell.cluster.mem_gb else None
    executor = local_executor(state.path / "submitit", cell.cluster, cell.layout, cgroup)
    job = executor.submit(from_spec_file(state.cell_dir(cell) / SPEC_FILE))
    stops.watch(int(job.job_id), f"[{cell.index + 1}/{len(state.cells)}] {cell.name}", cell.cluster.signal_delay_s)
    cell.job_id, cell.status, cell.error, cell.failure_class = job.job_id, CellStatus.running, None, None
    cell.submitted_at = time.time()
    state.save()
    print(f"[{cell.index + 1}/{len(state.cells)}] {cell.name}: job {job.job_id}, {cell.world_size} rank(s), "
          f"{state.cell_dir(cell)}", flush=True)
    try:
        _show_progress(job, state.cell_dir(cell), state.load_spec(cell).train.steps, stops=stops)
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


def _record_interrupted(state: SweepState, cell: Cell, stops: Interrupts) -> None:
    """A cell the interrupt stopped before its measured window completed: cancelled, never done."""
    cell_dir = state.cell_dir(cell)
    step = (records.maybe_document(cell_dir / "ranks" / "rank0.json", "rank 0's heartbeat") or {}).get("step")
    at = f" at step {step + 1} of {state.load_spec(cell).train.steps}" if isinstance(step, int) else ""
    marker = cell_dir / "preempted.txt"  # rank 0 writes it after the checkpoint is saved
    saved = (marker.exists() and marker.stat().st_mtime >= (cell.submitted_at or 0.0)
             and "checkpoint saved" in marker.read_text())
    how = (f"its ranks were killed after {cell.cluster.signal_delay_s:g} s (cluster.signal_delay_s)" if stops.killed
           else "checkpoint saved: --resubmit-failed resumes it from there" if saved else "no checkpoint")
    cell.status, cell.failure_class = CellStatus.cancelled, None
    cell.error = f"interrupted by {stops.reason}{at}, before its measured window completed; {how}"


def _record_local_failure(state: SweepState, cell: Cell, exc: Exception, cgroup: Path | None) -> None:
    """The first failure and its class; the cell's memory cgroup is what sacct is on Slurm: an OOM kill
    it counted is decisive, whatever the other ranks then reported."""
    cell_dir = state.cell_dir(cell)
    cell.status = CellStatus.failed
    cell.error = first_failure(cell_dir) or last_line(exc)
    kills = memlimit.oom_kills(cgroup) if cgroup is not None else 0
    if kills:
        cell.error = (f"out of memory: the kernel's OOM killer ended {kills} process(es) at the cell's memory limit "
                      f"(cluster.mem_gb={cell.cluster.mem_gb:g} per node); {cell.error}")
    cell.failure_class = classify(cell_dir, OOM if kills else None, f"{cell.error}\n{exc}")


def _show_progress(job, cell_dir: Path, steps: int, poll_s: float = 0.2, plain_every_s: float = 30.0,
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
        step = (records.maybe_document(beat, "rank 0's heartbeat") or {}).get("step")
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


def run_probe(folder: Path, cluster: ClusterConfig, layout: Layout, spec: ProbeSpec | NodeProbeSpec
              ) -> tuple[str | None, str | None]:
    """A probe (the fabric probe before any cell starts, or the node health probe on this machine's
    emulated nodes: one process each) to its end, from its spec file in its ``out_dir`` (submitit's files
    in ``folder``): (job id, why it failed)."""
    path = programs.write(Path(spec.out_dir), spec)  # the probe's own folder: one file per probe
    return _to_its_end(local_executor(folder, cluster, layout).submit(from_spec_file(path)))


def from_spec_file(path: Path) -> OnLocal:
    """What each local task runs: ``python -m jobs``'s entry on ``path``, the file's path its only
    content (jobs/__main__.py), after the executor's variables are translated."""
    from jobs.__main__ import SpecFile  # the ranks' code: imported when a job is submitted, never at start-up

    return OnLocal(SpecFile(path))


def _to_its_end(job) -> tuple[str | None, str | None]:
    try:
        job.results()
    except KeyboardInterrupt:
        job.cancel()  # its ranks run in a session of their own: Ctrl-C reached only this process
        raise
    except Exception as exc:  # a failed probe costs the sweep its fabric figures, not its cells
        return job.job_id, last_line(exc)
    return job.job_id, None


def local_executor(folder: Path, cluster: ClusterConfig, layout: Layout, cgroup: Path | None = None):
    """submitit's LocalExecutor with the cell's settings: the time limit and its warning, the setup
    lines and interpreter, and the memory cgroup the job joins before its ranks start."""
    executor = _own_session_executor()(folder=str(folder), python=cluster.python_command())
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


