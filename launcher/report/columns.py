"""The report's columns, from the metric registry (contract/metrics.py): the markdown table's and
cells.csv's, the one file with every figure of every cell."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import metrics
from contract.metrics import THROUGHPUT_CV
from launcher.report import stats
from launcher.report.rows import GIB, MIB, NO_RESULT_YET, grouped, md_cell, no_result_yet, num, ranked

# Above this coefficient of variation over repeated windows a cell's throughput is flagged as
# noisy: its difference to a neighbour in the ranking may be noise.
NOISY_CV = 0.03
NOISY_FLAG = "⚠"


def rate_text(value: Any) -> str:
    v = num(value)
    if v is None:
        return "-"
    return format(v, ",.0f") if v >= 1000 else format(v, ".1f")


def _fixed(spec: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = num(value)
        return "-" if v is None else format(v, spec)

    return fmt


def cv_text(row: dict[str, Any]) -> str:
    v = num(row.get(THROUGHPUT_CV))
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
    fmt = {"rate": rate_text, "count": _count}.get(metric.fmt) or _fixed(metric.fmt)
    return Column(str(metric.label), metric.read, fmt, optional=metric.optional)


def _status(row: dict) -> str:
    """``done``, or ``co-located: <what else it measured>`` (launcher/cluster/colocation.py)."""
    if row.get("interference"):
        return f"co-located: {row['interference']}"
    if no_result_yet(row):
        return f"{NO_RESULT_YET} ({row.get('status')})"
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
        Column("window CV", lambda r: r, cv_text),
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


# Leading columns of cells.csv: who the cell is, the registry's leading figures, what went wrong;
# every other key any row has follows, sorted.
_CSV_WHO = ("cell", "sweep", "model", "strategy", "precision", "nodes", "world_size", "status", "failure_class")
_CSV_LAST_OF_LEAD = ("interference", "error", "run_id")
# Settings read beside a figure: the window count beside the window CV computed over it.
_CSV_BESIDE = {THROUGHPUT_CV: ("repeats",)}


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
