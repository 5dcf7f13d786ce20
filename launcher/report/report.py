"""The measurement report: a ranking table, plots, how it was measured and where.

Two sources feed one code path. A sweep directory (sweep.json + each cell's result.json) gives
the rows of one sweep; an MLflow experiment (the child runs of every sweep logged to it) gives
rows from many sweeps, so runs made on different days can be compared. Either way the rows are
plain dicts with the same keys, and :func:`write` turns them into ``report.md`` + PNG plots.

This module reads and writes only: a sweep's finish (which calls :func:`write_sweep_report`) is
launcher/finish.py, and the command line (``python -m launcher.report``) is launcher/report/__main__.py.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import metrics, mlflow_client
from launcher.cluster.backends import backend_for
from launcher.cluster.base import REPRODUCE_FILE
from launcher.cluster.failures import FIXES
from launcher.report import fabric, findings, forecasts, health, noisefloor, plots, sequential, stats
from launcher.report.rows import (
    GIB,
    MIB,
    WHERE_KEYS,
    add_derived,
    cell_label,
    grouped,
    md_cell,
    num,
    ranked,
)
from launcher.state import FROM_MLFLOW, StateError, SweepState
from launcher.track import tracking

REPORT_FILE = "report.md"
CELLS_FILE = "cells.csv"
PLOTS_DIR = "plots"
# Above this coefficient of variation over repeated windows a cell's throughput is flagged as
# noisy: its difference to a neighbour in the ranking may be noise.
NOISY_CV = 0.03
NOISY_FLAG = "⚠"

# Settings that say where and how a sweep was run, not what was measured: two runs that differ
# only in these (and in the node count) belong to one scaling series.
_NOT_MEASURED = ("nodes", *WHERE_KEYS)
_ENV_TAGS = ("hostnames", "torch_version", "device_name", "backend", "num_threads", "precision_mode", "gpu_uuids",
             "cuda_version", "nccl_version", "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32",
             "slowest_rank", "straggler_rank")
TUNING_TAG = "tuning."  # the step's tuning settings as the ranks resolved them (contract/tuning.py)


class ReportError(Exception):
    """A report that cannot be made, with the fix in its message."""


# ---- rows from a sweep directory ---------------------------------------------------------------

def looks_of(state: SweepState) -> stats.Looks:
    """The sweep's planned looks: runs=auto's schedule, or one look at the end (fixed runs)."""
    design = state.design
    if design is None:
        return stats.Looks.fixed()
    ended = f"stopped early: {design.stopped}" if design.stopped and design.stopped.startswith("budget") else None
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
        row.update({k: v for k, v in tags.items() if k in _ENV_TAGS or k.startswith(TUNING_TAG)})
        row.update(result.get("summary", {}))
        if cell.predicted_state_bytes is not None:
            row["predicted_model_state_bytes"] = cell.predicted_state_bytes
        if cell.predicted_activation_bytes is not None:
            row["predicted_activation_bytes"] = cell.predicted_activation_bytes
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
        row.update({k: v for k, v in tags.items() if k in _ENV_TAGS or k.startswith(TUNING_TAG)})
        # Per-step series (loss, step_time_ms) are logged under their own names; every summary
        # figure is a single value at step 0, so the latest value is the summary.
        row.update({k: v for k, v in run.data.metrics.items() if k not in ("loss", "step_time_ms")})
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

def _rate(value: Any) -> str:
    v = num(value)
    if v is None:
        return "-"
    return format(v, ",.0f") if v >= 1000 else format(v, ".1f")


def _fixed(spec: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = num(value)
        return "-" if v is None else format(v, spec)

    return fmt


def _cv(row: dict[str, Any]) -> str:
    v = num(row.get("throughput_cv"))
    if v is None or (row.get("repeats") or 0) < 2:
        return "-"  # one measured window has no spread to report
    return f"{v:.1%} {NOISY_FLAG}" if v > NOISY_CV else f"{v:.1%}"


@dataclass
class Column:
    title: str
    value: Callable[[dict[str, Any]], Any]
    fmt: Callable[[Any], str] = str
    numeric: bool = True
    # Shown only when some row has a value (tokens for language models, MFU on known GPUs).
    optional: bool = False


def _state_column(metric: metrics.Metric, rows: Sequence[dict[str, Any]]) -> Column:
    """Bytes in GiB where the largest value reaches one, else in MiB: one unit per table."""
    largest = max((num(r.get(metric.name)) or 0 for r in rows), default=0)
    unit, div, spec = ("GiB", GIB, ".2f") if largest >= GIB else ("MiB", MIB, ".1f")

    def value(r: dict[str, Any]) -> float | None:
        b = num(r.get(metric.name))
        return None if b is None else b / div

    return Column(str(metric.label).format(unit=unit), value, _fixed(spec))


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def _metric_column(metric: metrics.Metric, rows: Sequence[dict[str, Any]]) -> Column:
    """A registered metric's column: its label, its value (or its stand-in's), its format."""
    if metric.fmt == "bytes":
        return _state_column(metric, rows)
    fmt = {"rate": _rate, "count": _count}.get(metric.fmt) or _fixed(metric.fmt)
    return Column(str(metric.label), metric.read, fmt, optional=metric.optional)


def _status(row: dict) -> str:
    """``done``, or ``co-located: <what else it measured>`` (launcher/cluster/colocation.py)."""
    if row.get("interference"):
        return f"co-located: {row['interference']}"
    return str(row.get("status"))


def columns(rows: Sequence[dict[str, Any]], floor: stats.Floor | None = None) -> list[Column]:
    multi_sweep = len({r.get("sweep") for r in rows}) > 1
    cols = [
        Column("#", lambda r: r.get("_rank"), lambda v: "-" if v is None else str(v)),
        Column("cell", lambda r: r["cell"], numeric=False),
    ]
    if multi_sweep:
        cols.append(Column("sweep", lambda r: r.get("sweep"), numeric=False))
    cols += [_metric_column(m, rows) for m in metrics.columns()]
    # The noise columns read several fields each (the window CV its window count; the interval the
    # runs and the noise floor), so they are the report's own, after the registered figures.
    cols += [
        Column("window CV", lambda r: r, _cv),
        Column("±95% CI", lambda r: r, lambda r: stats.ci_text(r, floor)),
        Column("status", _status, numeric=False),
    ]
    return [c for c in cols if not c.optional or any(num(c.value(r)) is not None for r in rows)]



def table(rows: list[dict[str, Any]], floor: stats.Floor | None = None) -> str:
    """Markdown ranking table: per world size (fewest ranks first), best throughput first; cells
    without results last. Runs of one configuration (and seeds) are one row (mean and spread)."""
    rows = grouped(rows)
    cols = columns(rows, floor)
    lines = ["| " + " | ".join(c.title for c in cols) + " |",
             "|" + "|".join("---:" if c.numeric else "---" for c in cols) + "|"]
    for r in ranked(rows):
        lines.append("| " + " | ".join(md_cell(c.fmt(c.value(r))) for c in cols) + " |")
    return "\n".join(lines)


# ---- report.md ---------------------------------------------------------------------------------

@dataclass
class Report:
    path: Path
    plots: list[Path] = field(default_factory=list)
    tables: str = ""
    findings: str = ""
    cells_csv: Path | None = None
    # MLflow figures of the forecasts checked (launcher/report/forecasts.py): the parent run's, and
    # per cell run id.
    figures: dict[str, float] = field(default_factory=dict)
    cell_figures: dict[str, dict[str, float]] = field(default_factory=dict)


def _distinct(rows: Sequence[dict[str, Any]], key: str, split: bool = False) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r.get(key) is None:
            continue
        for v in (str(r[key]).split(",") if split else [str(r[key])]):
            if v.strip() and v.strip() not in seen:
                seen.append(v.strip())
    return seen


def _uniform(rows: Sequence[dict[str, Any]], key: str) -> str:
    values = _distinct(rows, key)
    return values[0] if len(values) == 1 else ("/".join(values) if values else "?")


def _how_measured(rows: Sequence[dict[str, Any]]) -> str:
    runs = "/".join(sorted({str(len(u.get("_members", [u]))) for u in grouped(list(rows))}, key=int)) or "?"
    steps, warm = _uniform(rows, "steps"), _uniform(rows, "warmup_steps")
    measured = _distinct(rows, "measured_steps")
    repeats, batch = _uniform(rows, "repeats"), _uniform(rows, "batch_size")
    return "\n".join([
        f"Each cell ran {steps} optimizer steps on every rank, {batch} samples per device per step. The first "
        f"{warm} steps are warm-up and excluded from every figure; the remaining "
        f"{'/'.join(str(int(float(m))) for m in measured) or '?'} steps are measured in {repeats} window(s), "
        "which all ranks start together (one barrier). Losses are read once after the window, never per step.",
        "",
        "Reductions over ranks: **throughput is summed** (each rank's samples over its own measured time), "
        "per-device throughput is that sum over the number of ranks, and tokens/s is samples/s times the sequence "
        "length. **Step time is the maximum over ranks**, step by step (a synchronous step ends when its slowest "
        "rank does); p50/p90 are percentiles over the measured steps. **Peak memory is the maximum over ranks** of "
        "the peak resident set (CPU) or peak allocated CUDA memory during the measured window; model state is the "
        "bytes one rank holds in parameters, gradients and optimizer state (a sharded tensor counts its local "
        "shard), maximum over ranks.",
        "",
        "Rel perf is total throughput over the best cell's of the same model and world size. Scaling eff is per-device throughput "
        "over that of the smallest cell of the same series (same settings except the node count; 100% = linear "
        "scaling). Comm share is the share of step time spent in communication as the worker measured it "
        f"(`comm_share`; '-' where not measured). Window CV is the coefficient of variation of throughput over "
        f"the measured windows of one run ('-' for a single window); {NOISY_FLAG} marks cells above {NOISY_CV:.0%}. "
        "Windows share their run's processes and neighbours, so they describe a run's steadiness, never the noise "
        "of a claim.",
        "",
        _tuning_text(rows),
        "",
        f"**Runs are the unit of noise.** Each configuration ran {runs} time(s) as independent launches "
        "(separate processes; separate array tasks on Slurm), interleaved over the sweep. Its row shows the mean "
        "over the runs that have a result (runs, run spread = the coefficient of variation between them). ±95% CI "
        "is the half-width of the 95% interval of that mean, as a share of it: standard error stdev / √runs, "
        "Student's t with runs − 1 degrees of freedom; a configuration that ran once uses this cluster's noise "
        "floor (see Environment) or has none ('-'). Failed, cancelled and diverged runs count in no figure.",
    ])


def _tuning_text(rows: Sequence[dict[str, Any]]) -> str:
    """The step's tuning settings as the ranks resolved them (each setting's values over the cells), and
    torch.compile's time, which the warm-up absorbed."""
    keys = sorted({k for r in rows for k in r if k.startswith(TUNING_TAG)})
    if not keys:
        return "The step's tuning settings were not recorded (runs from before they were)."
    words = ", ".join(f"{k.removeprefix(TUNING_TAG)} {'/'.join(_distinct(rows, k))}" for k in keys)
    compile_s = [v for r in rows if (v := num(r.get("compile_time_s"))) is not None]
    text = (f"The step ran tuned as the ranks resolved it for their device (docs/configuration.md, *The step's "
            f"tuning*): {words}.")
    if compile_s:
        text += (f" torch.compile took {min(compile_s):.1f}-{max(compile_s):.1f} s per run (`compile_time_s`: the "
                 "warm-up's time above its steady steps), inside the warm-up and outside every figure.")
    return text


def _environment(rows: Sequence[dict[str, Any]], extra: dict[str, str]) -> str:
    lines = ["| | |", "|---|---|"]
    for title, key, split in (("hosts", "hostnames", True), ("device", "device_name", False),
                              ("GPU UUIDs", "gpu_uuids", True), ("torch", "torch_version", False),
                              ("CUDA", "cuda_version", False), ("NCCL", "nccl_version", False),
                              ("backend", "backend", False), ("precision mode", "precision_mode", False),
                              ("fp32 matmul precision", "float32_matmul_precision", False),
                              ("TF32 matmul", "cuda_matmul_allow_tf32", False), ("TF32 cuDNN", "cudnn_allow_tf32", False),
                              ("threads per rank", "num_threads", False)):
        values = _distinct(rows, key, split)
        lines.append(f"| {title} | {md_cell(', '.join(values) or '-')} |")
    for title, value in extra.items():
        lines.append(f"| {title} | {md_cell(value)} |")
    return "\n".join(lines)


def _failures(rows: Sequence[dict[str, Any]]) -> str:
    bad = [r for r in rows if r.get("status") != "done" or num(r.get("throughput_samples_per_s")) is None]
    if not bad:
        return "All cells finished with results."
    lines = ["| cell | status | class | error | fix |", "|---|---|---|---|---|"]
    multi_sweep = len({r.get("sweep") for r in rows}) > 1
    for r in bad:
        error = r.get("error") or ("no result" if r.get("status") == "done" else "-")
        cls = r.get("failure_class")
        lines.append(f"| {md_cell(cell_label(r, multi_sweep))} | {md_cell(r.get('status'))} | {md_cell(cls or '-')} | "
                     f"{md_cell(error)} | {md_cell(FIXES.get(cls, '-') if cls else '-')} |")
    return "\n".join(lines)


def _tables(rows: list[dict[str, Any]], floor: stats.Floor | None = None) -> str:
    """One table per model: samples/s of different models do not compare."""
    models = _distinct(rows, "model")
    if len(models) <= 1:
        return table(rows, floor)
    return "\n\n".join(f"### {m}\n\n{table([r for r in rows if str(r.get('model')) == m], floor)}"
                       for m in models)


def write(rows: list[dict[str, Any]], out_dir: Path, title: str, source: dict[str, str],
          floor: stats.Floor | None = None, sections: Sequence[str] = (), looks: stats.Looks | None = None) -> Report:
    """Write ``report.md`` and its plots (``plots/*.png``) into ``out_dir``; ``floor``: the cluster's
    noise floor, the noise of configurations that ran once; ``sections``: markdown lines after the
    plots (a sweep's fabric, launcher/report/fabric.py, and its forecasts checked,
    launcher/report/forecasts.py); ``looks``: a runs=auto sweep's looks."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(out_dir / REPORT_FILE, tables=_tables(rows, floor),
                    findings=findings.findings(rows, floor=floor, looks=looks),
                    cells_csv=write_cells_csv(rows, out_dir / CELLS_FILE))
    done = [r for r in rows if num(r.get("throughput_samples_per_s")) is not None]
    parts = [*_summary_section(rows, title), "## Findings", "", report.findings, "",
             *_results_section(rows, done, report.tables), *_plots_section(rows, bool(done), out_dir, report),
             *sections, "## How measured", "", _how_measured(rows), "",
             "## Environment", "", _environment(rows, source), "",
             "## Cells without results", "", _failures(rows), ""]
    report.path.write_text("\n".join(parts))
    return report


def _summary_section(rows: list[dict[str, Any]], title: str) -> list[str]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    models = ", ".join(_distinct(rows, "model")) or "-"
    return [f"# {title}", "",
            f"{len(rows)} cell(s) ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); model {models}; "
            f"{len({r.get('sweep') for r in rows})} sweep(s).", ""]


def _results_section(rows: list[dict[str, Any]], done: list[dict[str, Any]], tables: str) -> list[str]:
    """The ranking tables, the best cell of each model and world size, and a word on noisy windows
    (``done``: the rows with a measured throughput)."""
    parts = ["## Results", "",
             "Cells ranked by total throughput (higher is better) among cells of the same model and world size "
             "(# restarts at 1 for each). Rel perf and scaling eff are defined under *How measured*; the full "
             f"per-cell table is [{CELLS_FILE}]({CELLS_FILE}).", "", tables, ""]
    if not done:
        return parts
    multi_model = len(_distinct(done, "model")) > 1
    units = [u for u in grouped(rows) if num(u.get("throughput_samples_per_s")) is not None]
    for (model, ws) in sorted({(str(r.get("model")), r.get("world_size") or 0) for r in units}):
        peers = [r for r in units if str(r.get("model")) == model and (r.get("world_size") or 0) == ws]
        best = max(peers, key=lambda r: r["throughput_samples_per_s"])
        parts += [f"Best at {ws} rank(s){f' ({model})' if multi_model else ''}: **{md_cell(best['cell'])}** at "
                  f"{_rate(best['throughput_samples_per_s'])} samples/s "
                  f"({_rate(best.get('throughput_samples_per_s_per_device'))} per device).", ""]
    noisy = [r for r in done if _cv(r).endswith(NOISY_FLAG)]
    if noisy:
        parts.append(f"{NOISY_FLAG} {len(noisy)} cell(s) varied by more than {NOISY_CV:.0%} between the measured "
                     "windows of one run: a noisy neighbour or an unsteady state; the claims rest on the spread "
                     "between runs, not on these windows.")
    return [*parts, ""]


def _plots_section(rows: list[dict[str, Any]], measured: bool, out_dir: Path, report: Report) -> list[str]:
    """The plots, made into out_dir/plots and listed on ``report``; a plotting problem is said, never
    raised: it must not cost the measured table."""
    parts = ["## Plots", ""]
    try:
        made = plots.make_all(rows, out_dir / PLOTS_DIR)
    except Exception as exc:
        print(f"report: plots failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return [*parts, f"Plots failed: {md_cell(type(exc).__name__)}: {md_cell(exc)}", ""]
    for path, caption in made:
        report.plots.append(path)
        parts += [f"![{path.stem}]({PLOTS_DIR}/{path.name})", "", f"*{caption}*", ""]
    if not made and measured:
        parts += ["No plots.", ""]
    return parts


# Leading columns of cells.csv: who the cell is, the registry's leading figures, what went wrong;
# every other key any row has follows, sorted.
_CSV_WHO = ("cell", "sweep", "model", "strategy", "precision", "nodes", "world_size", "status", "failure_class")
_CSV_LAST_OF_LEAD = ("interference", "error", "run_id")
# Settings read beside a figure: the window count beside the window CV computed over it.
_CSV_BESIDE = {"throughput_cv": ("repeats",)}


def _csv_lead() -> tuple[str, ...]:
    figures = [k for name in metrics.csv_lead() for k in (name, *_CSV_BESIDE.get(name, ()))]
    return (*_CSV_WHO, *figures, *_CSV_LAST_OF_LEAD)


_CSV_FIRST = _csv_lead()


def write_cells_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Every cell, one line each, every figure it has (the markdown table groups and rounds)."""
    keys = {k for r in rows for k in r if not k.startswith("_") and k not in ("settings", "series")}
    header = [k for k in _CSV_FIRST if k in keys] + sorted(keys - set(_CSV_FIRST))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        for r in ranked(rows):
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in header})
    return path


def write_sweep_report(state: SweepState) -> Report:
    """The sweep's report; its repeated runs refresh the cluster's noise floor, which in turn is the
    noise of any configuration here that ran once."""
    rows = collect(state)
    source = {"cluster": state.cluster, "command": " ".join(state.argv), "sweep dir": state.sweep_dir}
    if state.tracking_uri:
        source.update({"MLflow": state.tracking_uri, "parent run": state.parent_run_id or "-"})
    key = floor_key(state)
    if all(c.status.terminal for c in state.cells):
        noisefloor.record(state.path.parent, key, rows, state.name)
    floor = noisefloor.load(state.path.parent, key)
    source["noise floor"] = (f"{floor.where} ({noisefloor.FLOOR_FILE} beside the sweep directory)" if floor
                             else "none measured on this cluster yet")
    probed = fabric.read_sweep(state.path)
    for one in probed:  # a Slurm sweep's probe ended after the launcher returned: kept here
        fabric.keep(state.path.parent, one, state.name)
    checked = _forecasts_checked(state, rows, key)
    written = write(rows, state.path, f"Benchmark report: {state.name}", source, floor,
                    [*health.section(state.path), *fabric.section(probed), *checked.section], looks_of(state))
    written.figures, written.cell_figures = checked.figures, checked.cell_figures
    written.plots += health.sweep_plots(state.path)  # attached with the others to the parent run
    return written


def _forecasts_checked(state: SweepState, rows: list[dict[str, Any]], key: str) -> forecasts.SweepCheck:
    """The forecasts checked (kept in the cluster's record once every cell has ended); a problem is
    said in the section, never raised: it must not cost the measured report."""
    try:
        return forecasts.check(state, rows, key, keep=all(c.status.terminal for c in state.cells))
    except Exception as exc:
        print(f"report: forecasts not checked: {type(exc).__name__}: {exc}", file=sys.stderr)
        return forecasts.SweepCheck(["## Forecasts checked", "", f"Not checked: {md_cell(type(exc).__name__)}: "
                                     f"{md_cell(exc)}", ""], {}, {})


def floor_key(state: SweepState) -> str:
    first = state.cells[0].cluster if state.cells else None
    return backend_for(state.cluster).noise_floor_key(getattr(first, "partition", None), getattr(first, "gpu_type", None))


def written_report(state: SweepState) -> Report:
    """The sweep's report as it was written, to close a parent run with it unchanged: it was written
    where the sweep ran (a synced sweep's noise floor and host are that machine's, not this one's).
    Written now only where it is gone."""
    out_dir = state.path
    if not (out_dir / REPORT_FILE).exists():
        return write_sweep_report(state)
    text = (out_dir / REPORT_FILE).read_text()
    cells_csv = out_dir / CELLS_FILE
    return Report(out_dir / REPORT_FILE, plots=sorted((out_dir / PLOTS_DIR).glob("*.png")),
                  tables=_section(text, "Results"), findings=_section(text, "Findings"),
                  cells_csv=cells_csv if cells_csv.exists() else None)


def _section(markdown: str, heading: str) -> str:
    """The text under ``## heading``, up to the next heading of that level."""
    lines = markdown.splitlines()
    if f"## {heading}" not in lines:
        return ""
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end]).strip()


def write_experiment_report(tracking_uri: str, experiment: str, out_dir: Path) -> Report:
    rows = rows_from_experiment(tracking_uri, experiment)
    if not rows:
        raise ReportError(f"experiment {experiment!r} at {tracking_uri} holds no cell runs. Fix: run a sweep "
                          f"with tracking.experiment={experiment}, or pass the experiment the sweeps logged to.")
    return write(rows, out_dir, f"Benchmark report: experiment {experiment}",
                 {"MLflow": tracking_uri, "experiment": experiment})
