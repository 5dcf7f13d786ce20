"""The report's rows, collected in one place from either source: a sweep directory (sweep.json and
each cell's result.json) gives the rows of one sweep; an MLflow experiment (the child runs of every
sweep logged to it) gives rows from many sweeps, so runs made on different days can be compared.
Either way the rows are plain dicts with the same keys (launcher/report/rows.py derives the rest)."""

from __future__ import annotations

import json
from typing import Any

from contract import metrics, mlflow_client
from contract.metrics import PREDICTED_ACTIVATION_BYTES, PREDICTED_MODEL_STATE_BYTES
from launcher.report import sequential, stats
from launcher.report.rows import WHERE_KEYS, add_derived
from launcher.state import FROM_MLFLOW, REPRODUCE_FILE, StateError, SweepState
from launcher.track import tracking

# Settings that say where and how a sweep was run, not what was measured: two runs that differ
# only in these (and in the node count) belong to one scaling series.
_NOT_MEASURED = ("nodes", *WHERE_KEYS)
_ENV_TAGS = ("hostnames", "torch_version", "device_name", "backend", "num_threads", "precision_mode", "gpu_uuids",
             "cuda_version", "nccl_version", "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32",
             "slowest_rank", "straggler_rank", "straggler_withheld")
TUNING_TAG = "tuning."  # the step's tuning settings as the ranks resolved them (contract/tuning.py)
COMPILE_TAG = "compile."  # what torch.compile compiled, and graphs made inside the window (jobs/compiling.py)


class ReportError(Exception):
    """A report that cannot be made, with the fix in its message."""


# ---- rows from a sweep directory ---------------------------------------------------------------

def looks_of(state: SweepState) -> stats.Looks:
    """The sweep's planned looks: runs=auto's schedule, or one look at the end (fixed runs)."""
    design = state.design
    if design is None:
        return stats.Looks.fixed()
    # A sweep that adds no further round leaves no comparison "open": each says why it stopped.
    ended = (None if not design.stopped else f"stopped early: {design.stopped}" if design.stopped.startswith("budget")
             else f"no further round: {design.stopped}")
    return stats.Looks(sequential.schedule(design.runs_min, design.runs_max), ended=ended, done=len(design.rounds))


def collect(state: SweepState) -> list[dict[str, Any]]:
    """One row per cell: its state plus the summary and tags its head rank wrote (result.json); in a
    runs=auto sweep each row's ``round`` is the first look that saw it."""
    rows = []
    looks = looks_of(state)
    for cell in state.cells:
        result = state.read_result(cell)
        # Cells that differ only in their node count form one scaling series.
        series = " ".join(o for o in cell.overrides if o.split("=", 1)[0].lstrip("+~") != "nodes")
        row: dict[str, Any] = {"cell": cell.name, "sweep": state.name, "strategy": cell.strategy,
                               "precision": cell.precision, "model": cell.model, "nodes": cell.nodes,
                               "world_size": cell.world_size, "status": cell.status.value, "error": cell.error,
                               "failure_class": cell.failure_class, "series": series, "run_id": cell.run_id,
                               "settings": dict(o.split("=", 1) for o in cell.overrides if "=" in o),
                               "round": looks.round_of(cell.run)}
        row.update(_train_settings(state, cell))
        tags = result.get("tags", {})
        row.update({k: v for k, v in tags.items() if k in _ENV_TAGS or k.startswith((TUNING_TAG, COMPILE_TAG))})
        row.update(result.get("summary", {}))
        if cell.predicted_state_bytes is not None:
            row[PREDICTED_MODEL_STATE_BYTES] = cell.predicted_state_bytes
        if cell.predicted_activation_bytes is not None:
            row[PREDICTED_ACTIVATION_BYTES] = cell.predicted_activation_bytes
        row.update({metrics.predicted_comm_bytes(k): v for k, v in cell.predicted_comm_bytes.items()})
        if (state.cell_dir(cell) / REPRODUCE_FILE).exists():  # its ranks again by hand (python -m jobs)
            row["reproduce"] = str((state.cell_dir(cell) / REPRODUCE_FILE).relative_to(state.path))
        if cell.interference:  # launcher/cluster/colocation.py: the cell measured something else too
            row["interference"] = cell.interference
        rows.append(row)
    add_derived(rows)
    return rows


def _train_settings(state: SweepState, cell) -> dict[str, Any]:
    try:
        train = state.load_spec(cell).train
    except (OSError, ValueError, TypeError, StateError):  # a sweep dir copied without its specs: the
        return {}  # report still reads its results; only the run lengths are unknown
    return {"batch_size": train.batch_size, "steps": train.steps, "warmup_steps": train.warmup_steps,
            "repeats": train.repeats}


# ---- rows from an MLflow experiment ------------------------------------------------------------

def _reading_client(tracking_uri: str):
    """A client for a store that exists: a lookup never leaves an empty SQLite store behind."""
    path = tracking.sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise ReportError(f"no MLflow store at {tracking_uri} (no such file). Fix: pass --tracking-uri of the store "
                          f"the sweeps logged to, or a sweep directory.")
    return mlflow_client.client(tracking_uri)


def rows_from_experiment(tracking_uri: str, experiment: str) -> list[dict[str, Any]]:
    """One row per cell run (child run with a ``cell`` tag) of every sweep in the experiment."""
    client = _reading_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise ReportError(f"no MLflow experiment named {experiment!r} at {tracking_uri} (experiments there: "
                          f"{names}). Fix: pass --experiment with one of those, or --tracking-uri of the store "
                          f"the sweeps logged to.")
    return _rows_from_runs(_search(client, found.experiment_id, None), found.experiment_id)


def rows_from_parent_run(tracking_uri: str, run_id: str) -> list[dict[str, Any]]:
    """One row per cell run of one sweep, named by its MLflow parent run."""
    client = _reading_client(tracking_uri)
    try:
        parent = client.get_run(run_id)
    except Exception as exc:
        raise ReportError(f"no MLflow run {run_id!r} at {tracking_uri} ({type(exc).__name__}). Fix: pass a sweep's "
                          f"parent run id (tag mlflow.parentRunId of its cells) and the --tracking-uri it logged to."
                          ) from exc
    exp = parent.info.experiment_id
    runs = [parent] + _search(client, exp, f"tags.mlflow.parentRunId = '{run_id}'")
    return _rows_from_runs(runs, exp)


def _search(client, experiment_id: str, filter_string: str | None) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string or "", max_results=1000,
                                  page_token=token, order_by=["attributes.start_time ASC"])
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _rows_from_runs(runs: list, experiment_id: str) -> list[dict[str, Any]]:
    sweeps = {r.info.run_id: r.data.tags.get("sweep") or r.info.run_name for r in runs
              if "mlflow.parentRunId" not in r.data.tags}
    rows = []
    for run in runs:
        tags, params = run.data.tags, run.data.params
        if "mlflow.parentRunId" not in tags or "cell" not in tags:
            continue  # a sweep's parent run, or a run this tool did not make
        series = json.dumps({k: v for k, v in sorted(params.items())
                             if k not in _NOT_MEASURED and not k.startswith("tracking.")})
        row: dict[str, Any] = {"cell": tags["cell"], "sweep": sweeps.get(tags["mlflow.parentRunId"], "?"),
                               "strategy": tags.get("strategy", "?"), "precision": tags.get("precision", "?"),
                               "model": tags.get("model", "?"), "nodes": _int(tags.get("nodes")),
                               "world_size": _int(tags.get("world_size")),
                               "status": FROM_MLFLOW[run.info.status].value if run.info.status in FROM_MLFLOW
                               else run.info.status.lower(),
                               "error": tags.get("error"), "failure_class": tags.get("failure_class"),
                               "series": series, "run_id": run.info.run_id, "experiment_id": experiment_id,
                               "settings": dict(params)}
        if tags.get("interference"):
            row["interference"] = tags["interference"]
        row.update({k: _int(params.get(k)) for k in ("batch_size", "steps", "warmup_steps", "repeats")
                    if params.get(k) is not None})
        row.update({k: v for k, v in tags.items() if k in _ENV_TAGS or k.startswith((TUNING_TAG, COMPILE_TAG))})
        # Per-step series (loss, step_time_ms) are logged under their own names; every summary
        # figure is a single value at step 0, so the latest value is the summary.
        row.update({k: v for k, v in run.data.metrics.items() if k not in {s.name for s in metrics.STEP_SERIES}})
        if run.data.metrics.get("world_size"):
            row["world_size"] = int(run.data.metrics["world_size"])
        rows.append(row)
    add_derived(rows)
    return rows


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


# ---- the ranking table -------------------------------------------------------------------------
