"""The report's PNG plots: throughput by cell, memory by cell, scaling over node counts, and each
cell's step by part (its anatomy, jobs/anatomy.py).

matplotlib is imported inside the functions, never at module level: the launcher starts without
it and only a report pays for it. Figures are built with ``matplotlib.figure.Figure`` and saved
through the Agg canvas, without pyplot: no global figure state, no GUI backend on a login node.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contract import metrics
from contract.metrics import (
    ANATOMY_UNATTRIBUTED_MS,
    MODEL_STATE_BYTES,
    RELATIVE_PERF,
    SCALING_EFFICIENCY,
    STEP_TIME_MS_P50,
    THROUGHPUT_SAMPLES_PER_S,
    THROUGHPUT_SAMPLES_PER_S_PER_DEVICE,
)
from launcher.report.explain import part_label
from launcher.report.rows import GIB, MIB, cell_label, grouped, peak_memory_gib, ranked, series_labels

DPI = 110
# Readable at any sweep size: cells repeated over seeds are one bar (their mean), at most MAX_BARS
# bars (the best of each world size first) and MAX_SERIES scaling lines; cells.csv has them all.
MAX_BARS = 40
MAX_SERIES = 12
MAX_LABEL_CHARS = 60


def _figure(width_in: float, height_in: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One colour per strategy, stable within a report."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    strategies: list[str] = []
    for r in rows:
        if str(r.get("strategy")) not in strategies:
            strategies.append(str(r.get("strategy")))
    return {s: cmap(i % 10) for i, s in enumerate(strategies)}


def _measured(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ranked(grouped(rows)) if r.get(THROUGHPUT_SAMPLES_PER_S)]


def _capped(measured: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """At most MAX_BARS rows, the best relative performance first (so every world size keeps its
    best cells), in table order; and a note for the title when some were left out."""
    if len(measured) <= MAX_BARS:
        return measured, ""
    keep = {id(r) for r in sorted(measured, key=lambda r: -(r.get(RELATIVE_PERF) or 0))[:MAX_BARS]}
    return [r for r in measured if id(r) in keep], f" (best {MAX_BARS} of {len(measured)}; all in cells.csv)"


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 1] + "…"


def _barh(ax, labels: list[str], values: list[float | None], colors: list[Any], fmt: str, xlabel: str) -> None:
    ys = list(range(len(labels)))
    shown = [v or 0.0 for v in values]
    ax.barh(ys, shown, color=colors)
    ax.set_yticks(ys, labels)
    if not ax.yaxis_inverted():  # shared y axes: invert once, or the second call undoes the first
        ax.invert_yaxis()  # best (first) on top, like the table
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    top = max(shown, default=0) or 1.0
    ax.set_xlim(0, top * 1.18)  # room for the value labels
    for y, v in zip(ys, values, strict=True):
        ax.text((v or 0.0) + top * 0.01, y, "-" if v is None else format(v, fmt), va="center", fontsize=8)


def _two_panels(rows: Sequence[dict[str, Any]], measured: list[dict[str, Any]], title: str,
                panels: list[tuple[str, list[float | None], str, str]], path: Path) -> Path:
    """One figure of two bar panels over the same cells (ranked as in the table, one colour per
    strategy): each panel is (title, values, number format, axis label)."""
    multi = len({r.get("sweep") for r in rows}) > 1
    labels = [_short(cell_label(r, multi)) for r in measured]
    colors = _colors(rows)
    bar_colors = [colors[str(r.get("strategy"))] for r in measured]
    fig = _figure(11, 1.4 + 0.42 * len(measured))
    for ax, (panel_title, values, fmt, xlabel) in zip(fig.subplots(1, 2, sharey=True), panels, strict=True):
        _barh(ax, labels, values, bar_colors, fmt, xlabel)
        ax.set_title(panel_title)
    fig.suptitle(title)
    fig.savefig(path)
    return path


def throughput(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Total and per-device throughput per cell, ranked as in the table."""
    measured, note = _capped(_measured(rows))
    if not measured:
        return None
    return _two_panels(rows, measured, f"Throughput by cell (measured steps only){note}", [
        ("Total throughput", [r[THROUGHPUT_SAMPLES_PER_S] for r in measured], ",.1f", "samples/s (all ranks)"),
        ("Per-device throughput", [r.get(THROUGHPUT_SAMPLES_PER_S_PER_DEVICE) for r in measured], ",.1f",
         "samples/s per device"),
    ], path)


def memory(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Peak memory and model-state bytes per rank (both the maximum over ranks), per cell."""
    measured, note = _capped([r for r in _measured(rows)
                              if peak_memory_gib(r) is not None or r.get(MODEL_STATE_BYTES)])
    if not measured:
        return None
    largest = max((r.get(MODEL_STATE_BYTES) or 0 for r in measured), default=0)
    unit, div = ("GiB", GIB) if largest >= GIB else ("MiB", MIB)
    state = [None if r.get(MODEL_STATE_BYTES) is None else r[MODEL_STATE_BYTES] / div for r in measured]
    return _two_panels(rows, measured, f"Memory by cell{note}", [
        ("Peak memory", [peak_memory_gib(r) for r in measured], ".2f", "GiB (max over ranks)"),
        ("Model state (params + grads + optimizer)", state, ".2f" if unit == "GiB" else ".1f",
         f"{unit} per rank (max over ranks)"),
    ], path)


def scaling(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Per-device throughput and scaling efficiency over node counts, one line per series."""
    measured = _measured(rows)
    by_series: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in measured:
        by_series.setdefault(r["series"], {}).setdefault(int(r["nodes"]), []).append(r)
    curves = {k: v for k, v in by_series.items() if len(v) > 1}
    if not curves:
        return None  # nothing was measured at more than one node count
    note = ""
    if len(curves) > MAX_SERIES:  # the series fastest per device at their smallest node count
        best = sorted(curves, key=lambda k: -(_mean(r[THROUGHPUT_SAMPLES_PER_S_PER_DEVICE]
                                                    for r in curves[k][min(curves[k])]) or 0.0))[:MAX_SERIES]
        note = f" ({MAX_SERIES} of {len(curves)} series: the fastest per device)"
        curves = {k: curves[k] for k in best}
    labels = {k: _short(v) for k, v in series_labels(measured).items()}
    fig = _figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    node_counts = sorted({n for points in curves.values() for n in points})
    for key, points in sorted(curves.items(), key=lambda kv: labels[kv[0]]):
        xs = sorted(points)
        # Repeated cells (several sweeps) are averaged per node count.
        per_dev = [_mean(r[THROUGHPUT_SAMPLES_PER_S_PER_DEVICE] for r in points[n]) for n in xs]
        eff = [_mean(r.get(SCALING_EFFICIENCY) for r in points[n]) for n in xs]
        left.plot(xs, per_dev, marker="o", label=labels[key])
        right.plot(xs, [None if e is None else 100 * e for e in eff], marker="o", label=labels[key])
    right.axhline(100, color="grey", linestyle="--", linewidth=1, label="linear scaling")
    for ax in (left, right):
        ax.set_xticks(node_counts)
        ax.set_xlabel("nodes")
        ax.grid(alpha=0.3)
    left.set_ylabel("samples/s per device")
    left.set_ylim(bottom=0)
    left.set_title("Per-device throughput")
    right.set_ylabel("% of the smallest cell's per-device throughput")
    right.set_ylim(0, max(110, max((100 * (r.get(SCALING_EFFICIENCY) or 0) for r in measured), default=0) * 1.1))
    right.set_title("Scaling efficiency")
    right.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Scaling over node counts (one line per series){note}")
    fig.savefig(path)
    return path


def anatomy(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Each cell's probe step cut into its parts (stacked, in contract.metrics.STEP_PARTS order, the
    unattributed remainder last and hatched), with the measured window's median step time marked:
    the gap between the bar's end and the mark is the profiler's own cost."""
    measured, note = _capped([r for r in _measured(rows) if r.get(metrics.ANATOMY_STEP)])
    if not measured:
        return None
    shown = [p for p in metrics.STEP_PARTS if any(r.get(p) for r in measured)]
    multi = len({r.get("sweep") for r in rows}) > 1
    labels = [_short(cell_label(r, multi)) for r in measured]
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    fig = _figure(11, 1.8 + 0.42 * len(measured))
    ax = fig.subplots()
    ys = list(range(len(measured)))
    left = [0.0] * len(measured)
    for i, part in enumerate(shown):
        widths = [float(r.get(part) or 0.0) for r in measured]
        last = part == ANATOMY_UNATTRIBUTED_MS
        ax.barh(ys, widths, left=left, label=part_label(part), color="lightgrey" if last else cmap(i % 20),
                hatch="//" if last else None, edgecolor="white", linewidth=0.5)
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    window = [r.get(STEP_TIME_MS_P50) for r in measured]
    ax.scatter([w for w in window if w], [y for y, w in zip(ys, window, strict=True) if w], marker="|", s=300,
               color="black", label="window step p50", zorder=3)
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (the profiled probe's; its parts add up to its step)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"Step anatomy by cell{note}")
    fig.savefig(path)
    return path


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def make_all(rows: Sequence[dict[str, Any]], plot_dir: Path) -> list[tuple[Path, str]]:
    """Every plot that has data, as (path, caption)."""
    plot_dir = Path(plot_dir)
    plot_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for name, fn, caption in (
        ("throughput.png", throughput, "Throughput by cell: total (sum over ranks) and per device."),
        ("memory.png", memory, "Memory by cell: peak memory and model-state bytes per rank (max over ranks)."),
        ("scaling.png", scaling, "Scaling: per-device throughput and scaling efficiency over node counts, "
                                 "one line per series (same settings except the node count)."),
        ("anatomy.png", anatomy, "Step anatomy: each cell's profiled step cut into parts that add up to it "
                                 "(compute by phase, exposed communication by collective, data wait, copies, "
                                 "the unattributed remainder hatched); the mark is the window's median step."),
    ):
        out = fn(rows, plot_dir / name)
        if out is not None:
            made.append((out, caption))
    return made
