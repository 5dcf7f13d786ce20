"""The report's section of a ``cells=auto`` sweep: how much of the grid it ran, how the pruning error
was controlled, and each configuration not run with its forecast, interval and the measured
configuration that beat it (read from the sweep document, launcher/state.py Search; the rule is
launcher/forecast/search.py)."""

from __future__ import annotations

import math
import statistics

from contract import cell_run
from contract.records import read_records
from launcher.plan.cell import configuration
from launcher.report.rows import md_cell
from launcher.state import SweepState


def node_hours(state: SweepState) -> tuple[float, dict[int, float]]:
    """(node-hours of the launches run, seconds per launch by world size) from each cell's records."""
    total = 0.0
    seconds: dict[int, list[float]] = {}
    for cell in state.cells:
        path = state.cell_dir(cell) / cell_run.METRICS_FILE
        start, end = cell_run.first_start_s(path), cell_run.end_s(read_records(path)) if path.exists() else None
        if start is None or end is None or end < start:
            continue
        total += cell.nodes * (end - start) / 3600
        seconds.setdefault(cell.world_size, []).append(end - start)
    return total, {w: statistics.fmean(s) for w, s in seconds.items()}


def section(state: SweepState) -> list[str]:
    """``## Cells not run (cells=auto)``; nothing for a sweep that ran its whole grid."""
    found = state.search
    if found is None:
        return []
    ran = list(dict.fromkeys(configuration(c.name) for c in state.cells))
    hours, per_launch = node_hours(state)
    launches_each = max(1, round(len(state.cells) / max(1, len(ran))))
    fallback = statistics.fmean(per_launch.values()) if per_launch else 0.0
    left = sum(p.nodes * launches_each * per_launch.get(p.world_size, fallback) / 3600 for p in found.pruned)
    pruned = [p for p in found.pruned if p.beaten_by]
    undecided = [p for p in found.pruned if not p.beaten_by]
    h = found.half_width
    control = (f"A configuration was pruned only where its forecast times ×{math.exp(h):.2f} (the upper end of its "
               f"{found.level:.0%} interval: {found.basis}) stayed below the best measured configuration of its model "
               f"and world size: the best is missed only when its own forecast fell short by more than that, at most "
               f"{(1 - found.level) / 2:.1%} of forecasts erring as the recorded ones did (docs/deciding.md, *Searching "
               f"the grid*).") if h is not None else "The search had not stopped when this report was written."
    parts = ["## Cells not run (cells=auto)", "",
             f"**Run: {len(ran)} of {found.grid} configuration(s) ({len(ran) / max(1, found.grid):.0%}), {len(state.cells)} "
             f"launch(es), {hours:.2f} node-hours**; not run: {len(found.pruned)} configuration(s), about {left:.2f} "
             f"node-hours more at the measured launches' durations. {len(found.rounds)} round(s); stopped: "
             f"{md_cell(found.stopped or 'still running')}. {control}", ""]
    if pruned or undecided:
        parts += ["| configuration | forecast samples/s | interval | beaten by (measured) | forecast / best | why |",
                  "|---|---:|---:|---|---:|---|"]
        for p in sorted(found.pruned, key=lambda p: (p.world_size, -(p.forecast or 0.0))):
            interval = f"{p.low:.1f}–{p.high:.1f}" if p.low and p.high else "-"
            beaten = f"{md_cell(p.beaten_by)} ({p.beaten_at:.1f})" if p.beaten_by and p.beaten_at else "-"
            ratio = f"{p.forecast / p.beaten_at:.2f}× ({p.forecast / p.beaten_at - 1:+.0%})" \
                if p.forecast and p.beaten_at else "-"
            parts.append(f"| {md_cell(p.name)} | {f'{p.forecast:.1f}' if p.forecast else '-'} | {interval} | {beaten} | "
                         f"{ratio} | {md_cell(p.why)} |")
        parts.append("")
    parts += ["Rounds: " + "; ".join(f"{r.number}: {len(r.configurations)} configuration(s)"
                                     + (" (the pilot)" if r.number == 1 else "") for r in found.rounds)
              + ". The pruned configurations are MLflow runs tagged `forecast` under this sweep's parent run.", ""]
    return parts
