"""Ctrl-C, SIGTERM and SIGHUP while local cells run: stop them the way a preemption stops a job.

A local cell's submitit controller and its ranks run in a session of their own
(:func:`launcher.cluster.local.submit.local_executor`), so a Ctrl-C at the terminal, a wrapper's SIGTERM or a
closed terminal's SIGHUP reaches the launcher alone, and the launcher decides:

- the first signal: the running cell's controller gets one SIGTERM and passes it to each rank; the
  ranks agree on it at a step boundary, save their checkpoint and exit (jobs/preempt.py), as after
  a preemption warning. No further cell starts. A cell whose ranks are still there ``grace_s``
  later (the cell's ``cluster.signal_delay_s``, the time a preemption gives them) is killed;
- a second signal: the cell's whole process group is killed at once and the launcher exits, after
  recording in the sweep document what it stopped.

Either way no process of the cell is left behind, and the launcher exits with 128 + the signal's
number (130 for Ctrl-C), as a shell reports a command a signal ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from contract import mlflow_client
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NAMES: dict[int, str] = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
# The error of a cell an interrupted sweep never started (launcher/sweep.py prints no line for it).
NOT_STARTED = "not started: the sweep was interrupted by "


def _say(text: str) -> None:
    """Write from a signal handler: straight to the file descriptor, never through a buffered stream
    that the interrupted code may be in the middle of writing (a reentrant call would raise)."""
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured output)
        print(text, end="", file=sys.stderr, flush=True)


class Interrupts:
    """The stop requests of one local sweep (a context manager that installs the signal handlers).

    ``on_abort(reason)`` runs on a second signal, after the running cell was killed and before the
    launcher exits: it records the cells' fate (it must be quick and touch no server).
    """

    def __init__(self, on_abort: Callable[[str], object] | None = None) -> None:
        self.signum: int | None = None
        self.on_abort = on_abort
        self._previous: dict[int, object] = {}
        self._pgid: int | None = None  # the running cell's controller (and process group)
        self._label = ""
        self._grace_s = 0.0
        self._stop_sent_s: float | None = None
        self.killed = False  # the running cell's ranks outlived their grace and were killed

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        mlflow_client.stop_requested(False)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def reason(self) -> str:
        return NAMES.get(self.signum or 0, "a signal")

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def watch(self, pgid: int, label: str, grace_s: float) -> None:
        """The cell now running: its controller's pid (= its process group), for the messages its name."""
        self._pgid, self._label, self._grace_s, self._stop_sent_s, self.killed = pgid, label, grace_s, None, False
        if self.requested:  # the signal came while the cell was being started
            self._stop()

    def release(self) -> None:
        """The cell's processes have ended."""
        self._pgid, self._stop_sent_s = None, None

    def enforce(self) -> None:
        """Kill the running cell if its ranks have outlived their grace after the stop (call it while
        waiting for the cell)."""
        if self._stop_sent_s is not None and time.monotonic() - self._stop_sent_s > self._grace_s:
            _say(f"    {self._label}: its ranks did not stop within {self._grace_s:g} s; killing them.\n")
            self._kill()
            self.killed = True
            self._stop_sent_s = None

    def _handle(self, signum: int, frame) -> None:
        mlflow_client.stop_requested()  # MLflow calls from now on wait seconds at most, not minutes
        if self.signum is None:
            self.signum = signum
            what = f"stopping {self._label} at its next step boundary (its ranks save a checkpoint); " \
                if self._pgid is not None else ""
            _say(f"\n{NAMES[signum]}: {what}no further cell starts. Press Ctrl-C again (or send another "
                 f"signal) to end at once.\n")
            self._stop()
            return
        self._abort(signum)

    def _stop(self) -> None:
        if self._pgid is None or self._stop_sent_s is not None:
            return
        try:
            os.kill(self._pgid, signal.SIGTERM)  # the controller passes it to each rank, once
        except ProcessLookupError:
            return
        self._stop_sent_s = time.monotonic()

    def _kill(self) -> None:
        if self._pgid is not None:
            try:
                os.killpg(self._pgid, signal.SIGKILL)  # the controller, its ranks and anything they started
            except (ProcessLookupError, PermissionError):
                pass

    def _abort(self, signum: int) -> None:
        self._kill()
        with contextlib.suppress(Exception):  # os._exit below flushes nothing; a reentrant flush may fail
            sys.stdout.flush()
        reason = f"a second signal, {NAMES[signum]}, after {self.reason}"
        if self.on_abort is not None:
            try:
                self.on_abort(reason)
            except Exception as exc:  # exiting regardless: say what could not be recorded
                _say(f"could not record the stop in the sweep document: {exc}\n")
        _say(f"{NAMES[signum]} again: killed the running cell's processes; exiting now.\n")
        os._exit(128 + signum)


@contextlib.contextmanager
def stop_waiting() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does, while the launcher only waits for
    jobs that are not its processes (Slurm's): stopping the wait is all any of them asks."""
    def interrupt(signum, frame):
        mlflow_client.stop_requested()
        raise KeyboardInterrupt(NAMES[signum])

    mlflow_client.stop_requested(False)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = ["NAMES", "SIGNALS", "Interrupts", "stop_waiting"]


# ---- cells in turn on this machine (cluster=local, cluster=torchrun) ------------------------------

def run_in_turn(state: SweepState, cells: Sequence[Cell], run_cell: Callable[[Cell, Interrupts], None],
                after_each_cell: Callable[[Cell], None] | None, interrupts: Interrupts | None = None) -> None:
    """``run_cell`` on each cell to its end, one after another on this machine, then ``after_each_cell``
    (every backend whose cells share this machine: local, torchrun). Ctrl-C, SIGTERM or SIGHUP
    (``interrupts``, or handlers of this call's own) stop the running cell at a step boundary and
    start no further cell (the Interrupts above); the cells stopped or never started are
    cancelled, and ``after_each_cell`` sees them too (their MLflow runs end KILLED)."""
    own = interrupts is None
    stops = interrupts if interrupts is not None else Interrupts()
    if stops.on_abort is None:
        stops.on_abort = lambda reason: _abandon(state, cells, reason)
    with stops if own else contextlib.nullcontext():
        for cell in cells:
            if stops.requested:
                break
            run_cell(cell, stops)
            if after_each_cell is not None:
                after_each_cell(cell)
        if stops.requested:
            for cell in _abandon(state, cells, stops.reason):
                if after_each_cell is not None:
                    after_each_cell(cell)
            print(f"{stops.reason}: the sweep stopped; {_stopped_summary(cells)}.\nResume with: python -m "
                  f"launcher.status {state.sweep_dir} --resubmit-failed", file=sys.stderr, flush=True)


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


def _stopped_summary(cells: Sequence[Cell]) -> str:
    cancelled = [c for c in cells if c.status is CellStatus.cancelled]
    unstarted = sum((c.error or "").startswith(NOT_STARTED) for c in cancelled)
    return (f"{len(cancelled) - unstarted} cell(s) stopped, {unstarted} not started, all marked cancelled in "
            f"sweep.json")
