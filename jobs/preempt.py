"""Stop requests (preemption warning, time limit, requeue, cancel) handled at a step boundary.

Slurm sends USR2 ``signal_delay_s`` before the time limit or a preemption (``--signal=USR2@90``;
USR1 can collide with NCCL, submitit uses USR2 too) and SIGTERM when it requeues or cancels a job.
A signal handler only records what arrived: the ranks are in the middle of a step and a
checkpoint is a collective. At the next step boundary all ranks agree (one all-reduce of the
strongest request), save together, and:

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
        """The strongest request any rank received (collective; call at every step boundary)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.received], dtype=torch.int32, device=device)
        # Sync point (tiny): one int all-reduced per step, outside the timed step.
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def requeue(job_id: str) -> bool:
    """Requeue this Slurm job; ``job_id`` names the array task (``123_4``) when it is one, so only
    that task goes back to the queue, not the whole array."""
    proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


__all__ = ["NAMES", "NONE", "TERM", "USR2", "Preempted", "StopRequests", "requeue"]
