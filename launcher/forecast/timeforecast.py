"""``cluster.timeout_min=auto`` before a sweep: each cell's expected wall time from the latest sweep
of its cluster, measured where its configuration ran, else forecast by the performance model
(launcher/forecast/timelimit.py holds the rule, the limits of later runs and the report's section;
this module is apart because it reads the forecast, which runs=auto's rounds need not)."""

from __future__ import annotations

from pathlib import Path

from launcher.forecast import inputs
from launcher.forecast.cells import forecast_cells, latest_sweep, row_of
from launcher.forecast.timelimit import DEFAULT_MIN, TimeAsked, minutes_for, used_s
from launcher.plan import fit
from launcher.plan.cell import Cell
from launcher.state import SweepState


def asked(cells: list[Cell], predicted: dict[int, fit.StateBytes], root: Path, key: str) -> dict[int, TimeAsked]:
    """Each cell's time limit from the latest sweep of cluster ``key`` under ``root``."""
    found = latest_sweep(root, key)
    if found is None:
        return {c.index: _default("no earlier sweep of this cluster to forecast from") for c in cells}
    state, points = found
    runs = _runs(state, points)
    startup = max((max(0.0, used - steps * p.observed.step_ms / 1000.0) for p, used, steps in runs), default=None)
    longest: dict[tuple[tuple[str, str], ...], float] = {}  # a configuration's settings -> its longest run
    for p, used, _ in runs:
        settings = tuple(sorted(p.settings.items()))
        longest[settings] = max(used, longest.get(settings, used))
    made, _, _ = forecast_cells(cells, predicted, points, inputs.probes_of(state))
    out = {}
    for f in made:
        seen = longest.get(tuple(sorted(inputs.point_settings(row_of(f.cell)).items())))
        steps = f.cell.config.steps if f.cell.resolved is not None else None
        delay_s = f.cell.cluster.signal_delay_s
        if seen is not None:
            out[f.cell.index] = TimeAsked(minutes_for(seen, delay_s), seen,
                                          f"measured: its configuration used {seen:.0f} s in {state.name}")
        elif f.prediction is not None and steps and startup is not None:
            expected = startup + steps * f.prediction.step_ms / 1000.0
            out[f.cell.index] = TimeAsked(minutes_for(expected, delay_s), expected,
                                          f"forecast: {steps} steps x {f.prediction.step_ms:.1f} ms + {startup:.0f} s "
                                          f"start-up ({state.name})")
        else:
            out[f.cell.index] = _default(f.why_not or "its start-up was not measured")
    return out


def _default(why: str) -> TimeAsked:
    return TimeAsked(DEFAULT_MIN, None, f"default {DEFAULT_MIN} min: {why}")


def _runs(state: SweepState, points: list[inputs.Point]) -> list[tuple[inputs.Point, float, int]]:
    """Each measured run of the sweep, read once: its configuration, the wall time it used, its steps."""
    cells = {c.name: c for c in state.cells}
    out = []
    for p in points:
        for member in p.members:
            cell = cells.get(str(member.get("cell")))
            used = used_s(state, cell) if cell else None
            if cell and used is not None:
                out.append((p, used, state.load_spec(cell).train.steps))
    return out
