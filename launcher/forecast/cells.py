"""Forecasts of cells from a sweep's measured configurations: each cell's forecast and what its
interval rests on, shared by the forecast command (launcher/commands/forecast.py) and --plan
(launcher/preview.py); read from files, no torch import."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from contract.tuning import resolved_model
from launcher.forecast import forecastrecord, inputs, perfmodel
from launcher.plan import fit, fitcache
from launcher.plan.cell import Cell
from launcher.plan.planner import run_spec
from launcher.report.collect import collect
from launcher.report.noisefloor import floor_key
from launcher.report.rows import md_cell
from launcher.state import StateError, SweepState


@dataclass
class Forecast:
    cell: Cell
    work: perfmodel.Work | None
    prediction: perfmodel.Prediction | None
    state: fit.StateBytes | None
    why_not: str = ""
    measured: float | None = None  # samples/s, where the sweep ran this configuration


@dataclass(frozen=True)
class Basis:
    """What the intervals rest on, in words, and their spread; ``ratio``: how far the ratio of two
    forecasts has been off (the recommendation's test, launcher/forecast/forecastrecord.py)."""

    spread: perfmodel.Spread | None
    said: str
    ratio: perfmodel.Spread | None = None


def forecast_cells(cells: list[Cell], predicted: dict[int, fit.StateBytes], points: list[inputs.Point],
               probes: inputs.Probes) -> tuple[list[Forecast], perfmodel.Model, float]:
    """Each cell's forecast from a model of the measured points, and the CPUs its ranks share (the
    probed nodes' one machine, else this host)."""
    model = probes.fit([p.observed for p in points])
    cpus = inputs.host_cpus()
    made = [_one(cell, predicted.get(cell.index), model, points, cpus, probes.one_machine_cpus) for cell in cells]
    return made, model, probes.one_machine_cpus or cpus


def _one(cell: Cell, state: fit.StateBytes | None, model: perfmodel.Model, points: list[inputs.Point],
         cpus: float, one_machine_cpus: float | None = None) -> Forecast:
    spec = run_spec(cell, Path("."), None, None)
    settings = inputs.point_settings(row_of(cell))
    measured = next((p for p in points if p.settings == settings), None)
    flops = fitcache.flops_per_sample(resolved_model(spec.model, cuda=spec.layout.gpus_per_node > 0))
    if not flops:
        return Forecast(cell, None, None, state, f"no FLOP count for model {cell.model}")
    moved = state.comm_bytes_per_step if state else {}
    work = inputs.work_of(spec, cell.strategy, flops, dict(moved), nearest_calls(settings, cell.strategy, points), cpus,
                             one_machine_cpus=one_machine_cpus)
    try:
        prediction = model.predict(work)
    except perfmodel.CannotPredict as exc:
        return Forecast(cell, work, None, state, str(exc))
    return Forecast(cell, work, prediction, state, measured=throughput_of(measured.observed) if measured else None)


def row_of(cell: Cell) -> dict:
    return {"settings": dict(o.split("=", 1) for o in cell.overrides if "=" in o), "strategy": cell.strategy,
            "precision": cell.precision, "model": cell.model, "nodes": cell.nodes}


def throughput_of(o: perfmodel.Observed) -> float:
    return 1000.0 * o.work.world_size * o.work.samples / o.step_ms


def nearest_calls(settings: dict[str, str], strategy: str, points: list[inputs.Point]) -> dict[str, float]:
    """Collectives per step of the measured cell most like this one (same strategy, most settings in
    common): the calls do not change with the node count, and little with the batch."""
    same = [p for p in points if p.observed.work.strategy == strategy and p.observed.work.collectives]
    if not same:
        return {}
    nearest = max(same, key=lambda p: sum(p.settings.get(k) == v for k, v in settings.items()))
    return {c.kind: c.calls_per_step for c in nearest.observed.work.collectives}


def basis(state: SweepState, points: list[inputs.Point], probes: inputs.Probes) -> Basis:
    """The intervals: from this cluster's record of checked forecasts, else this sweep's own
    leave-one-out (the model as the forecasts fit it: with the sweep's probes), else none."""
    root, key = state.path.parent, floor_key(state)
    record = forecastrecord.errors(root, key)
    if record:
        return Basis(perfmodel.spread([e["log_error"] for e in record], inputs.LEVEL),
                     forecastrecord.said(record, key),
                     perfmodel.spread(forecastrecord.ratio_errors(record), inputs.LEVEL))
    checked = inputs.leave_one_out(points, probes.fit) if len(points) >= 2 else []
    errors = [c.error for c in checked if c.error is not None]
    spread = perfmodel.spread(errors, inputs.LEVEL)
    if spread is None:
        return Basis(None, f"{forecastrecord.said([], key)} This sweep has too few configurations to check the model "
                           "on: the forecasts carry no interval.")
    ratio = perfmodel.spread(forecastrecord.ratio_errors([{"sweep": state.name, "log_error": e} for e in errors]),
                             inputs.LEVEL)
    off = sorted(abs(math.expm1(e)) for e in errors)
    return Basis(spread, f"{forecastrecord.said([], key)} Leave-one-out on this sweep's {len(errors)} configurations: "
                         f"off by {off[len(off) // 2]:.1%} (median).", ratio)


def notes(made: list[Forecast], cpus: float) -> list[str]:
    notes = []
    shared = [f for f in made if f.work and f.work.device == "cpu" and f.work.cores < f.work.threads]
    if shared:
        worst = min(shared, key=lambda f: f.work.cores if f.work else 1.0)
        assert worst.work is not None
        notes.append(f"Emulated nodes share one machine's {cpus:g} CPUs: at {worst.cell.world_size} rank(s) each rank "
                     f"gets {worst.work.cores:.2g} of a core. The compute forecast takes ranks on a shared core as "
                     "time-sliced (a measured rate divided among them); this tells what this machine would do, not "
                     "what as many real nodes would.")
    return notes


# ---- beside --plan ------------------------------------------------------------------------------

def beside_plan(cells: list[Cell], predicted: dict[int, fit.StateBytes]) -> list[str]:
    """The forecast of each planned cell from the newest sweep of the same cluster under its
    output_root (nothing where there is none): read from files, no torch import."""
    from launcher.cluster.backends import backend_for

    first = cells[0].cluster
    key = backend_for(first.name).noise_floor_key(first)
    set_aside: list[str] = []
    found = latest_sweep(Path(cells[0].config.output_root), key, set_aside)
    if found is None:
        return [*set_aside, f"Forecast: no earlier sweep of cluster {key} under output_root to forecast from."]
    state, points = found
    probes = inputs.probes_of(state)
    made, _, _ = forecast_cells(cells, predicted, points, probes)
    spread = basis(state, points, probes)
    lines = [*set_aside, f"Forecast from sweep {state.name} ({len(points)} measured configuration(s); python -m launcher.forecast "
             f"{state.sweep_dir} for the model and --verify):", "",
             "| # | cell | samples/s (interval) | step ms | comm share |", "|---:|---|---:|---:|---:|"]
    for f in made:
        p = f.prediction
        if p is None:
            lines.append(f"| {f.cell.index} | {md_cell(f.cell.name)} | - ({md_cell(f.why_not or 'no forecast')}) | - | - |")
            continue
        interval = "" if spread.spread is None else " ({:.1f}–{:.1f})".format(
            *spread.spread.interval(p.throughput_samples_per_s))
        lines.append(f"| {f.cell.index} | {md_cell(f.cell.name)} | {p.throughput_samples_per_s:.1f}{interval} | "
                     f"{p.step_ms:.1f} | {p.comm_share:.0%} |")
    return [*lines, "", spread.said]


def latest_sweep(root: Path, key: str, set_aside: list[str] | None = None
                 ) -> tuple[SweepState, list[inputs.Point]] | None:
    """The latest sweep under ``root`` of the cluster ``key`` with MIN_SERIES configurations the model can
    read, else the latest with any. Latest by what its records say (its cells' last measured start,
    never a file's mtime, which a sync or a copy rewrites), unflagged sweeps first. A sweep that cannot
    be read or rebuilt here (a user's model this shell cannot import, a damaged result) is set aside
    with one line in ``set_aside`` naming it and why."""
    fallback = None
    for state in _by_recorded_end(root, key):
        try:
            points = inputs.points_of(state, collect(state))
        except Exception as exc:  # anything of another person's sweep: never this command's failure
            if set_aside is not None:
                set_aside.append(f"Set aside sweep {state.sweep_dir}: it cannot be read here "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}).")
            continue
        if len(points) >= inputs.MIN_SERIES:
            return state, points
        fallback = fallback or ((state, points) if points else None)  # a --verify sweep: one point
    return fallback


def _by_recorded_end(root: Path, key: str) -> list[SweepState]:
    """The readable sweeps of cluster ``key`` under ``root``: those none of whose cells was flagged for
    interference first, each group latest first by its records (the latest start of a measured window
    among its cells' results; the sweep's name breaks ties)."""
    found = []
    for document in root.glob("*/sweep.json"):
        try:
            state = SweepState.load(document.parent)
        except StateError:
            continue
        if state.cells and floor_key(state) == key:
            found.append((not any(c.interference for c in state.cells), recorded_end_unix_s(state), state.name, state))
    return [state for *_, state in sorted(found, key=lambda f: f[:3], reverse=True)]


def recorded_end_unix_s(state: SweepState) -> float:
    """When the sweep last measured, from its cells' results (0 where none has one)."""
    starts = []
    for cell in state.cells:
        try:
            start = state.read_result(cell).get("first_step_unix_s")
        except (OSError, ValueError, StateError):
            continue
        if isinstance(start, (int, float)) and not isinstance(start, bool):
            starts.append(float(start))
    return max(starts, default=0.0)
