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
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class NullSink:
    def log_steps(self, records: List[Dict[str, Any]]) -> None: ...

    def log_summary(self, summary: Dict[str, Any]) -> None: ...

    def set_tags(self, tags: Dict[str, str]) -> None: ...

    def finish(self, status: str, error: Optional[str] = None) -> None: ...


class JsonlSink(NullSink):
    """Appends one JSON object per line to ``metrics.jsonl`` (steps, summary, tags, status)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, records: Iterable[Dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            for rec in records:
                f.write(json.dumps({k: _clean(v) for k, v in rec.items()}) + "\n")

    def log_steps(self, records: List[Dict[str, Any]]) -> None:
        self._write({"kind": "step", **r} for r in records)

    def log_summary(self, summary: Dict[str, Any]) -> None:
        self._write([{"kind": "summary", "time": time.time(), **summary}])

    def set_tags(self, tags: Dict[str, str]) -> None:
        self._write([{"kind": "tags", **tags}])

    def finish(self, status: str, error: Optional[str] = None) -> None:
        self._write([{"kind": "status", "status": status, "error": error, "time": time.time()}])


class MlflowSink(NullSink):
    """Logs to an existing run (created by the launcher) through an explicit MlflowClient."""

    # MLflow accepts at most 1000 metrics per log_batch call.
    BATCH = 1000
    RETRIES = 3

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        import os

        # MLflow's HTTP client retries for minutes by default; a benchmark must not stall on a
        # tracking outage (JSONL has everything and `launcher.sync` replays it later).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.run_id = run_id

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

    def _log_metrics(self, points: List[tuple]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now_ms, step) for key, v, step in points if _clean(v) is not None]
        for i in range(0, len(metrics), self.BATCH):
            self._try("log_batch", self.client.log_batch, self.run_id, metrics=metrics[i : i + self.BATCH])

    def log_steps(self, records: List[Dict[str, Any]]) -> None:
        self._log_metrics([(k, v, r["step"]) for r in records for k, v in r.items()
                           if k != "step" and isinstance(v, (int, float))])

    def log_summary(self, summary: Dict[str, Any]) -> None:
        self._log_metrics([(k, v, 0) for k, v in summary.items() if isinstance(v, (int, float))])

    def set_tags(self, tags: Dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self._try("set_tags", self.client.log_batch, self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def finish(self, status: str, error: Optional[str] = None) -> None:
        if error:
            self.set_tags({"error": error})
        self._try("set_terminated", self.client.set_terminated, self.run_id, status)


class FanOut(NullSink):
    def __init__(self, *sinks: NullSink) -> None:
        self.sinks = sinks

    def log_steps(self, records):
        for s in self.sinks:
            s.log_steps(records)

    def log_summary(self, summary):
        for s in self.sinks:
            s.log_summary(summary)

    def set_tags(self, tags):
        for s in self.sinks:
            s.set_tags(tags)

    def finish(self, status, error=None):
        for s in self.sinks:
            s.finish(status, error)
