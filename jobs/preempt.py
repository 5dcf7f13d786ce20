"""Stop requests (preemption warning, time limit, requeue, cancel) handled at a step boundary.

Slurm sends USR2 ``signal_delay_s`` before the time limit or a preemption (``--signal=USR2@90``;
USR1 can collide with NCCL, submitit uses USR2 too) and SIGTERM when it requeues or cancels a job.
A signal handler only records what arrived: the ranks are in the middle of a step and a
checkpoint is a collective. All ranks agree at step boundaries, in rounds about a second apart on
a control group of their own (never in the training collectives' queue, never a sync point of the
loop), save together, and:

- USR2: rank 0 requeues this job (the array task alone, not the whole array) and the ranks exit;
- SIGTERM: Slurm is already requeueing or cancelling, or the local launcher was interrupted
  (Ctrl-C); the ranks exit after saving.

Requests are recorded from the start of the rank (:func:`listen`, first thing in the worker), not
only once the step loop runs: submitit ignores SIGTERM ("bypass") until then, and a stop sent while
the model is being built would be lost and the job run to its last step.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NONE, TERM, USR2 = 0, 1, 2
NAMES = {TERM: "SIGTERM", USR2: "SIGUSR2"}


class Preempted(Exception):
    """Raised after the checkpoint is saved; the job resumes from it when it runs again."""

    def __init__(self, reason: str, step: int, requeued: bool, saved: bool = True) -> None:
        self.reason, self.step, self.requeued, self.saved = reason, step, requeued, saved
        super().__init__(f"stopped by {reason} at step {step}; "
                         + ("checkpoint saved" if saved else "no checkpoint (checkpoint.enabled=false)")
                         + ("; job requeued" if requeued else ""))


# How often, at most, the ranks agree on stop requests. A stop is acted on within about two of
# these (plus a step) of the signal: well inside the 90 s preemption warning and Slurm's KillWait.
CHECK_INTERVAL_S = 1.0


class _Received:
    """What arrived, for the whole process: a request recorded before the step loop exists counts."""

    code = NONE
    terms = 0  # SIGTERMs received


_RECEIVED = _Received()


def _handler(code: int):
    def handle(signum, frame):
        if code == TERM:
            _RECEIVED.terms += 1
            if _RECEIVED.terms >= 2:
                # A second SIGTERM: stop now (the first one's checkpoint did not come in time).
                # Counted apart from USR2: a preemption warning followed by Slurm's SIGTERM is
                # one SIGTERM, and still gets its checkpoint.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
        # Otherwise only record: the step in flight must finish first.
        _RECEIVED.code = max(_RECEIVED.code, code)
    return handle


def listen() -> dict:
    """Record stop requests (USR2, SIGTERM) from now on; returns the handlers this replaced."""
    return {signum: signal.signal(signum, _handler(code)) for signum, code in ((signal.SIGUSR2, USR2),
                                                                               (signal.SIGTERM, TERM))}


class StopRequests:
    """Stop requests, agreed by all ranks at the same step boundary.

    ``group``: a process group for control messages only (``jobs.dist.process_group`` opens one,
    on gloo, CPU tensors). The training collectives run on the default group; an all-reduce queued
    among them, even of one int once a second, cost FSDP about 5% of its throughput on two CPU
    ranks (paired blocks in one job, bench/paired_steps.py): it is a point where every rank waits
    for the slowest, between collectives that otherwise overlap.
    """

    def __init__(self, group=None) -> None:
        self.group = group
        self._until_check = 0  # step boundaries to pass before the next agreement boundary
        self._boundaries = 0  # boundaries since the last agreement boundary
        self._last_check_s: float | None = None
        # (work, tensor) of the round in flight; all_reduce's stub says Work | None, None only without async_op.
        self._pending: tuple[Any, torch.Tensor] | None = None
        # A request that arrived before (the model was being built) is kept: see the module docstring.
        self._previous = listen()

    @property
    def received(self) -> int:
        """The strongest request this process has received (NONE, TERM or USR2)."""
        return _RECEIVED.code

    def _read_round(self) -> tuple[int, int]:
        """(strongest request, smallest proposed interval) of the round in flight, (NONE, 1) if none."""
        if self._pending is None:
            return NONE, 1
        work, flag = self._pending
        self._pending = None
        # Issued one agreement interval ago (about a second): long complete, this does not wait.
        work.wait()
        request, minus_every = (int(x) for x in flag.tolist())
        return request, -minus_every

    def agreed(self) -> int:
        """The strongest request any rank has received, agreed at some step boundaries (call it at
        every step boundary, on every rank; the same boundaries are agreement boundaries on all).

        At an agreement boundary the ranks read the round issued at the previous one: its request
        decides whether they stop here, its smallest proposal how many boundaries until the next
        one. Then each issues the next round, asynchronously: its current request and a proposal
        from its own step time (steps per CHECK_INTERVAL_S). A stop is acted on within about two
        intervals of the signal, every rank at the same step.
        """
        self._boundaries += 1
        if self._until_check > 0:
            self._until_check -= 1
            return NONE
        import torch
        import torch.distributed as dist

        request, every = self._read_round()
        if request:
            return request
        now_s = time.monotonic()
        proposal = 1
        if self._last_check_s is not None:
            step_s = max((now_s - self._last_check_s) / self._boundaries, 1e-6)
            proposal = max(1, min(10_000, int(CHECK_INTERVAL_S / step_s)))
        # MAX of the requests; MIN of the proposals, as the MAX of their negatives. CPU tensor:
        # no device sync either.
        flag = torch.tensor([self.received, -proposal], dtype=torch.int64)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        self._until_check, self._boundaries, self._last_check_s = every - 1, 0, now_s
        return NONE

    def finish(self) -> None:
        """At the end of the schedule, on every rank: complete the round in flight (all issued it),
        so nothing of it runs during what comes next (the communication probe measures collectives)."""
        self._read_round()

    def restore(self) -> None:
        """Put the signal handlers back (on every exit path; a failing rank does not wait for a round
        that a dead peer will never complete). The request was acted on, or came after the last
        agreement: it is forgotten, and a later schedule in this process starts without one."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        _RECEIVED.code = NONE


def requeue(command: str) -> bool:
    """Requeue this job with ``command``, its backend's (jobs.dist.DistEnv.requeue_command: on Slurm
    ``scontrol requeue`` of the array task alone, not the whole array)."""
    proc = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


__all__ = ["NAMES", "NONE", "TERM", "USR2", "Preempted", "StopRequests", "listen", "requeue"]
