"""The report's markdown: report.md from rows (launcher/report/collect.py), with the ranking tables
(launcher/report/columns.py), findings, plots, how it was measured and where. This module writes
only: a sweep's report, with the records that span sweeps, is written by its finish
(launcher/finish.py); the command line (``python -m launcher.report``) is launcher/commands/report.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.metrics import (
    COMPILE_TIME_S,
    MEASURED_STEPS,
    THROUGHPUT_SAMPLES_PER_S,
    THROUGHPUT_SAMPLES_PER_S_PER_DEVICE,
)
from launcher.cluster.failures import FIXES
from launcher.report import findings, plots, stats
from launcher.report.collect import TUNING_TAG, ReportError, rows_from_experiment
from launcher.report.columns import NOISY_CV, NOISY_FLAG, cv_text, rate_text, table, write_cells_csv
from launcher.report.rows import cell_label, grouped, md_cell, num

REPORT_FILE = "report.md"
CELLS_FILE = "cells.csv"
PLOTS_DIR = "plots"


@dataclass
class Report:
    path: Path
    plots: list[Path] = field(default_factory=list)
    tables: str = ""
    findings: str = ""
    cells_csv: Path | None = None
    # One plain line per strategy question, verdict first (launcher/report/comparisons.py answers).
    answers: list[str] = field(default_factory=list)

    @property
    def answer_bullets(self) -> str:
        """The answers as markdown bullets, one line each ("" without any)."""
        return "\n".join(f"- {line}" for line in self.answers)
    # MLflow figures of the forecasts checked (launcher/forecast/inputs.py): the parent run's, and
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
    measured = _distinct(rows, MEASURED_STEPS)
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
    compile_s = [v for r in rows if (v := num(r.get(COMPILE_TIME_S))) is not None]
    text = (f"The step ran tuned as the ranks resolved it for their device (docs/configuration.md, *The step's "
            f"tuning*): {words}.")
    if compile_s:
        text += (f" torch.compile took {min(compile_s):.1f}-{max(compile_s):.1f} s per run (`compile_time_s`: the "
                 "warm-up's time above its steady steps), inside the warm-up and outside every figure.")
    scopes = _distinct(rows, "compile.scope")
    if any(scope != "off" for scope in scopes):
        text += (f" Compiled as {'/'.join(scopes)} (jobs/compiling.py: DDP whole with its loss; FSDP by regions, "
                 "each block before sharding).")
    late = [f"{r.get('cell', '?')} ({r['compile.graphs_in_window']})" for r in rows if r.get("compile.graphs_in_window")]
    if late:
        text += (f" **Graphs compiled inside the measured window** (a recompile: those steps held compilation, "
                 f"and their times are not steady): {', '.join(late)}.")
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
    bad = [r for r in rows if r.get("status") != "done" or num(r.get(THROUGHPUT_SAMPLES_PER_S)) is None]
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
    plots (a sweep's fabric, launcher/forecast/fabric.py, and its forecasts checked,
    launcher/forecast/inputs.py); ``looks``: a runs=auto sweep's looks."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(out_dir / REPORT_FILE, tables=_tables(rows, floor),
                    findings=findings.findings(rows, floor=floor, looks=looks),
                    cells_csv=write_cells_csv(rows, out_dir / CELLS_FILE),
                    answers=findings.answers(rows, floor=floor, looks=looks))
    done = [r for r in rows if num(r.get(THROUGHPUT_SAMPLES_PER_S)) is not None]
    answer = ["## The answer", "", report.answer_bullets, ""] if report.answers else []
    parts = [*_summary_section(rows, title), *answer, "## Findings", "", report.findings, "",
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
    units = [u for u in grouped(rows) if num(u.get(THROUGHPUT_SAMPLES_PER_S)) is not None]
    for (model, ws) in sorted({(str(r.get("model")), r.get("world_size") or 0) for r in units}):
        peers = [r for r in units if str(r.get("model")) == model and (r.get("world_size") or 0) == ws]
        best = max(peers, key=lambda r: r[THROUGHPUT_SAMPLES_PER_S])
        parts += [f"Best at {ws} rank(s){f' ({model})' if multi_model else ''}: **{md_cell(best['cell'])}** at "
                  f"{rate_text(best[THROUGHPUT_SAMPLES_PER_S])} samples/s "
                  f"({rate_text(best.get(THROUGHPUT_SAMPLES_PER_S_PER_DEVICE))} per device).", ""]
    noisy = [r for r in done if cv_text(r).endswith(NOISY_FLAG)]
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


def write_experiment_report(tracking_uri: str, experiment: str, out_dir: Path) -> Report:
    rows = rows_from_experiment(tracking_uri, experiment)
    if not rows:
        raise ReportError(f"experiment {experiment!r} at {tracking_uri} holds no cell runs. Fix: run a sweep "
                          f"with tracking.experiment={experiment}, or pass the experiment the sweeps logged to.")
    return write(rows, out_dir, f"Benchmark report: experiment {experiment}",
                 {"MLflow": tracking_uri, "experiment": experiment})
