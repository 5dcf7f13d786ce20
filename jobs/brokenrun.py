"""Whether a run trained at all, decided once after its steps and agreed by every rank.

A run whose loss is not finite measured NaN arithmetic (which runs at another speed), one whose
loss never moved trained nothing, and one whose fp16 loss scaling skipped most of its window
measured steps without an optimizer update. None of them is a measurement of its configuration:
the job fails with a class (:data:`CLASSES`) and the fix, and never leaves a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DIVERGED, LOSS_FROZEN, STEPS_SKIPPED = "diverged", "loss_frozen", "steps_skipped"
CLASSES = (DIVERGED, LOSS_FROZEN, STEPS_SKIPPED)
# Above this share of skipped steps in the window, the window timed mostly steps without updates.
SKIPPED_SHARE_MAX = 0.5
# A loss identical to the last bit over this many window steps did not move (random batches
# alone move it, even without learning).
FROZEN_MIN_STEPS = 3


class BrokenRun(RuntimeError):
    """The run trained on something other than its configuration; ``str()`` starts with the class."""

    def __init__(self, failure_class: str, detail: str):
        super().__init__(f"{failure_class}: {detail}")
        self.failure_class = failure_class


@dataclass(frozen=True)
class Finding:
    failure_class: str
    detail: str


def inspect(losses: Sequence[float], measured: Sequence[bool], skipped: Sequence[bool] = ()) -> Finding | None:
    """What is wrong with one rank's steps (None: it trained). ``losses`` and ``measured`` hold one
    entry per step, warm-up included; ``skipped`` one per step where fp16 loss scaling ran."""
    for i, (loss, in_window) in enumerate(zip(losses, measured, strict=False)):
        if not math.isfinite(loss):
            return Finding(DIVERGED, f"the loss is {loss} at step {i} ({'measured window' if in_window else 'warm-up'}); "
                                     "a run that trains on non-finite values measures NaN arithmetic, not its "
                                     "configuration")
    window = [loss for loss, m in zip(losses, measured, strict=False) if m]
    if len(window) >= FROZEN_MIN_STEPS and max(window) == min(window):
        return Finding(LOSS_FROZEN, f"the loss stayed exactly {window[0]!r} over all {len(window)} measured steps: "
                                    "nothing was trained")
    flags = [s for s, m in zip(skipped, measured, strict=False) if m]
    if flags and sum(flags) / len(flags) > SKIPPED_SHARE_MAX:
        return Finding(STEPS_SKIPPED, f"fp16 loss scaling skipped {sum(flags)} of the {len(flags)} measured steps "
                                      "(inf/NaN gradients): the window timed steps without optimizer updates")
    return None


def check(losses: Sequence[float], measured: Sequence[bool], skipped: Sequence[bool], rank: int,
          control_group=None) -> None:
    """Raise :class:`BrokenRun` on every rank when any rank's steps are broken.

    Sync point: one object all-gather on the control group after the last step, outside every
    measurement; all ranks must raise together, or the healthy ones would wait in the next
    collective for a rank that already left."""
    import torch.distributed as dist

    mine = inspect(losses, measured, skipped)
    found: list[Finding | None] = [mine]
    if dist.is_available() and dist.is_initialized():
        found = [None] * dist.get_world_size(group=control_group)
        dist.all_gather_object(found, mine, group=control_group)
    for r, finding in enumerate(found):
        if finding is not None:
            who = "this rank" if r == rank else f"rank {r}"
            raise BrokenRun(finding.failure_class, f"{finding.detail} (seen by {who}).")
