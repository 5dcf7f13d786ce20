"""Ranks started from their spec files as one process group on this machine, given the command that
launches them: what any one-machine backend without submitit shares (cluster=torchrun; a site's
backend that starts its ranks itself, as tests/test_config.py's ``kube`` does).

``launch`` is the command before a spec file, e.g. ``python -m torch.distributed.run --standalone
--nnodes 1 --nproc-per-node 2 -m jobs`` (launcher/cluster/base.py's ``torchrun_launch``); ``launch FILE`` starts every rank
of a cell (its ``spec.json``) or of a probe (its ``probe-spec.json``, contract/programs.py), each
running ``python -m jobs FILE``. ``cluster.setup``'s lines run first, in the shell that then becomes
the launch command, so its pid is the job's id and its process group the whole job.

A cell's group is in a session of its own (``start_new_session``): a Ctrl-C at the terminal reaches
only the launcher, which sends the group's leader one SIGTERM (launcher/cluster/interrupt.py);
torchrun passes it to each rank, which saves its checkpoint at the next step boundary.
``cluster.timeout_min`` ends it as a scheduler's limit would: SIGTERM, then SIGKILL
``cluster.signal_delay_s`` later.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from contract import programs
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec
from launcher.cluster.failures import classify, first_failure
from launcher.cluster.interrupt import Interrupts, run_in_turn
from launcher.plan.cell import Cell, CellStatus
from launcher.plan.clusterschema import ClusterConfig
from launcher.state import SPEC_FILE, SweepState

LOG_FILE = "ranks.log"  # the launch command's and the ranks' output, in the cell's (or probe's) directory
POLL_S = 0.2  # how soon a cell's end, a stop request or its time limit is noticed


def start(cluster: ClusterConfig, launch: str, spec_file: Path, log: IO[str]) -> subprocess.Popen:
    """``launch spec_file`` after ``cluster.setup``'s lines, in a session of its own, its output to ``log``."""
    line = " && ".join([*cluster.setup, f"exec {launch} {shlex.quote(str(spec_file))}"])
    return subprocess.Popen(["sh", "-c", line], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_cells(state: SweepState, cells: Sequence[Cell], launch: Callable[[Cell], str],
              after_each_cell: Callable[[Cell], None] | None, interrupts: Interrupts | None = None) -> None:
    """Each cell to its end, one after another, then ``after_each_cell``; ``launch``: the cell's ranks'
    command before its spec.json (a backend's ``rank_launch``, as in its reproduce.sh). A stop
    request ends the running cell at a step boundary and cancels the cells not started (the loop
    every one-machine backend shares: launcher/cluster/interrupt.py, run_in_turn)."""
    run_in_turn(state, cells, lambda cell, stops: run_cell(state, cell, launch(cell), stops), after_each_cell,
                interrupts)


def run_cell(state: SweepState, cell: Cell, launch: str, stops: Interrupts) -> None:
    """One cell's ranks, ``launch`` its spec.json, to their end or a stop; its state saved as it goes."""
    cell_dir = state.cell_dir(cell)
    with (cell_dir / LOG_FILE).open("w") as log:
        process = start(cell.cluster, launch, cell_dir / SPEC_FILE, log)
        _started(state, cell, process.pid, stops)
        try:
            timed_out = _wait(process, cell.cluster, stops)
        finally:
            stops.release()
    _ended(state, cell, process.returncode, timed_out, stops)


def _started(state: SweepState, cell: Cell, pid: int, stops: Interrupts) -> None:
    label = f"[{cell.index + 1}/{len(state.cells)}] {cell.name}"
    stops.watch(pid, label, cell.cluster.signal_delay_s)
    cell.job_id, cell.status, cell.error, cell.failure_class = str(pid), CellStatus.running, None, None
    cell.submitted_at = time.time()
    state.save()
    print(f"{label}: pid {pid}, {cell.world_size} rank(s), {state.cell_dir(cell)}", flush=True)


def _wait(process: subprocess.Popen, cluster: ClusterConfig, stops: Interrupts) -> bool:
    """Until the group's leader ends, acting on stop requests and ``cluster.timeout_min`` (as a
    scheduler's limit: SIGTERM, a checkpoint at the next step, then SIGKILL); whether it timed out."""
    deadline, timed_out = time.monotonic() + 60 * cluster.timeout_min, False
    while process.poll() is None:
        time.sleep(POLL_S)
        stops.enforce()
        if not timed_out and time.monotonic() > deadline:
            timed_out = True
            process.terminate()
        if timed_out and time.monotonic() > deadline + cluster.signal_delay_s:
            os.killpg(process.pid, signal.SIGKILL)
    return timed_out


def _ended(state: SweepState, cell: Cell, returncode: int, timed_out: bool, stops: Interrupts) -> None:
    """The cell's state from how its ranks ended: done only with its result, else why not."""
    cell_dir = state.cell_dir(cell)
    cell.status, cell.failure_class = CellStatus.failed, None
    if returncode == 0 and (cell_dir / "result.json").exists():
        cell.status, cell.error = CellStatus.done, None
    elif stops.requested:
        cell.status = CellStatus.cancelled
        cell.error = f"interrupted by {stops.reason} before its measured window completed"
    elif timed_out:
        cell.error = f"cluster.timeout_min={cell.cluster.timeout_min} passed before its ranks ended"
        cell.failure_class = classify(cell_dir, None, cell.error, timed_out=True)
    else:
        cell.error = first_failure(cell_dir) or f"its ranks exited with {returncode}: see {cell_dir / LOG_FILE}"
        cell.failure_class = classify(cell_dir, None, cell.error)
    state.save()


def run_probe(folder: Path, cluster: ClusterConfig, launch: str, spec: ProbeSpec | NodeProbeSpec
              ) -> tuple[str | None, str | None]:
    """A probe's ranks to their end, ``launch`` its spec file, written in ``folder``: (the group
    leader's pid, why it failed or None). A Ctrl-C ends the probe's process group, then goes on."""
    path = programs.write(folder, spec)
    with (folder / LOG_FILE).open("w") as log:
        process = start(cluster, launch, path, log)
        try:
            returncode = process.wait(timeout=60 * cluster.timeout_min)
        except BaseException:  # its time limit, or a Ctrl-C: no rank outlives the launcher's wait
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
            return str(process.pid), f"cluster.timeout_min={cluster.timeout_min} passed before its ranks ended"
    if returncode == 0:
        return str(process.pid), None
    lines = [line for line in (folder / LOG_FILE).read_text(errors="replace").splitlines() if line.strip()]
    return str(process.pid), f"its ranks exited with {returncode}: {lines[-1] if lines else 'no output'}"
