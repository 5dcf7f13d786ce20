"""Where metrics go. Rank 0 gets real sinks; every other rank gets a NullSink (no ``if rank == 0``).

JSONL in the run directory is written first and always: it is the record of truth, and what a
later sync replays into MLflow if the tracking server was unreachable. MLflow logging is
best-effort: a tracking outage never fails a benchmark.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from contract import cell_run, mlflow_client
from contract.records import read_records
from jobs.hooks import Observer


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class NullSink:
    def log_steps(self, records: list[dict[str, Any]]) -> None: ...

    def log_summary(self, summary: dict[str, Any]) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_system(self, records: list[dict[str, Any]]) -> None:
        """System metrics of the job's own GPUs (jobs.energy.system_records): ``{"step": sample
        index, "time": unix_s, "system/...": value}``. Kept apart from training steps: their step
        is a sample index, not a training step (FanOut's resume bookkeeping must not see them)."""

    def flush(self) -> None:
        """Send what is buffered now (before a checkpoint-and-stop); the run stays open."""

    def finish(self, status: str, error: str | None = None) -> None: ...


class JsonlSink(NullSink):
    """Appends one JSON object per line to ``metrics.jsonl`` (steps, summary, tags, status)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A run killed mid-write left half a line: end it, or this run's first record joins it.
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb+") as f:
                f.seek(-1, 2)
                if f.read(1) != b"\n":
                    f.write(b"\n")

    def _write(self, records: Iterable[dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            for rec in records:
                f.write(json.dumps({k: _clean(v) for k, v in rec.items()}) + "\n")

    def log_start(self, start_s: float) -> None:
        """The attempt's start (epoch seconds): the job's run starts at the first one (contract/cell_run.py)."""
        self._write([{"kind": "start", "time": start_s}])

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        self._write({"kind": "step", **r} for r in records)

    def logged_steps(self) -> set[int]:
        """The steps an earlier run of this job already recorded here (empty for a fresh job)."""
        return {int(r["step"]) for r in read_records(self.path) if r.get("kind") == "step"}

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._write([{"kind": "summary", "time": time.time(), **summary}])

    def set_tags(self, tags: dict[str, str]) -> None:
        self._write([{"kind": "tags", **tags}])

    def log_system(self, records: list[dict[str, Any]]) -> None:
        self._write({"kind": "system", **r} for r in records)

    def finish(self, status: str, error: str | None = None) -> None:
        self._write([{"kind": "status", "status": status, "error": error, "time": time.time()}])




class MlflowSink(NullSink):
    """Logs to the cell's run through an explicit MlflowClient.

    Everything is kept in memory and written at :meth:`finish`: one ``log_batch`` (metrics and
    tags) and one ``set_terminated``, two store transactions per job instead of one per call
    (5-20 ms each on SQLite, most of the worker's telemetry time). MLflow is imported only then,
    after the measured window: importing it and opening the store took rank 0 about 2 s before its
    first step, while every other rank waited. The run id is given, or found at finish in
    ``cell_dir``, where the run is created then if nobody has yet, starting at the job's start
    (contract/cell_run.py). A job killed before finish loses nothing: JSONL has it all and
    ``python -m launcher.sync`` replays it.
    """

    # MLflow accepts at most 1000 metrics + tags per log_batch call, 100 of them tags.
    BATCH = 1000
    TAG_BATCH = 100
    RETRIES = 3

    def __init__(self, tracking_uri: str, run_id: str | None = None, cell_dir: Path | None = None,
                 observer: Observer | None = None) -> None:
        self.tracking_uri, self.run_id, self.cell_dir = tracking_uri, run_id, cell_dir
        self.observer = observer or Observer()  # times the client's start-up (jobs/hooks.py)
        self._metrics: list[tuple] = []  # (key, value, timestamp_ms, step)
        self._tags: dict[str, str] = {}

    def _resolve_run_id(self, client) -> str | None:
        if not self.run_id and self.cell_dir is not None:
            start_s = cell_run.first_start_s(Path(self.cell_dir) / cell_run.METRICS_FILE) or time.time()
            try:
                self.run_id = cell_run.open_run(client, Path(self.cell_dir), start_s)
            except Exception as exc:  # best-effort: launcher.sync creates it from the same template
                print(f"[mlflow] could not create the run in {self.tracking_uri}: {exc}", file=sys.stderr)
        return self.run_id

    def client(self):
        # A tracking outage must not stall a benchmark: mlflow_client sets short HTTP retries (JSONL
        # has everything and `launcher.sync` replays it later).
        return mlflow_client.client(self.tracking_uri)

    def _try(self, what: str, fn, *args, **kwargs) -> bool:
        for attempt in range(self.RETRIES):
            try:
                fn(*args, **kwargs)
                return True
            except Exception as exc:  # tracking is best-effort: JSONL already holds the data
                if attempt == self.RETRIES - 1:
                    print(f"[mlflow] {what} failed after {self.RETRIES} tries: {exc}", file=sys.stderr)
                    return False
                time.sleep(0.5 * 2**attempt)
        return False

    def _add_metrics(self, points: Iterable[tuple]) -> None:
        now_ms = int(time.time() * 1000)
        self._metrics.extend((key, float(v), now_ms, step) for key, v, step in points if _clean(v) is not None)

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        self._add_metrics((k, v, r["step"]) for r in records for k, v in r.items()
                          if k != "step" and isinstance(v, (int, float)))

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._add_metrics((k, v, 0) for k, v in summary.items() if isinstance(v, (int, float)))

    def log_system(self, records: list[dict[str, Any]]) -> None:
        # Each point keeps the time it was sampled at: MLflow's system-metrics view plots by time.
        self._metrics.extend((k, float(v), int(1000 * r["time"]), int(r["step"])) for r in records
                             for k, v in r.items() if k not in ("step", "time") and _clean(v) is not None)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._tags.update({k: str(v)[:mlflow_client.TAG_MAX_CHARS] for k, v in tags.items()})

    def flush(self) -> None:
        self._send(status=None)

    def finish(self, status: str, error: str | None = None) -> None:
        if error:
            self._tags["error"] = error[:mlflow_client.TAG_MAX_CHARS]
        self._send(status)

    def _send(self, status: str | None) -> None:
        try:
            with self.observer.phase("mlflow_client_start"):
                client = self.client()
        except Exception as exc:  # best-effort, as every call below
            print(f"[mlflow] cannot open {self.tracking_uri}: {exc}", file=sys.stderr)
            return
        run_id = self._resolve_run_id(client)
        if not run_id:
            print(f"[mlflow] no run id (none given, no run template in {self.cell_dir}): the metrics stay in "
                  "metrics.jsonl; python -m launcher.sync replays them once the run exists.", file=sys.stderr)
            return
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(*m) for m in sorted(self._metrics, key=lambda m: cell_run.view_order(m[0]))]
        tags = [RunTag(k, v) for k, v in self._tags.items()]
        self._metrics, self._tags = [], {}
        while metrics or tags:
            batch_tags, tags = tags[: self.TAG_BATCH], tags[self.TAG_BATCH :]
            room = self.BATCH - len(batch_tags)
            batch_metrics, metrics = metrics[:room], metrics[room:]
            self._try("log_batch", client.log_batch, run_id, metrics=batch_metrics, tags=batch_tags)
        if status:
            # The run ends when its job does: now, on the job's last rank-0 step.
            self._try("set_terminated", client.set_terminated, run_id, status, end_time=int(time.time() * 1000))


class FanOut(NullSink):
    """Rank 0's sinks, fed the same records. One record per step: a step in ``logged_steps`` (an
    earlier run of this job logged it, then was killed before its checkpoint completed, so the
    resumed job ran it again) is not logged a second time, to JSONL or to MLflow."""

    def __init__(self, *sinks: NullSink, logged_steps: Iterable[int] = ()) -> None:
        self.sinks = sinks
        self.logged_steps = set(logged_steps)

    def log_steps(self, records):
        records = [r for r in records if r["step"] not in self.logged_steps]
        self.logged_steps.update(r["step"] for r in records)
        for s in self.sinks:
            s.log_steps(records)

    def log_summary(self, summary):
        for s in self.sinks:
            s.log_summary(summary)

    def set_tags(self, tags):
        for s in self.sinks:
            s.set_tags(tags)

    def log_system(self, records):
        for s in self.sinks:
            s.log_system(records)

    def flush(self):
        for s in self.sinks:
            s.flush()

    def finish(self, status, error=None):
        for s in self.sinks:
            s.finish(status, error)
