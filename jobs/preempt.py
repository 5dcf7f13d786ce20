"""Stop requests (preemption warning, time limit, requeue, cancel) handled at a step boundary.

Slurm sends USR2 ``signal_delay_s`` before the time limit or a preemption (``--signal=USR2@90``;
USR1 can collide with NCCL, submitit uses USR2 too) and SIGTERM when it requeues or cancels a job.
A signal handler only records what arrived: the ranks are in the middle of a step and a
checkpoint is a collective. At a step boundary, about once a second, all ranks agree (one
all-reduce of the strongest request), save together, and:

- USR2: rank 0 requeues this job (the array task alone, not the whole array) and the ranks exit;
- SIGTERM: Slurm is already requeueing or cancelling; the ranks exit after saving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Optional

NONE, TERM, USR2 = 0, 1, 2
NAMES = {TERM: "SIGTERM", USR2: "SIGUSR2"}


class Preempted(Exception):
    """Raised after the checkpoint is saved; the job resumes from it when it runs again."""

    def __init__(self, reason: str, step: int, requeued: bool) -> None:
        self.reason, self.step, self.requeued = reason, step, requeued
        super().__init__(f"stopped by {reason} at step {step}; checkpoint saved"
                         + ("; job requeued" if requeued else ""))


# How often, at most, the ranks agree on stop requests. A stop is acted on within this (plus a
# step) of the signal: well inside the 90 s preemption warning and Slurm's KillWait after SIGTERM.
CHECK_INTERVAL_S = 1.0


class StopRequests:
    def __init__(self) -> None:
        self.received = NONE
        self._until_check = 0  # step boundaries to pass before the next agreement
        self._boundaries = 0  # boundaries since the last agreement
        self._last_check_s: Optional[float] = None
        self._previous = {}
        for signum, code in ((signal.SIGUSR2, USR2), (signal.SIGTERM, TERM)):
            self._previous[signum] = signal.signal(signum, self._handler(code))

    def _handler(self, code: int):
        def handle(signum, frame):
            if code == TERM and self.received >= TERM:
                # A second SIGTERM: stop now (the first one's checkpoint did not come in time).
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            # Otherwise only record: the step in flight must finish first.
            self.received = max(self.received, code)
        return handle

    def agreed(self, device) -> int:
        """The strongest request any rank has received, agreed at some step boundaries (a collective
        on those; call it at every step boundary, on every rank).

        An all-reduce at every boundary cost 3-4% of the step time with FSDP on two CPU ranks (1-3
        ms in the call, the rest in the other collectives it delayed), most of what the harness may
        cost. So the ranks agree about once every CHECK_INTERVAL_S: each round all-reduces the
        request and each rank's proposal for the number of steps until the next round (from its own
        step time); the smallest proposal wins, so every rank counts the same boundaries and all
        meet in the same collective.
        """
        self._boundaries += 1
        if self._until_check > 0:
            self._until_check -= 1
            return NONE
        import torch
        import torch.distributed as dist

        now_s = time.monotonic()
        every = 1
        if self._last_check_s is not None:
            step_s = max((now_s - self._last_check_s) / self._boundaries, 1e-6)
            every = max(1, min(10_000, int(CHECK_INTERVAL_S / step_s)))
        # MAX of the requests; MIN of the proposals, as the MAX of their negatives.
        flag = torch.tensor([self.received, -every], dtype=torch.int64, device=device)
        # Sync point (one round about every CHECK_INTERVAL_S, outside the timed step).
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        request, minus_every = (int(x) for x in flag.tolist())
        self._until_check, self._boundaries, self._last_check_s = -minus_every - 1, 0, now_s
        return request

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def requeue(job_id: str) -> bool:
    """Requeue this Slurm job; ``job_id`` names the array task (``123_4``) when it is one, so only
    that task goes back to the queue, not the whole array."""
    proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


__all__ = ["NAMES", "NONE", "TERM", "USR2", "Preempted", "StopRequests", "requeue"]
