"""A cell's MLflow run, created once its job has started, at the job's own start time.

MLflow cannot move a run's start after creating it, and a run created at submission would start
when the cell was queued (or, locally, when the sweep began), not when its job ran: the UI's
Duration, its timeline and every sort by start time would show bookkeeping. So the launcher writes
the run's template into the cell's directory (parent, name, tags, params, the figures known before
launch) and the run itself is created by whoever first needs it after the job has started: the
launcher (status, sync, the end of a local cell) or the job's rank 0 when it logs, at its end. A
lock in the cell's directory makes that happen once; the run id lands in ``RUN_ID_FILE``.

The job's times are its own records in ``metrics.jsonl``: a ``start`` record written by rank 0 as
each attempt begins (the first is the job's start: a requeued job keeps it) and the ``status``
record written as it ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contract import metrics, records
from contract.mlflow_client import PARAM_MAX_CHARS, PARAMS_PER_BATCH, TURN_WAIT_S

METRICS_FILE = "metrics.jsonl"  # the job's records, written by rank 0 (jobs/sinks.py)
RUN_ID_FILE = "mlflow_run_id"
TEMPLATE_FILE = "mlflow_run.json"
LOCK_FILE = "mlflow_run.lock"


def write_template(cell_dir: Path, experiment_id: str, run_name: str, tags: dict[str, str],
                   params: dict[str, Any], metrics: dict[str, float]) -> None:
    """What the cell's run is created with (the launcher writes it when it creates the parent run)."""
    template = {"experiment_id": experiment_id, "run_name": run_name, "tags": tags,
                "params": {k: str(v)[:PARAM_MAX_CHARS] for k, v in params.items()}, "metrics": metrics}
    records.write_document(Path(cell_dir) / TEMPLATE_FILE, template, indent=None)


def has_template(cell_dir: Path) -> bool:
    return (Path(cell_dir) / TEMPLATE_FILE).exists()


def run_id(cell_dir: Path) -> str | None:
    path = Path(cell_dir) / RUN_ID_FILE
    return (path.read_text().strip() or None) if path.exists() else None


def end_s(records: Iterable[dict[str, Any]]) -> float | None:
    """The job's last end in epoch seconds, from its metrics.jsonl records; None where it left none
    (never started; killed before it could write its end)."""
    ends = [float(rec["time"]) for rec in records if rec.get("kind") == "status" and rec.get("time") is not None]
    return ends[-1] if ends else None


def first_start_s(metrics_file: Path) -> float | None:
    """The job's start from the first line of its records (where a fresh job writes it), without
    reading the rest: a status of a thousand cells reads one line of each."""
    try:
        with Path(metrics_file).open() as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return None
    return float(first["time"]) if first.get("kind") == "start" else None


# What people compare first, in this order. MLflow's compare page orders a run's metrics as they
# were first logged, and its parallel-coordinates chart opens on the first one shared by every
# run: so every logger sends these first (view_order), before the step series and the figures
# known before launch. Which metrics, in which order: contract/metrics.py.
HEADLINE_METRICS = metrics.headlines()


def view_order(key: str) -> int:
    """Sort key (stable sorts keep the steps in order): the headline metrics first, in their order."""
    return HEADLINE_METRICS.index(key) if key in HEADLINE_METRICS else len(HEADLINE_METRICS)


def known_metrics(cell_dir: Path) -> dict[str, float]:
    """The figures the launcher knew before launch (predicted model-state bytes...): logged after the
    job's own, so that they never lead the compare page."""
    found = records.maybe_document(Path(cell_dir) / TEMPLATE_FILE, "the cell's MLflow run template")
    return dict((found or {}).get("metrics") or {})


def open_run(client, cell_dir: Path, start_s: float) -> str | None:
    """The cell's run id: the existing one, or a run created now from the template, starting at
    ``start_s``. None when there is no template (the launcher has not written it yet)."""
    cell_dir = Path(cell_dir)
    with _locked(cell_dir / LOCK_FILE):
        existing = run_id(cell_dir)
        if existing or not has_template(cell_dir):
            return existing
        template = _template(cell_dir)
        run = client.create_run(template["experiment_id"], start_time=int(start_s * 1000), tags=template["tags"],
                                run_name=template["run_name"])
        _log_params(client, run.info.run_id, template)
        records.write_atomic(cell_dir / RUN_ID_FILE, run.info.run_id + "\n")
        return run.info.run_id


def remember_run(cell_dir: Path, run: str) -> str:
    """Record ``run`` as the cell's run (one found in the store: the sweep was synced before) unless
    the cell has one already; returns the cell's run id."""
    cell_dir = Path(cell_dir)
    with _locked(cell_dir / LOCK_FILE):
        existing = run_id(cell_dir)
        if not existing:
            records.write_atomic(cell_dir / RUN_ID_FILE, run + "\n")
        return existing or run


def forget_run(cell_dir: Path) -> None:
    """Drop the cell's run id and template: they name runs of a store the sweep no longer logs to."""
    cell_dir = Path(cell_dir)
    with _locked(cell_dir / LOCK_FILE):
        for name in (RUN_ID_FILE, TEMPLATE_FILE):
            (cell_dir / name).unlink(missing_ok=True)


def _log_params(client, run_id: str, template: dict[str, Any]) -> None:
    from mlflow.entities import Param

    params = [Param(k, v) for k, v in template["params"].items()]
    for i in range(0, len(params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[i : i + PARAMS_PER_BATCH])


def _template(cell_dir: Path) -> dict[str, Any]:
    return records.read_document(cell_dir / TEMPLATE_FILE, "the cell's MLflow run template",
                                 "delete it: launcher.sync writes it again from the sweep document.")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # One creator of the cell's run at a time (the launcher, status, sync, rank 0): a turn around a few
    # MLflow calls, each bounded by its own deadline, so it waits for its holder that long, not forever.
    with records.turn(path, TURN_WAIT_S, f"{path.parent}: the cell's MLflow run"):
        yield
