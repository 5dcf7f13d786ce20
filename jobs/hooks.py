"""The worker's public timing hooks: named points of a rank's run that a harness can observe.

The worker calls an :class:`Observer` at each point; this one does nothing, so a run without a
harness pays one method call per step and a null context per phase after the window. A timing
harness (bench/worker_entry.py) passes its own subclass to ``jobs.worker.main`` instead of
patching the worker's functions.

Points: ``step_start(step)`` before every step the schedule runs (warm-up included);
``window("start")`` after the barrier that opens the measured window and ``window("end")`` after
its last step; ``phase(name)`` around each part of the work after the window (:data:`PHASES`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

# The parts of a rank's work after the measured window, in the order they run. "after_window" spans
# everything from the end of the schedule to the last sink call of benchmark(); the others sit inside
# it, except "sink_finish" (the end of main: JSONL status line, MLflow's one log_batch) and
# "mlflow_client_start" (MLflow's import and store opening, inside "sink_finish").
PHASES = ("after_window", "health_check", "comm_probe", "local_probe", "rank_figures", "gather", "summarize",
          "reduce", "sink_set_tags", "sink_log_steps", "sink_log_summary", "sink_log_system", "sink_finish",
          "mlflow_client_start")


class Observer:
    """Does nothing at every point; a harness overrides what it times."""

    def step_start(self, step: int) -> None:
        """Before step ``step`` (numbered across restarts) runs."""

    def window(self, event: str) -> None:
        """``"start"``: the measured window opens (after its barrier); ``"end"``: its last step ended."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Around one part of the work after the window; ``name`` is one of :data:`PHASES`."""
        return nullcontext()
