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
    measured = _measured_by_settings(state, points)
    startup = _startup_s(state, points)
    made, _, _ = forecast_cells(cells, predicted, points, inputs.probes_of(state))
    out = {}
    for f in made:
        settings = inputs.point_settings(row_of(f.cell))
        steps = f.cell.config.steps if f.cell.resolved is not None else None
        if (seen := measured.get(_frozen(settings))) is not None:
            out[f.cell.index] = TimeAsked(minutes_for(seen, f.cell.cluster.signal_delay_s), seen, f"measured: its configuration used {seen:.0f} s "
                                                                 f"in {state.name}")
        elif f.prediction is not None and steps and startup is not None:
            expected = startup + steps * f.prediction.step_ms / 1000.0
            out[f.cell.index] = TimeAsked(minutes_for(expected, f.cell.cluster.signal_delay_s), expected,
                                          f"forecast: {steps} steps x {f.prediction.step_ms:.1f} ms + {startup:.0f} s "
                                          f"start-up ({state.name})")
        else:
            out[f.cell.index] = _default(f.why_not or "its start-up was not measured")
    return out


def _default(why: str) -> TimeAsked:
    return TimeAsked(DEFAULT_MIN, None, f"default {DEFAULT_MIN} min: {why}")


def _frozen(settings: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(settings.items()))


def _by_name(state: SweepState) -> dict[str, Cell]:
    return {c.name: c for c in state.cells}


def _measured_by_settings(state: SweepState, points: list[inputs.Point]) -> dict[tuple, float]:
    cells = _by_name(state)
    out = {}
    for p in points:
        seen = [s for m in p.members if (c := cells.get(str(m.get("cell")))) and (s := used_s(state, c)) is not None]
        if seen:
            out[_frozen(p.settings)] = max(seen)
    return out


def _startup_s(state: SweepState, points: list[inputs.Point]) -> float | None:
    """The longest wall time a run spent outside its measured steps (start, build, compile, probes)."""
    cells = _by_name(state)
    seen = []
    for p in points:
        for m in p.members:
            cell = cells.get(str(m.get("cell")))
            used = used_s(state, cell) if cell else None
            steps = state.load_spec(cell).train.steps if cell and used is not None else None
            if used is not None and steps:
                seen.append(used - steps * p.observed.step_ms / 1000.0)
    return max(0.0, max(seen)) if seen else None
