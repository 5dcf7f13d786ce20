"""``cells=auto`` in a sweep: the grid split into its pilot and the cells waiting, each round's
forecasts from what was measured, the next round's cells, and once it stops, the configurations not
run with why, kept in the sweep document (launcher/state.py, Search), the cluster's forecast record
and MLflow (runs tagged ``forecast``). The rule itself is launcher/forecast/search.py.

Every cell of the grid is planned and its spec written when the sweep starts; the cells of the
configurations not yet run wait in ``state.search.waiting`` and join ``state.cells`` when a round
picks them (a new index, the same directory), so everything that follows cells sees only those run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from contract.tuning import resolved_model
from launcher.cluster.backends import backend_for
from launcher.forecast import forecastrecord, inputs, perfmodel, search, timelimit
from launcher.forecast.cells import nearest_calls, row_of, throughput_of
from launcher.plan import fitcache
from launcher.plan.cell import Cell, configuration
from launcher.plan.grid import SweepError
from launcher.plan.planner import run_spec
from launcher.plan.schema import AUTO
from launcher.report.collect import collect
from launcher.report.noisefloor import floor_key
from launcher.state import Pruned, Search, SearchRound, StateError, SweepState
from launcher.track import runs, tracking

# ---- the grid as the rule sees it ---------------------------------------------------------------


def shapes_of(cells: list[Cell], spec_of) -> list[search.Shape]:
    """One Shape per configuration (its first cell), ``spec_of(cell)`` its RunSpec."""
    swept = [k for k in sorted({o.split("=", 1)[0].lstrip("+~") for c in cells for o in c.overrides if "=" in o})
             if len({_value(c, k) for c in cells}) > 1]
    blind = search.unmodelled(swept)
    out, seen = [], set()
    for cell in cells:
        name = configuration(cell.name)
        if name in seen:
            continue
        seen.add(name)
        spec = spec_of(cell)
        model = " ".join([cell.model, *sorted(o for o in cell.overrides if o.lstrip("+~").startswith("model."))])
        flops = fitcache.flops_per_sample(resolved_model(spec.model, cuda=spec.layout.gpus_per_node > 0)) or 1.0
        train = spec.train
        size = flops * train.batch_size * train.grad_accum_steps * (4 / 3 if train.activation_checkpointing else 1)
        out.append(search.Shape(name, model, "gpu" if spec.layout.gpus_per_node else "cpu", cell.precision,
                                cell.strategy, cell.world_size, cell.nodes, size,
                                ", ".join(f"{k}" for k in blind if _value(cell, k) is not None)))
    return out


def _value(cell: Cell, key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in cell.overrides if o.split("=", 1)[0].lstrip("+~") == key), None)


def planned_shapes(cells: list[Cell]) -> list[search.Shape]:
    return shapes_of(cells, lambda c: run_spec(c, Path("."), None, None))


def check(cells: list[Cell]) -> None:
    """cells=auto's refusals before anything runs: one configuration, a baseline of another grid, a
    cells_max below the pilot's size, a backend that runs cells in the background."""
    config = cells[0].config
    if config.cells != AUTO:
        return
    names = list(dict.fromkeys(configuration(c.name) for c in cells))
    if len(names) < 2:
        raise SweepError(f"[{names[0]}] cells=auto searches a grid for its best configurations, and this grid has one: "
                         "nothing to search. Fix: drop cells=auto, or sweep settings (strategy=ddp,fsdp nodes=1,2).")
    if config.baseline:
        try:
            other = SweepState.load(Path(config.baseline))
        except StateError as exc:
            raise SweepError(f"baseline={config.baseline!r}: {exc}") from exc
        theirs = {configuration(c.name) for c in [*other.cells, *(other.search.waiting if other.search else [])]}
        if theirs != set(names):
            raise SweepError(f"baseline={config.baseline!r} holds another grid ({len(theirs)} configuration(s), this "
                             f"one {len(names)}): cells=auto runs only some configurations, and those a baseline of "
                             "another grid would be compared with are chosen by forecasts, not by you. Fix: give a "
                             "baseline of the same grid, drop the baseline, or drop cells=auto.")
    chosen = search.pilot(planned_shapes(cells))
    if config.cells_max is not None and config.cells_max < len(chosen):
        raise SweepError(f"cells_max={config.cells_max} is below the pilot's {len(chosen)} configuration(s) (the fewest "
                         f"the performance model can be fitted on: {'; '.join(w for _, w in chosen[:4])}"
                         f"{' ...' if len(chosen) > 4 else ''}). Fix: set cells_max={len(chosen)} or more, or drop it.")


def refuse_background(cells: list[Cell]) -> None:
    """The search decides its rounds in the launcher's foreground; a backend that returns after
    submitting (Slurm) would need status to run them."""
    if cells[0].config.cells == AUTO and not backend_for(cells[0].cluster.name).runs_cells_in_foreground:
        raise SweepError(f"cells=auto runs its rounds in the launcher's foreground, and cluster={cells[0].cluster.name} "
                         "submits and returns. Fix: plan it (--plan cells=auto shows the pilot and the node-hours), run "
                         "the grid with cells=all, or search it on a backend that runs in the foreground (local, "
                         "torchrun).")


# ---- the sweep's search -------------------------------------------------------------------------

def begin(state: SweepState) -> None:
    """cells=auto: only the pilot's cells stay in ``state.cells``; the others wait (specs written)."""
    if not state.cells or state.cells[0].config.cells != AUTO:
        return
    config = state.cells[0].config
    chosen = dict(search.pilot(shapes_of(state.cells, state.load_spec)))
    now = time.time()
    specs = [(cell, state.load_spec(cell)) for cell in state.cells]
    state._specs().clear()
    # The pilot's cells at 0, 1, ...; the waiting ones at -1, -2, ...: no index is shared, and a
    # round gives each cell it picks the next index of state.cells.
    pilot_cells: list[Cell] = []
    waiting: list[Cell] = []
    for cell, spec in specs:
        mine = pilot_cells if configuration(cell.name) in chosen else waiting
        mine.append(cell)
        cell.index = len(pilot_cells) - 1 if mine is pilot_cells else -len(waiting)
        state._specs()[cell.index] = spec
    state.cells = pilot_cells
    state.search = Search(config.cells_max, config.cells_budget_min, now, len(chosen) + len(
        {configuration(c.name) for c in waiting}), waiting, [SearchRound(1, list(chosen), list(chosen.values()), now)])


def _move(state: SweepState, cell: Cell, index: int) -> None:
    """A waiting cell at its index in state.cells, its directory and spec unchanged."""
    spec = state.load_spec(cell)
    cell.index = index
    state._specs()[index] = spec


def next_round(state: SweepState, now_s: float | None = None) -> list[Cell]:
    """Once every cell has ended: the next round's cells (moved into ``state.cells``, saved), or []
    with ``search.stopped`` saying why none follows."""
    found = state.search
    if found is None or found.stopped or not all(c.status.terminal for c in state.cells):
        return []
    now_s = time.time() if now_s is None else now_s
    candidates, measured = look(state)
    errors = [math.log(f / measured[n]) for n, f in found.forecasts.items() if measured.get(n)]
    record = [e["log_error"] for e in forecastrecord.errors(state.path.parent, floor_key(state))]
    band = search.band([*record, *errors], found.level)
    choice = search.choose(candidates, band.half_width)
    todo, why = _within_budget(state, choice.run, candidates, now_s)
    if not todo:
        _stop(state, choice, candidates, band, why or "every scale decided: each best configuration is measured, and "
              "no other configuration's interval reaches it")
        return []
    added = []
    forecast = {c.shape.name: c.forecast for c in candidates}
    for name, _ in todo:
        for cell in [c for c in found.waiting if configuration(c.name) == name]:
            found.waiting.remove(cell)
            _move(state, cell, len(state.cells))
            state.cells.append(cell)
            added.append(cell)
        if forecast.get(name):
            found.forecasts[name] = float(forecast[name] or 0.0)
    found.rounds.append(SearchRound(len(found.rounds) + 1, [n for n, _ in todo], [w for _, w in todo], now_s))
    state.save()
    print(f"cells=auto: round {len(found.rounds)} runs {len(todo)} configuration(s) ({band.said}): "
          + "; ".join(f"{n}: {w}" for n, w in todo[:4]) + (" ..." if len(todo) > 4 else ""), flush=True)
    return added


def _within_budget(state: SweepState, run: list[tuple[str, str]], candidates: list[search.Candidate],
                   now_s: float) -> tuple[list[tuple[str, str]], str | None]:
    """The configurations of the next round that cells_max and the wall-time budget leave room for:
    the likeliest winners first (search.cap), each costed at its own pace (:func:`_round_cost_s`)."""
    found = state.search
    assert found is not None
    if not run:
        return [], None
    ran = len({configuration(c.name) for c in state.cells})
    why = None
    if found.cells_max is not None and ran + len(run) > found.cells_max:
        run = search.cap(run, candidates, found.cells_max - ran)
        why = f"cells_max={found.cells_max} reached ({ran} configuration(s) run)"
    if found.budget_min is not None and run:
        spent_s = now_s - found.started_s
        left_s = found.budget_min * 60 - spent_s
        cost_s = _round_cost_s(state, now_s)
        kept: list[tuple[str, str]] = []
        kept_s = 0.0
        for item in search.cap(run, candidates, len(run)):
            kept_s += cost_s(item[0])
            if kept_s > left_s:
                break
            kept.append(item)
        if len(kept) < len(run):
            all_s = sum(cost_s(name) for name, _ in run)
            run = [item for item in run if item in kept]
            why = (f"budget: cells_budget_min={found.budget_min:g} ({spent_s / 60:.1f} min spent; the round's "
                   f"configurations would take about {all_s / 60:.1f} min)")
    return run, why


def _round_cost_s(state: SweepState, now_s: float) -> Callable[[str], float]:
    """A waiting configuration's wall time in the next round: each of its launches at the pace the
    last round's launches of the same world size had (timelimit.round_pace_s), or at the round's
    mean pace where it ran none of that size."""
    found = state.search
    assert found is not None
    last = found.rounds[-1]
    in_round = set(last.configurations)
    cells = [c for c in state.cells if configuration(c.name) in in_round]
    pace_s = timelimit.round_pace_s(state, cells, now_s - last.started_s, lambda c: c.world_size)
    waiting: dict[str, list[Cell]] = {}
    for c in found.waiting:
        waiting.setdefault(configuration(c.name), []).append(c)
    return lambda name: sum(pace_s(c.world_size) for c in waiting.get(name, []))


def look(state: SweepState) -> tuple[list[search.Candidate], dict[str, float]]:
    """Every configuration of the grid at this look: measured ones with their mean samples/s, the
    waiting ones forecast from a model fitted on those (configurations that ran without a result
    are left out: run again, they would fail again)."""
    found = state.search
    assert found is not None
    probes = inputs.probes_of(state)
    points = inputs.points_of(state, collect(state), probes=probes)
    model = probes.fit([p.observed for p in points])
    cpus = inputs.host_cpus()
    everything = [*state.cells, *found.waiting]
    shapes = {s.name: s for s in shapes_of(everything, state.load_spec)}
    measured: dict[str, float] = {}
    for cell in state.cells:
        settings = inputs.point_settings(row_of(cell))
        point = next((p for p in points if p.settings == settings), None)
        if point is not None:
            measured[configuration(cell.name)] = throughput_of(point.observed)
    ran = {configuration(c.name) for c in state.cells}
    out = [search.Candidate(shapes[name], value) for name, value in measured.items()]
    for name in dict.fromkeys(configuration(c.name) for c in found.waiting):
        cell = next(c for c in found.waiting if configuration(c.name) == name)
        if name in ran:
            continue
        value, why = _forecast(state, cell, shapes[name], model, points, cpus, probes.one_machine_cpus)
        out.append(search.Candidate(shapes[name], None, value, why))
    return out, measured


def _forecast(state: SweepState, cell: Cell, shape: search.Shape, model: perfmodel.Model,
              points: list[inputs.Point], cpus: float, one_machine: float | None) -> tuple[float | None, str]:
    if shape.unmodelled:
        return None, f"{shape.unmodelled} is not in the performance model"
    spec = state.load_spec(cell)
    flops = fitcache.flops_per_sample(resolved_model(spec.model, cuda=spec.layout.gpus_per_node > 0))
    if not flops:
        return None, f"no FLOP count for model {cell.model}"
    settings = inputs.point_settings(row_of(cell))
    work = inputs.work_of(spec, cell.strategy, flops, dict(cell.predicted_comm_bytes),
                          nearest_calls(settings, cell.strategy, points), cpus, one_machine_cpus=one_machine)
    try:
        return model.predict(work).throughput_samples_per_s, ""
    except perfmodel.CannotPredict as exc:
        return None, str(exc)


# ---- the end: what was not run, and why -----------------------------------------------------------

def _stop(state: SweepState, choice: search.Choice, candidates: list[search.Candidate], band: search.Band,
          why: str) -> None:
    found = state.search
    assert found is not None
    found.stopped, found.half_width, found.basis = why, band.half_width, band.said
    low, high = math.exp(-band.half_width), math.exp(band.half_width)
    beaten = {c.shape.name: best for c, best in choice.pruned}
    found.pruned = []
    for c in candidates:
        if c.measured is not None:
            continue
        best = beaten.get(c.shape.name)
        f = c.forecast
        found.pruned.append(Pruned(
            c.shape.name, c.shape.model, c.shape.world_size, c.shape.nodes, f, f * low if f else None,
            f * high if f else None, best.shape.name if best else None, best.measured if best else None,
            "pruned" if best else (f"cannot be forecast: {c.why_not}" if f is None else f"not run: {why}")))
    _keep_errors(state)
    _log_forecast_runs(state)
    state.save()
    print(f"cells=auto: no further round: {why}", flush=True)


def _keep_errors(state: SweepState) -> None:
    """This search's forecasts set against what their configurations then measured: the cluster's
    record (kind ``search``), so the next search's intervals include them."""
    found = state.search
    assert found is not None
    _, measured = look(state) if found.forecasts else ([], {})
    entries = [{"cell": n, "kind": "search", "predicted": f, "measured": measured[n]}
               for n, f in found.forecasts.items() if measured.get(n)]
    if entries:
        forecastrecord.add(state.path.parent, floor_key(state), f"{state.name} search", entries)


def _log_forecast_runs(state: SweepState) -> None:
    """The configurations not run as MLflow runs beside the measured ones, tagged ``forecast``."""
    found = state.search
    if found is None or not state.tracking_uri:
        return
    if not state.parent_run_id:
        runs.ensure_runs(state)
    todo = [p for p in found.pruned if not p.run_id and p.forecast]
    if not todo or not (state.parent_run_id and state.experiment_id):
        return
    try:
        ids = tracking.log_forecast_runs(state.tracking_uri, state.experiment_id, state.parent_run_id, [
            (p.name, dict(w.split("=", 1) for w in p.name.split() if "=" in w),
             {inputs.FORECAST_METRIC: p.forecast or 0.0, "forecast_low": p.low or 0.0,
              "forecast_high": p.high or 0.0, **({"beaten_by_ratio": (p.forecast or 0.0) / p.beaten_at}
                                                 if p.beaten_at else {})},
             {"forecast_of": p.name, "sweep": state.name, "why_not_run": p.why, "beaten_by": p.beaten_by or "-"})
            for p in todo])
    except Exception as exc:  # the sweep document keeps them; the report lists them
        print(f"[mlflow] could not log the forecast runs: {type(exc).__name__}: {exc}", flush=True)
        return
    for p, run_id in zip(todo, ids, strict=True):
        p.run_id = run_id


def summary(state: SweepState) -> str:
    """One line for the terminal: rounds, configurations run of the grid, why it stopped."""
    found = state.search
    if found is None:
        return ""
    ran = len({configuration(c.name) for c in state.cells})
    pruned = sum(1 for p in found.pruned if p.beaten_by)
    return (f"cells=auto: {len(found.rounds)} round(s), {ran} of {found.grid} configuration(s) run ({len(state.cells)} "
            f"launch(es)), {pruned} pruned; stopped: {found.stopped or 'a round is running'}")


def grid_names(state: SweepState) -> list[str]:
    """Every cell name of the grid a cells=auto sweep searches (run or waiting), for a resume."""
    return sorted(c.name for c in [*state.cells, *(state.search.waiting if state.search else [])])


# ---- on paper: --plan cells=auto ----------------------------------------------------------------

def plan_lines(cells: list[Cell], predicted: dict) -> list[str]:
    """What a cells=auto search of this grid would run: the pilot, and the node-hours of the full
    grid and of the expected search (replays on the nominal model, launcher/forecast/searchsim.py),
    at the time each cell asks (cluster.timeout_min): an upper bound of what it would use."""
    from launcher.forecast import searchsim

    if cells[0].config.cells != AUTO:
        return []
    shapes = planned_shapes(cells)
    chosen = search.pilot(shapes)
    first: dict[str, Cell] = {}
    for cell in cells:
        first.setdefault(configuration(cell.name), cell)
    runs = {name: sum(1 for c in cells if configuration(c.name) == name) for name in first}
    hours = {name: c.nodes * runs[name] * c.cluster.timeout_min / 60 for name, c in first.items()}
    works = {}
    for name, cell in first.items():
        spec = run_spec(cell, Path("."), None, None)
        flops = fitcache.flops_per_sample(resolved_model(spec.model, cuda=spec.layout.gpus_per_node > 0)) or 1.0
        state = predicted.get(cell.index)
        works[name] = inputs.work_of(spec, cell.strategy, flops, dict(state.comm_bytes_per_step) if state else {}, {},
                                     inputs.host_cpus())
    key = backend_for(cells[0].cluster.name).noise_floor_key(cells[0].cluster)
    record = [e["log_error"] for e in forecastrecord.errors(Path(cells[0].config.output_root), key)]
    found = searchsim.expected(shapes, works, record, cells_max=cells[0].config.cells_max)
    ran = sorted(len(r.outcome.ran) for r in found)
    spent = sorted(sum(hours[n] for n in r.outcome.ran) for r in found)
    launches = sorted(sum(runs[n] for n in r.outcome.ran) for r in found)
    full_h, pilot_h = sum(hours.values()), sum(hours[n] for n, _ in chosen)
    mean = sum(spent) / len(spent)
    return [f"cells=auto: the pilot runs {len(chosen)} of {len(first)} configuration(s) "
            f"({sum(runs[n] for n, _ in chosen)} launch(es), {pilot_h:,.1f} node-hours): "
            + "; ".join(f"{n} ({w})" for n, w in chosen[:6]) + (" ..." if len(chosen) > 6 else ""),
            f"- full grid: {len(first)} configuration(s), {sum(runs.values())} launch(es), {full_h:,.1f} node-hours",
            f"- expected search: {sum(ran) / len(ran):.1f} configuration(s) (90% of replays at most {ran[len(ran) * 9 // 10 - 1]}), "
            f"{sum(launches) / len(launches):.1f} launch(es), {mean:,.1f} node-hours ({mean / full_h:.0%} of the full "
            f"grid; 90% of replays at most {spent[len(spent) * 9 // 10 - 1]:,.1f})",
            f"  node-hours at the time each cell asks (cluster.timeout_min={cells[0].cluster.timeout_min}): an upper bound. "
            f"The search expected from {len(found)} replays of the rule on a nominal node (launcher/forecast/searchsim.py) "
            + (f"with this cluster's {len(record)} recorded forecast errors." if record else
               f"with errors up to the default allowance ±{math.expm1(search.DEFAULT_ERROR):.0%} (no record on "
               f"cluster {key} yet)."), ""]
