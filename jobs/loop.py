"""The training step and the step loop: no I/O, no Slurm, no MLflow.

The loop records, per step, its time and the time spent waiting for data, and keeps the loss as a
detached tensor: reading a loss (``.item()``) would force a device sync on every step, so losses are
read once, after the measured window. A step's time is wall clock after a device sync
(``step_timing=sync``), or a pair of CUDA events around the step (``step_timing=events``), which
queue without waiting and are read after the window (:class:`EventTime`, :func:`read_times`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import nn

from contract.choices import LrScaling
from jobs.compiling import CompilePlan, forward_loss
from jobs.data import Batch
from jobs.loss import loss_fn
from jobs.memory import local_bytes, release_unsynced_grads, room_for_unsynced_grads


def scaled_lr(lr: float, scaling: LrScaling, data_parallel: int) -> float:
    """The learning rate for ``data_parallel`` ranks reading different batches (the data-parallel
    degree, contract.parallel.ParallelDims.data_parallel: tensor-parallel peers read the same
    batch and do not count), from one tuned for a single rank.

    The global batch grows with the data-parallel degree: ``linear`` multiplies by it (Goyal et al.,
    for SGD), ``sqrt`` by its square root (the usual rule for Adam-type optimizers), ``none``
    keeps ``lr``.
    """
    factor = {LrScaling.none: 1.0, LrScaling.linear: float(data_parallel), LrScaling.sqrt: math.sqrt(data_parallel)}
    return lr * factor[scaling]


__all__ = ["EventTime", "StepTrace", "Trainer", "loss_fn", "read_times", "run_steps", "scaled_lr"]


class EventTime:
    """A step's time as two CUDA events, recorded around the step without waiting; read (a sync
    point, on the end event only) when :func:`read_times` asks, after the window."""

    def __init__(self, start) -> None:
        self.start, self.end = start, torch.cuda.Event(enable_timing=True)

    def stop(self) -> EventTime:
        self.end.record()
        return self

    def seconds(self) -> float:
        self.end.synchronize()  # sync point: read after the window, never inside it
        return self.start.elapsed_time(self.end) / 1e3


def read_times(times: list) -> list[float]:
    """Step times as seconds: event pairs are read in place (once), floats kept."""
    for i, t in enumerate(times):
        if isinstance(t, EventTime):
            times[i] = t.seconds()
    return times


@dataclass
class StepTrace:
    # Seconds, or EventTime under step_timing=events until read_times reads them (after the window).
    step_time_s: list = field(default_factory=list)
    data_time_s: list[float] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)
    # fp16 only: per step, whether the GradScaler skipped the optimizer step (inf/NaN gradients),
    # as device booleans read after the window (no sync point in the loop).
    skipped: list = field(default_factory=list)


class Trainer:
    """One optimizer step = ``accum_steps`` micro-batches; gradients sync on the last only."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        accum_steps: int,
        autocast_dtype: torch.dtype | None,
        device: torch.device,
        no_sync: Callable[[], AbstractContextManager],
        scaler=None,
        vocab: int | None = None,
        chunked_loss: bool = False,
        events: bool = False,
        step_forward: Callable[[Callable], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        self.model, self.optimizer, self.accum_steps = model, optimizer, accum_steps
        self.device, self.no_sync, self.scaler = device, no_sync, scaler
        self.autocast_dtype = autocast_dtype
        # The loss: over the first `vocab` columns (a padded vocabulary's real ones), chunked or not
        # (jobs/loss.py); `events`: steps timed by CUDA events (step_timing=events).
        self.vocab, self.chunked_loss, self.events = vocab, chunked_loss, events
        # (x, y) -> loss: the model and the loss, compiled together where train.compile is on
        # (jobs.parallel.Parallelized.step_forward), else run as they are.
        self.forward_loss = (step_forward(self.loss) if step_forward
                             else forward_loss(self.model, self.loss, CompilePlan("off")))
        # Gradient bytes this rank holds after a backward (local shards under FSDP), read once on
        # the first step: gradients are freed after every step, so they cannot be read afterwards.
        self.grad_bytes: int | None = None
        # The last step's "GradScaler skipped it" flag (a device bool tensor), None without a scaler.
        self.last_skipped = None
        # Set only by the profiled probe after the window (jobs/anatomy.py): each part of the step
        # becomes a named profiler range. Off in the measured window, which pays nothing for it.
        self.annotate = False

    def _part(self, name: str) -> AbstractContextManager:
        """A profiler range named ``step::<name>`` while annotating (jobs.anatomy.PHASES), else nothing."""
        if not self.annotate:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"step::{name}")

    def _autocast(self) -> AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def step(self, batches: Iterator[Batch]) -> tuple[torch.Tensor, float]:
        data_time_s = 0.0
        total: torch.Tensor | None = None
        for micro in range(self.accum_steps):
            t0 = time.perf_counter()
            with self._part("data"):
                x, y = next(batches)
            data_time_s += time.perf_counter() - t0
            last = micro == self.accum_steps - 1
            # Accumulation steps skip the gradient all-reduce / reduce-scatter: only the last
            # micro-batch communicates (DDP no_sync, FSDP2 set_requires_gradient_sync).
            with contextlib.nullcontext() if last else self.no_sync():
                with self._part("forward"), self._autocast():
                    loss = self.forward_loss(x, y) / self.accum_steps
                with self._part("backward"):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if total is None:  # RunSpec validation keeps grad_accum_steps >= 1
            raise ValueError(f"accum_steps={self.accum_steps}: a step needs at least one micro-batch.")
        if self.grad_bytes is None:
            self.grad_bytes = sum(local_bytes(p.grad) for p in self.model.parameters() if p.grad is not None)
        with self._part("optimizer"):
            self._optimizer_step()
        return total, data_time_s

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, targets, vocab=self.vocab, chunked=self.chunked_loss)

    def _optimizer_step(self) -> None:
        if self.scaler:
            # The scale drops (backoff) exactly when the step was skipped for inf/NaN gradients;
            # compared on the device, read after the window.
            before = self.scaler._scale.clone()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.last_skipped = self.scaler._scale < before
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run_steps(trainer: Trainer, batches: Iterator[Batch], n_steps: int, sync: Callable[[], None], trace: StepTrace,
              events: bool | None = None) -> None:
    """Run ``n_steps`` steps, appending each one's timing and loss to ``trace``. ``events`` (default:
    the trainer's step_timing) times them by CUDA events, with no sync point."""
    events = trainer.events if events is None else events
    for _ in range(n_steps):
        if events:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            loss, data_time_s = trainer.step(batches)
            # No sync: the events are queued with the step's kernels and read after the window.
            trace.step_time_s.append(EventTime(start).stop())
        else:
            t0 = time.perf_counter()
            loss, data_time_s = trainer.step(batches)
            # Sync point: on CUDA the step's kernels are queued, not done; the step time is only
            # true once the device has finished. On CPU this is a no-op.
            sync()
            trace.step_time_s.append(time.perf_counter() - t0)
        trace.data_time_s.append(data_time_s)
        trace.losses.append(loss)
        if trainer.last_skipped is not None:
            trace.skipped.append(trainer.last_skipped)


def local_step_times(trainer: Trainer, batches: Iterator[Batch], n_steps: int, sync: Callable[[], None]) -> list[float]:
    """This rank's own work per step, with nobody to wait for: ``n_steps`` forward+backward passes
    with gradient communication off (the trainer's ``no_sync``), gradients then dropped, no
    optimizer step (the model is left as it was).

    Why: in a synchronous step every rank waits for the slowest inside the gradient collective,
    so wall-clock step times are the same on every rank and cannot name a straggler; these can.
    Under FSDP the forward's parameter all-gathers still meet, so there the spread is understated.
    Run after the measured window; ``sync()`` after each pass is a CUDA sync point. Under FSDP a
    pass holds the whole model's gradients unsharded: where the GPU has no room for them the probe
    is skipped ([]: stragglers are then judged from step times), and they are dropped after each
    pass (jobs.memory.release_unsynced_grads).
    """
    if not room_for_unsynced_grads(trainer.model, trainer.device):
        return []
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        x, y = next(batches)
        with trainer.no_sync():
            with trainer._autocast():
                loss = trainer.forward_loss(x, y)
            loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
        release_unsynced_grads(trainer.model)
    trainer.optimizer.zero_grad(set_to_none=True)
    return times
