"""Stop requests (preemption warning, time limit, requeue, cancel) handled at a step boundary.

Slurm sends USR2 ``signal_delay_s`` before the time limit or a preemption (``--signal=USR2@90``;
USR1 can collide with NCCL, submitit uses USR2 too) and SIGTERM when it requeues or cancels a job.
A signal handler only records what arrived: the ranks are in the middle of a step and a
checkpoint is a collective. At a step boundary all ranks agree (one all-reduce of the strongest
request, read one step later), save together, and:

- USR2: rank 0 requeues this job (the array task alone, not the whole array) and the ranks exit;
- SIGTERM: Slurm is already requeueing or cancelling; the ranks exit after saving.
"""

from __future__ import annotations

import os
import signal
import subprocess

NONE, TERM, USR2 = 0, 1, 2
NAMES = {TERM: "SIGTERM", USR2: "SIGUSR2"}


class Preempted(Exception):
    """Raised after the checkpoint is saved; the job resumes from it when it runs again."""

    def __init__(self, reason: str, step: int, requeued: bool) -> None:
        self.reason, self.step, self.requeued = reason, step, requeued
        super().__init__(f"stopped by {reason} at step {step}; checkpoint saved"
                         + ("; job requeued" if requeued else ""))


class StopRequests:
    def __init__(self) -> None:
        self.received = NONE
        self._pending = None  # (work, flag) of the all-reduce started at the last step boundary
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
        """The strongest request any rank had received at the previous step boundary (collective;
        call at every step boundary, on every rank).

        The all-reduce of a boundary runs in the background during the next step and is read at
        the boundary after it, by then long complete: a blocking one was a sync point on every step
        (1-3 ms of a ~150 ms step on two CPU ranks, most of the 2% the harness may cost). Every rank
        reads the same round at the same boundary, so all stop together, one step later than a
        blocking check would: well inside the preemption warning.
        """
        import torch
        import torch.distributed as dist

        if self._pending is not None:
            work, flag = self._pending
            self._pending = None
            work.wait()
            agreed = int(flag.item())  # on CUDA a device read, after the step's own synchronize
            if agreed != NONE:
                return agreed
        flag = torch.tensor([self.received], dtype=torch.int32, device=device)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return NONE

    def restore(self) -> None:
        # The last boundary's all-reduce is not waited for: every rank started it, so it completes
        # (the process group keeps it and its tensor until then), and a failing rank must not block
        # here on a peer that died.
        self._pending = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def requeue(job_id: str) -> bool:
    """Requeue this Slurm job; ``job_id`` names the array task (``123_4``) when it is one, so only
    that task goes back to the queue, not the whole array."""
    proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


__all__ = ["NAMES", "NONE", "TERM", "USR2", "Preempted", "StopRequests", "requeue"]
