"""Each cell to its end under torchrun, one after another (every run, resume and resubmission of
cells reaches this through ``Backend.submit``); the fabric and node-health probes likewise, from
their spec files (contract/programs.py): ``torchrun ... -m jobs FILE``, no pickle.

A cell is one process group in a session of its own (``start_new_session``): a Ctrl-C at the
terminal reaches only the launcher, which sends torchrun one SIGTERM (launcher/cluster/interrupt.py);
torchrun passes it to each rank, which saves its checkpoint at the next step boundary.
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

from contract import programs
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec
from launcher.cluster.failures import classify, first_failure
from launcher.cluster.interrupt import Interrupts, run_in_turn
from launcher.plan.cell import Cell, CellStatus
from launcher.plan.clusterschema import ClusterConfig
from launcher.state import SPEC_FILE, SweepState

LOG_FILE = "torchrun.log"  # torchrun's and the ranks' output, in the cell's directory
POLL_S = 0.2


def launch_command(cluster: ClusterConfig, ranks: int) -> str:
    """torchrun on this machine, ``ranks`` processes of ``python -m jobs``: the command before a spec file."""
    return (f"{cluster.python_command()} -m torch.distributed.run --standalone --nnodes 1 "
            f"--nproc-per-node {ranks} -m jobs")


def run(state: SweepState, cells: Sequence[Cell], launch: Callable[[Cell], str],
        after_each_cell: Callable[[Cell], None] | None, interrupts: Interrupts | None = None) -> None:
    """Each cell to its end, then ``after_each_cell``; ``launch``: the cell's ranks' command before its
    spec.json (the backend's ``rank_launch``, as in its reproduce.sh). A stop request ends the
    running cell at a step boundary and cancels the cells not started (the same loop as
    cluster=local: launcher/cluster/interrupt.py, run_in_turn)."""

    def run_cell(cell: Cell, stops: Interrupts) -> None:
        ranks = f"{launch(cell)} {shlex.quote(str(state.cell_dir(cell) / SPEC_FILE))}"
        # cluster.setup's lines first, in the shell that then becomes torchrun (its pid the cell's job id)
        _run_cell(state, cell, ["sh", "-c", " && ".join([*cell.cluster.setup, f"exec {ranks}"])], stops)

    run_in_turn(state, cells, run_cell, after_each_cell, interrupts)


def _run_cell(state: SweepState, cell: Cell, argv: list[str], stops: Interrupts) -> None:
    """One cell's ranks (``argv``: torchrun's command line), to their end or a stop."""
    cell_dir = state.cell_dir(cell)
    log = (cell_dir / LOG_FILE).open("w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stops.watch(process.pid, f"[{cell.index + 1}/{len(state.cells)}] {cell.name}", cell.cluster.signal_delay_s)
    cell.job_id, cell.status, cell.error, cell.failure_class = str(process.pid), CellStatus.running, None, None
    cell.submitted_at = time.time()
    state.save()
    print(f"[{cell.index + 1}/{len(state.cells)}] {cell.name}: torchrun pid {process.pid}, {cell.world_size} rank(s), "
          f"{cell_dir}", flush=True)
    deadline, timed_out = time.monotonic() + 60 * cell.cluster.timeout_min, False
    try:
        while process.poll() is None:
            time.sleep(POLL_S)
            stops.enforce()
            if not timed_out and time.monotonic() > deadline:  # cluster.timeout_min, as a scheduler's limit
                timed_out = True
                process.terminate()  # torchrun passes SIGTERM to each rank: a checkpoint at the next step
            if timed_out and time.monotonic() > deadline + cell.cluster.signal_delay_s:
                os.killpg(process.pid, signal.SIGKILL)
    finally:
        stops.release()
        log.close()
    if process.returncode == 0 and (cell_dir / "result.json").exists():
        cell.status = CellStatus.done
    elif stops.requested:
        cell.status, cell.failure_class = CellStatus.cancelled, None
        cell.error = f"interrupted by {stops.reason} before its measured window completed"
    elif timed_out:
        cell.status = CellStatus.failed
        cell.error = f"cluster.timeout_min={cell.cluster.timeout_min} passed before its ranks ended"
        cell.failure_class = classify(cell_dir, None, cell.error, timed_out=True)
    else:
        cell.status = CellStatus.failed
        cell.error = first_failure(cell_dir) or f"torchrun exited with {process.returncode}: see {cell_dir / LOG_FILE}"
        cell.failure_class = classify(cell_dir, None, cell.error)
    state.save()


def run_probe(folder: Path, cluster: ClusterConfig, ranks: int, spec: ProbeSpec | NodeProbeSpec
              ) -> tuple[str | None, str | None]:
    """A probe's ``ranks`` processes to their end, from its spec file in ``folder``: (torchrun's pid,
    why it failed or None). A Ctrl-C ends the probe's process group, then goes on."""
    path = programs.write(folder, spec)
    command = f"{launch_command(cluster, ranks)} {shlex.quote(str(path))}"
    with (folder / LOG_FILE).open("w") as log:
        process = subprocess.Popen(["sh", "-c", " && ".join([*cluster.setup, f"exec {command}"])], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
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
    return str(process.pid), f"torchrun exited with {returncode}: {lines[-1] if lines else 'no output'}"
