"""The step schedule of one job: warm-up, measured window, checkpoints, stop requests, resume.

Steps are numbered 0..steps-1 across restarts. A fresh job measures steps >= warmup_steps. A job
resumed from a checkpoint at step s continues at step s (the step count stays exact) and re-runs a
warm-up of ``warmup_steps`` steps (or fewer near the end) that are trained but not measured:
caches, allocator and thread pools are cold again after a restart. Measurements from before the
restart come back from the checkpoint, so the summary covers every measured step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from jobs import checkpoint, preempt
from jobs.loop import StepTrace, Trainer, run_steps


@dataclass
class History:
    """This rank's record of every step it ran (across restarts, when the layout is unchanged)."""

    steps: List[int] = field(default_factory=list)
    trace: StepTrace = field(default_factory=StepTrace)
    measured: List[bool] = field(default_factory=list)

    def losses(self) -> List[float]:
        import torch

        if not self.trace.losses:
            return []
        # One device read for all losses, after the window (a sync point outside any timing).
        return torch.stack([x.detach().float().reshape(()) if isinstance(x, torch.Tensor) else torch.tensor(float(x))
                            for x in self.trace.losses]).cpu().tolist()

    def skipped(self) -> List[bool]:
        """Per step, whether fp16 loss scaling skipped it ([] without a GradScaler)."""
        import torch

        flags = self.trace.skipped
        on_device = [f.reshape(()) for f in flags if isinstance(f, torch.Tensor)]
        # One device read for all of them (restored steps are plain bools already).
        read = iter(torch.stack(on_device).cpu().tolist() if on_device else [])
        return [bool(next(read)) if isinstance(f, torch.Tensor) else bool(f) for f in flags]

    def portable(self) -> Dict[str, Any]:
        return {"steps": self.steps, "step_time_s": self.trace.step_time_s, "data_time_s": self.trace.data_time_s,
                "losses": self.losses(), "measured": self.measured, "skipped": self.skipped()}

    @classmethod
    def from_portable(cls, d: Dict[str, Any]) -> "History":
        return cls(list(d["steps"]), StepTrace(list(d["step_time_s"]), list(d["data_time_s"]), list(d["losses"]),
                                               list(d.get("skipped", []))),
                   list(d["measured"]))

    def measured_only(self, key: str) -> List[float]:
        return [v for v, m in zip(getattr(self.trace, key), self.measured, strict=True) if m]


@dataclass
class Outcome:
    history: History
    restarts: int
    logged_through: int  # steps below this were already logged (before a restart)
    first_step_unix_s: float
    resumed_from_step: Optional[int] = None  # the checkpoint this run continued from, if any


def run(
    trainer: Trainer,
    batches,
    *,
    model,
    optimizer,
    env,
    device,
    out_dir: Path,
    total_steps: int,
    warmup_steps: int,
    accum_steps: int,
    every_steps: int,
    sync: Callable[[], None],
    on_step: Callable[[int], None],
    on_checkpoint: Callable[[History, int, int], int],
    reset_peak_memory: Callable[[], None],
    control_group=None,
) -> Outcome:
    """Run the schedule; raises :class:`preempt.Preempted` after saving when asked to stop.

    ``on_step(step)`` runs after each step (heartbeat); ``on_checkpoint(history, lo, hi)`` logs
    steps lo..hi-1 (collective) and returns the step through which everything is logged.
    ``control_group``: where the ranks agree on stop requests (``jobs.dist.process_group`` yields
    it); None uses the default group, i.e. the training collectives' queue.
    """
    import torch.distributed as dist

    start, restarts, logged_through, history = 0, 0, 0, History()
    found = checkpoint.latest(out_dir)
    if found is not None:
        meta, mine = checkpoint.load(found, model, optimizer, rank=env.rank, world_size=env.world_size)
        start, restarts, logged_through = meta["step"], meta["restarts"] + 1, meta["logged_through"]
        if mine is not None:
            history = History.from_portable(mine["history"])
            checkpoint.restore_rng(mine["rng"], device)
        # The data position is a function of the step: skip what was consumed before the stop.
        for _ in range(start * accum_steps):
            next(batches)
    rewarm_until = start + min(warmup_steps, max(0, total_steps - start - 1)) if found is not None else 0

    stop = preempt.StopRequests(control_group)
    measuring = False
    first_step_unix_s = time.time()
    try:
        step = start
        while step < total_steps:
            is_measured = step >= warmup_steps and step >= rewarm_until
            if is_measured and not measuring:
                reset_peak_memory()
                # Sync point: every rank starts the measured window together, so no rank's window
                # includes waiting for a slower rank to finish its warm-up.
                dist.barrier()
                measuring = True
            run_steps(trainer, batches, 1, sync, history.trace)
            history.steps.append(step)
            history.measured.append(is_measured)
            on_step(step)
            step += 1
            request = stop.agreed()
            periodic = every_steps > 0 and step % every_steps == 0 and step < total_steps
            if not (request or periodic):
                continue
            if request:
                logged_through = on_checkpoint(history, logged_through, step)
            checkpoint.save(out_dir, model, optimizer, rank=env.rank,
                            meta={"step": step, "restarts": restarts, "world_size": env.world_size,
                                  "logged_through": logged_through, "saved_unix_s": time.time()},
                            rank_state={"history": history.portable(),
                                        "rng": checkpoint.rng_state(device)})
            if request:
                requeued = False
                if request == preempt.USR2 and env.is_head and env.requeue_id:
                    requeued = preempt.requeue(env.requeue_id)
                raise preempt.Preempted(preempt.NAMES[request], step, requeued)
        stop.finish()
    finally:
        stop.restore()
    return Outcome(history, restarts, logged_through, first_step_unix_s, start if found is not None else None)
