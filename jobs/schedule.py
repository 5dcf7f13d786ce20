"""The step schedule of one job: warm-up, measured window, checkpoints, stop requests, resume.

Steps are numbered 0..steps-1 across restarts. A fresh job measures steps >= warmup_steps. A job
resumed from a checkpoint at step s continues at step s (the step count stays exact) and re-runs a
warm-up of ``warmup_steps`` steps (or fewer near the end) that are trained but not measured:
caches, allocator and thread pools are cold again after a restart. Measurements from before the
restart come back from the checkpoint, so the summary covers every measured step.

Steady state: when ``warmup_extend_max`` > 0, a fresh job decides at the end of its warm-up
whether step times still fall (contract.stats.still_falling on this rank's warm-up times, agreed
by all ranks); while they do, one more warm-up step runs, up to ``warmup_extend_max`` extra steps.
The measured window keeps its length, so the job runs ``total_steps + extended`` steps; the
extension is saved with every checkpoint, so a resumed job measures the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.metrics import RESTARTS
from jobs import checkpoint, preempt
from jobs.compiling import graph_count
from jobs.loop import StepTrace, Trainer, read_times, run_steps

if TYPE_CHECKING:
    import torch

    from jobs.dist import DistEnv


@dataclass
class History:
    """This rank's record of every step it ran (across restarts, when the layout is unchanged)."""

    steps: list[int] = field(default_factory=list)
    trace: StepTrace = field(default_factory=StepTrace)
    measured: list[bool] = field(default_factory=list)
    # What _read returned per trace list, with the list's length then: the health check, this
    # rank's figures and the skipped-step count all ask after the window, and each device read is
    # a sync point. The lists only grow, so an equal length means the same values.
    _read_values: dict[str, tuple[int, list]] = field(default_factory=dict, repr=False, compare=False)

    def losses(self) -> list[float]:
        return [float(x) for x in self._read_once("losses")]

    def skipped(self) -> list[bool]:
        """Per step, whether fp16 loss scaling skipped it ([] without a GradScaler)."""
        return [bool(x) for x in self._read_once("skipped")]

    def _read_once(self, name: str) -> list:
        values = getattr(self.trace, name)
        known = self._read_values.get(name)
        if known is None or known[0] != len(values):
            known = self._read_values[name] = (len(values), _read(values))
        return known[1]

    def portable(self) -> dict[str, Any]:
        return {"steps": self.steps, "step_time_s": read_times(self.trace.step_time_s), "data_time_s": self.trace.data_time_s,
                "losses": self.losses(), "measured": self.measured, "skipped": self.skipped()}

    @classmethod
    def from_portable(cls, d: dict[str, Any]) -> History:
        return cls(list(d["steps"]), StepTrace(list(d["step_time_s"]), list(d["data_time_s"]), list(d["losses"]),
                                               list(d.get("skipped", []))),
                   list(d["measured"]))

    def measured_only(self, key: str) -> list[float]:
        read_times(self.trace.step_time_s)  # CUDA events (step_timing=events) read here, after the window
        return [v for v, m in zip(getattr(self.trace, key), self.measured, strict=True) if m]


def _read(values: list) -> list:
    """Device tensors and plain numbers (restored from a checkpoint) -> numbers, in order.

    One device read for all the tensors, after the window (a sync point outside any timing). Only
    the tensors are stacked: a restored float made into a CPU tensor beside CUDA ones would make
    ``torch.stack`` refuse the mix on a GPU (GPU review 3, G1: every resumed GPU run)."""
    import torch

    on_device = [x.detach().float().reshape(()) for x in values if isinstance(x, torch.Tensor)]
    read = iter(torch.stack(on_device).cpu().tolist() if on_device else [])
    return [next(read) if isinstance(x, torch.Tensor) else x for x in values]


@dataclass
class Outcome:
    history: History
    restarts: int
    logged_through: int  # steps below this were already logged (before a restart)
    first_step_unix_s: float
    resumed_from_step: int | None = None  # the checkpoint this run continued from, if any
    warmup_steps_extended: int = 0  # warm-up steps added because step times were still falling
    # Periodic checkpoints saved inside the measured window: outside every step time, but inside
    # the window's peak memory (the save stages tensors through host memory) and its wall time.
    checkpoints_in_window: int = 0
    # Graphs torch.compile made inside the measured window (a recompile there: those steps held it).
    graphs_in_window: int = 0

    @property
    def total_steps(self) -> int:
        return len(self.history.steps) and self.history.steps[-1] + 1


@dataclass(frozen=True)
class Schedule:
    """Which steps run, which are measured, when to checkpoint."""

    total_steps: int
    warmup_steps: int
    accum_steps: int = 1  # micro-batches per step (the data position after a resume depends on it)
    every_steps: int = 0  # periodic checkpoint every N steps (0: only on stop requests)
    warmup_extend_max: int = 0  # extra warm-up steps allowed while step times still fall
    save_on_stop: bool = True  # a stop request saves a checkpoint first (checkpoint.enabled)


def _no_op(*_args) -> None:
    return None


@dataclass
class Hooks:
    """What the schedule calls out to; each default does nothing.

    ``before_step(step)`` before each step (a timing harness's step start, jobs/hooks.py);
    ``sync()`` after each step (a CUDA sync point: step times are only true after it);
    ``on_step(step)`` after each step (heartbeat); ``on_checkpoint(history, lo, hi)`` logs steps
    lo..hi-1 before a stop (collective) and returns the step through which everything is logged;
    ``reset_peak_memory()`` when the measured window opens; ``on_window(event)`` with "start"
    just before the first measured step and "end" after the last step (timing harnesses).
    """

    sync: Callable[[], None] = _no_op
    on_step: Callable[[int], None] = _no_op
    on_checkpoint: Callable[[History, int, int], int] = lambda history, lo, hi: lo
    reset_peak_memory: Callable[[], None] = _no_op
    on_window: Callable[[str], None] = _no_op
    before_step: Callable[[int], None] = _no_op


@dataclass
class Progress:
    """Where this rank's schedule stands: what a checkpoint saves and a resume restores."""

    history: History = field(default_factory=History)
    start: int = 0  # the step this run starts at (a resume continues at the checkpoint's step)
    restarts: int = 0
    logged_through: int = 0  # steps below this were already logged (before a restart)
    resumed: bool = False  # whether a checkpoint was found
    extended: int = 0  # warm-up steps added because step times were still falling


@dataclass
class _Job:
    """What the schedule runs on and reports to, and where it stands (one object for its helpers)."""

    trainer: Trainer
    env: DistEnv
    device: torch.device
    out_dir: Path
    schedule: Schedule
    hooks: Hooks
    progress: Progress


def run(trainer: Trainer, batches, *, env, device, out_dir: Path, schedule: Schedule, hooks: Hooks = Hooks(),
        control_group=None) -> Outcome:
    """Run the schedule on ``trainer`` (its model and optimizer are checkpointed); raises
    :class:`preempt.Preempted` after saving when asked to stop. ``control_group``: where the ranks
    agree on stop requests (``jobs.dist.process_group`` yields it); None uses the default group."""
    import torch.distributed as dist

    job = _Job(trainer, env, device, out_dir, schedule, hooks, _resume(trainer, batches, env, device, out_dir,
                                                                       schedule))
    progress, history = job.progress, job.progress.history
    total = schedule.total_steps + progress.extended
    start = progress.start
    rewarm_until = start + min(schedule.warmup_steps, max(0, total - start - 1)) if progress.resumed else 0
    stop = preempt.StopRequests(control_group)
    measuring = False
    # Only a fresh job extends its warm-up (a resumed one restored the extension it decided on).
    deciding = not progress.resumed and schedule.warmup_extend_max > 0
    first_step_unix_s = time.time()
    saved_in_window = 0
    graphs_at_window = None
    try:
        step = start
        while step < total:
            if deciding and step == schedule.warmup_steps + progress.extended:
                if progress.extended < schedule.warmup_extend_max and _agree_still_falling(history, control_group):
                    progress.extended += 1
                    total += 1
                else:
                    deciding = False
            is_measured = step >= schedule.warmup_steps + progress.extended and step >= rewarm_until
            if is_measured and not measuring:
                # Sync point (CUDA): the warm-up's queued work ends before the window opens.
                hooks.sync()
                hooks.reset_peak_memory()
                # Sync point: every rank starts the measured window together, so no rank's window
                # includes waiting for a slower rank to finish its warm-up.
                dist.barrier()
                measuring = True
                graphs_at_window = graph_count()
                hooks.on_window("start")
            hooks.before_step(step)
            run_steps(trainer, batches, 1, hooks.sync, history.trace)
            history.steps.append(step)
            history.measured.append(is_measured)
            hooks.on_step(step)
            step += 1
            request = stop.agreed()
            periodic = schedule.every_steps > 0 and step % schedule.every_steps == 0 and step < total
            if request or periodic:
                saved_in_window += bool(periodic and measuring)
                _save_or_stop(job, step, request)
        # Sync point (CUDA): the window ends when the device has finished its last step, not when the
        # host queued it (under step_timing=events nothing inside the window waited).
        hooks.sync()
        hooks.on_window("end")
        stop.finish()
    finally:
        stop.restore()
    graphs_in_window = graph_count() - graphs_at_window if graphs_at_window is not None else 0
    return Outcome(history, progress.restarts, progress.logged_through, first_step_unix_s,
                   start if progress.resumed else None, progress.extended, saved_in_window, graphs_in_window)


def _agree_still_falling(history: History, control_group) -> bool:
    """Whether any rank's warm-up step times still fall (contract.stats.still_falling), agreed by all.

    Sync point: one all-reduce of one integer on the control group (gloo, CPU tensor), at the end
    of the warm-up, before the window's own barrier: no measured step waits on it. Every rank
    must take the same decision, or they would disagree on the number of steps and hang.
    """
    import torch
    import torch.distributed as dist

    from contract.stats import still_falling

    times = read_times(history.trace.step_time_s)  # under step_timing=events a sync point, before the window
    mine = still_falling([t for t, m in zip(times, history.measured, strict=True) if not m])
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    flag = torch.tensor([int(mine)], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control_group)
    return bool(flag.item())


def _resume(trainer: Trainer, batches, env, device, out_dir: Path, schedule: Schedule) -> Progress:
    """Where the last checkpoint left this job (a fresh :class:`Progress` without one); the data
    stream is moved past what was consumed before it."""
    found = checkpoint.latest(out_dir)
    if found is None:
        return Progress()
    meta, mine = checkpoint.load(found, trainer.model, trainer.optimizer, rank=env.rank, world_size=env.world_size)
    history = History()
    if mine is not None:
        history = History.from_portable(mine["history"])
        checkpoint.restore_rng(mine["rng"], device)
        if trainer.scaler is not None and mine.get("scaler"):
            # fp16: the resumed run goes on at the scale it had reached, not at init_scale again,
            # whose back-off would skip steps the uninterrupted run did not (GPU review 3, G4).
            trainer.scaler.load_state_dict(mine["scaler"])
    # The data position is a function of the step: skip what was consumed before the stop.
    for _ in range(meta["step"] * schedule.accum_steps):
        next(batches)
    return Progress(history, start=meta["step"], restarts=meta[RESTARTS] + 1, logged_through=meta["logged_through"],
                    resumed=True, extended=meta.get("warmup_extended", 0))


def _save_or_stop(job: _Job, step: int, request) -> None:
    """Checkpoint at ``step`` (collective); on a stop request log first, then raise Preempted (without
    a checkpoint when the schedule's ``save_on_stop`` is false)."""
    progress, trainer, env = job.progress, job.trainer, job.env
    if request:
        progress.logged_through = job.hooks.on_checkpoint(progress.history, progress.logged_through, step)
    save = job.schedule.save_on_stop or not request
    if save:
        checkpoint.save(job.out_dir, trainer.model, trainer.optimizer, rank=env.rank,
                        meta={"step": step, RESTARTS: progress.restarts, "world_size": env.world_size,
                              "logged_through": progress.logged_through, "saved_unix_s": time.time(),
                              "warmup_extended": progress.extended},
                        rank_state={"history": progress.history.portable(), "rng": checkpoint.rng_state(job.device),
                                    "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None})
    if request:
        requeued = False
        if request == preempt.USR2 and env.is_head and env.requeue_command:
            requeued = preempt.requeue(env.requeue_command)
        raise preempt.Preempted(preempt.NAMES[request], step, requeued, saved=save)
