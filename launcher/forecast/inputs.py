"""Forecasts checked on every sweep: each measured configuration forecast from the others.

A cell becomes the performance model's input (launcher/forecast/perfmodel.py) here: its training
FLOPs per rank (the worker's own count per sample, from its results, kept in launcher/plan/fitcache.py
for the model's other cells; a model that never ran is counted there once, on the meta device), the bytes its
strategy moves by collective kind (the theory, launcher/plan/traffic.py, which the launcher puts on
each cell before launch), the calls per step where the anatomy measured them, and the cores a rank
really has. A measured configuration adds its window: step time from its throughput, and the
probe's communication scaled to that step.

Leave-one-out: every configuration with a result is forecast from a model fitted on all the others,
and its error ``ln(forecast / measured)`` of throughput is kept. The interval of each point's
forecast rests on the errors of the *other* points (and the cluster's earlier ones,
launcher/forecast/forecastrecord.py), never on its own. A sweep validates when it holds a series of
at least ``MIN_SERIES`` configurations that differ in one setting only (node counts, batch sizes,
model depths).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contract import metrics
from contract.metrics import COMM_EXPOSED_MS, COMM_PROBE_STEP_TIME_MS, COMM_TIME_MS, FLOPS_PER_SAMPLE, FOREIGN_CPU_SHARE
from contract.parallel import ParallelDims
from contract.spec import RunSpec
from contract.tuning import resolved_model
from launcher.forecast import fabric, forecastrecord, perfmodel
from launcher.forecast.perfmodel import INTER, INTRA, Collective, Observed, Work
from launcher.plan import fitcache
from launcher.report.rows import grouped, md_cell, num, settings, throughput
from launcher.state import StateError, SweepState

MIN_SERIES = 3
FORECAST_METRIC = "forecast_throughput_samples_per_s"  # a measured run's forecast, and a forecast run's
LEVEL = 0.9  # the intervals' nominal coverage (split conformal)


def host_cpus() -> float:
    """The CPUs this process may run on (affinity; a cgroup quota below it wins)."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


def cores_per_rank(spec: RunSpec, cpus: float, one_machine_cpus: float | None = None) -> float:
    """The cores a rank really has: its threads, or its share of the machine where all the ranks
    ask for more than it holds. Emulated nodes (cluster=local) all share this host; nodes the fabric
    probe found on one machine (``one_machine_cpus``: launcher/forecast/fabric.py) share that one;
    elsewhere a node's ranks share what Slurm gave them (tasks x cpus_per_task)."""
    lay = spec.layout
    threads = max(1, lay.cpus_per_task)
    if spec.emulate_nodes:
        return min(float(threads), cpus / lay.world_size)
    if one_machine_cpus:
        return min(float(threads), one_machine_cpus / lay.world_size)
    return float(threads)


def collectives(spec: RunSpec, moved: dict[str, float], calls: dict[str, float]) -> tuple[Collective, ...]:
    """The cell's collectives with their groups and scopes, as its parallel layout says
    (contract.parallel.ParallelDims.group: hsdp gathers and reduce-scatters within a node and
    all-reduces its shard across nodes)."""
    dims = ParallelDims.of(spec.strategy, spec.layout)
    out = []
    for kind, size in moved.items():
        ranks, spans_nodes = dims.group(kind)
        scope = INTER if spans_nodes else INTRA
        out.append(Collective(kind, float(size), ranks, scope, float(calls.get(kind) or 1.0)))
    return tuple(out)


def work_of(spec: RunSpec, strategy: str, flops_per_sample: float, moved: dict[str, float],
            calls: dict[str, float], cpus: float, available: float = 1.0,
            one_machine_cpus: float | None = None) -> Work:
    """What one rank of ``spec`` does per step: ``moved`` the bytes per collective kind (theory);
    ``available`` the share of its cores other tenants left it (measured cells)."""
    train, lay = spec.train, spec.layout
    samples = train.batch_size * train.grad_accum_steps
    recompute = 4 / 3 if train.activation_checkpointing else 1.0  # forward runs twice: 4 of 3 units
    return Work(device="gpu" if lay.gpus_per_node else "cpu", precision=spec.precision.name.value,
                strategy=strategy, flops=flops_per_sample * samples * recompute, samples=samples,
                world_size=lay.world_size, threads=max(1, lay.cpus_per_task),
                cores=cores_per_rank(spec, cpus, one_machine_cpus),
                collectives=collectives(spec, moved, calls) if lay.world_size > 1 else (),
                available=available)


def moved_bytes(row: dict[str, Any]) -> dict[str, float]:
    """The bytes per step by collective kind that the row's strategy implies (the theory)."""
    return {k: v for k in metrics.COLLECTIVE_KINDS if (v := num(row.get(metrics.predicted_comm_bytes(k))))}


def measured_calls(row: dict[str, Any]) -> dict[str, float]:
    """Collectives per step by kind, where the anatomy counted them."""
    return {k: v for k in metrics.COLLECTIVE_KINDS if (v := num(row.get(metrics.comm_calls(k))))}


def observed(row: dict[str, Any], work: Work) -> Observed | None:
    """The row's window as the model reads it, or None without a throughput."""
    tput = throughput(row)
    if not tput:
        return None
    step_ms = 1000.0 * work.world_size * work.samples / tput
    comm, exposed, probe = (num(row.get(k)) for k in (COMM_TIME_MS, COMM_EXPOSED_MS, COMM_PROBE_STEP_TIME_MS))
    scale = step_ms / probe if probe else 1.0  # the profiled probe runs slower than the window
    return Observed(work, step_ms, None if comm is None else comm * scale,
                    None if exposed is None else exposed * scale)


# ---- leave-one-out ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One measured configuration and what the model knows of it."""

    label: str
    settings: dict[str, str]
    observed: Observed
    members: tuple[dict[str, Any], ...]  # its runs' rows


@dataclass(frozen=True)
class Checked:
    """A configuration forecast from the others, against its measurement."""

    point: Point
    predicted: float | None  # samples/s; None where the others gave no basis
    why_not: str = ""
    interval: tuple[float, float] | None = None
    coverage: float | None = None
    # The same forecast at the share of cores the point really had (known only after its run):
    # the model's own error, without the other tenants' load that moved between the runs.
    at_its_share: float | None = None

    @property
    def measured(self) -> float:
        return self.point.observed.work.world_size * self.point.observed.work.samples * 1000.0 / self.point.observed.step_ms

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else perfmodel.log_error(self.predicted, self.measured)

    @property
    def covered(self) -> bool | None:
        return None if self.interval is None else self.interval[0] <= self.measured <= self.interval[1]

    @property
    def error_at_its_share(self) -> float | None:
        return None if self.at_its_share is None else perfmodel.log_error(self.at_its_share, self.measured)


def series_keys(points: Sequence[Point]) -> dict[str, list[list[Point]]]:
    """{setting: its series}: groups of points equal in every other setting, by the one that varies."""
    keys = sorted({k for p in points for k in p.settings})
    found: dict[str, list[list[Point]]] = {}
    for key in keys:
        groups: dict[str, list[Point]] = {}
        for p in points:
            rest = repr(sorted((k, v) for k, v in p.settings.items() if k != key))
            groups.setdefault(rest, []).append(p)
        series = [g for g in groups.values() if len({p.settings.get(key) for p in g}) >= 2]
        if series:
            found[key] = series
    return found


def validates(points: Sequence[Point]) -> bool:
    return any(len(s) >= MIN_SERIES for series in series_keys(points).values() for s in series)


def leave_one_out(points: Sequence[Point], fit: Callable[[list[Observed]], perfmodel.Model] = perfmodel.fit,
                  prior_errors: Sequence[float] = ()) -> list[Checked]:
    """Each point forecast by a model of the others; its interval from the others' errors."""
    first = []
    for i, p in enumerate(points):
        others = [q.observed for j, q in enumerate(points) if j != i]
        try:
            model = fit(others)
            own = dataclasses.replace(model, available=p.observed.work.available)
            first.append(Checked(p, model.predict(p.observed.work).throughput_samples_per_s,
                                 at_its_share=own.predict(p.observed.work).throughput_samples_per_s))
        except perfmodel.CannotPredict as exc:
            first.append(Checked(p, None, str(exc)))
    out = []
    for i, c in enumerate(first):
        errors = [*prior_errors, *(o.error for j, o in enumerate(first) if j != i and o.error is not None)]
        spread = perfmodel.spread(errors, LEVEL)
        if c.predicted is None or spread is None:
            out.append(c)
            continue
        out.append(dataclasses.replace(c, interval=spread.interval(c.predicted), coverage=spread.coverage))
    return out


def summary(checked: Sequence[Checked]) -> dict[str, float]:
    """The parent run's figures: the median absolute error (as a share), the share of measurements
    inside their intervals, and how many points were forecast."""
    errors = [abs(math.expm1(c.error)) for c in checked if c.error is not None]
    covered = [c.covered for c in checked if c.covered is not None]
    out: dict[str, float] = {"forecast_points": float(len(errors))}
    own = [abs(math.expm1(e)) for c in checked if (e := c.error_at_its_share) is not None]
    if own:
        out["forecast_error_median_at_measured_cores"] = statistics.median(own)
    if errors:
        out["forecast_error_median"] = statistics.median(errors)
    if covered:
        out["forecast_interval_coverage"] = sum(covered) / len(covered)
    return out


# ---- the report's section -----------------------------------------------------------------------

def section(checked: Sequence[Checked], points: Sequence[Point], how: str, record: str) -> list[str]:
    """``## Forecasts checked``: the model's leave-one-out errors on this sweep, by series."""
    parts = ["## Forecasts checked", ""]
    if not validates(points):
        return [*parts, f"No series of {MIN_SERIES} or more configurations that differ in one setting (node counts, "
                        "batch sizes, model depths): nothing to check forecasts against. "
                        f"{record}", ""]
    parts += [f"Each configuration forecast from a model fitted on the others (leave-one-out; the model: "
              "docs/forecast.md in the project): throughput in samples/s, error = forecast / measured - 1, "
              f"interval = the {LEVEL:.0%} conformal interval from the other points' errors. A forecast assumes the "
              "median share of cores other tenants left the fitted cells; *at its cores* is the same model at the share "
              "the configuration really had (known only after its run): the model's own error, without the load "
              f"that moved between runs. {how}", "",
              "| configuration | measured | forecast | error | interval | inside | error at its cores |",
              "|---|---:|---:|---:|---:|---|---:|"]
    for c in checked:
        if c.predicted is None:
            parts.append(f"| {md_cell(c.point.label)} | {c.measured:.1f} | - | - | - | {md_cell(c.why_not)} | - |")
            continue
        low_high = f"{c.interval[0]:.1f}–{c.interval[1]:.1f}" if c.interval else "-"
        inside = "-" if c.covered is None else "yes" if c.covered else "**no**"
        parts.append(f"| {md_cell(c.point.label)} | {c.measured:.1f} | {c.predicted:.1f} | "
                     f"{math.expm1(c.error or 0.0):+.1%} | {low_high} | {inside} | "
                     f"{math.expm1(c.error_at_its_share or 0.0):+.1%} |")
    parts += ["", *by_series(checked, points), "", record, ""]
    return parts


def by_series(checked: Sequence[Checked], points: Sequence[Point]) -> list[str]:
    """Per setting that varies: the median absolute error and the intervals' coverage of its points."""
    errors = {id(c.point): c for c in checked}
    lines = ["| series (what varies) | points | median abs error | inside interval | median abs error at its cores |",
             "|---|---:|---:|---:|---:|"]
    for key, series in series_keys(points).items():
        members = [errors[id(p)] for s in series for p in s if errors[id(p)].error is not None]
        members = list({id(m): m for m in members}.values())
        if not members:
            continue
        med = statistics.median(abs(math.expm1(m.error or 0.0)) for m in members)
        covered = [m.covered for m in members if m.covered is not None]
        inside = f"{sum(covered)}/{len(covered)}" if covered else "-"
        own = statistics.median(abs(math.expm1(m.error_at_its_share or 0.0)) for m in members)
        lines.append(f"| {md_cell(key)} | {len(members)} | {med:.1%} | {inside} | {own:.1%} |")
    return lines


def point_settings(row: dict[str, Any]) -> dict[str, str]:
    """What a configuration measured, without the seed (runs and seeds are one configuration)."""
    return {k: v for k, v in settings(row).items() if k != "seed"}


# ---- a sweep's check ----------------------------------------------------------------------------

@dataclass
class SweepCheck:
    """What a sweep's report shows and logs of its forecasts checked."""

    section: list[str]
    figures: dict[str, float]  # the parent run's
    cell_figures: dict[str, dict[str, float]]  # per cell run id


@dataclass(frozen=True)
class Probes:
    """What a sweep's fabric probes tell the model (launcher/forecast/fabric.py): the links, and the
    CPUs of the one machine its nodes turned out to be (None: real nodes, or no probe)."""

    links: perfmodel.Fabric | None
    one_machine_cpus: float | None

    def fit(self, observed: Sequence[Observed]) -> perfmodel.Model:
        return perfmodel.fit(observed, self.links)


def probes_of(state: SweepState) -> Probes:
    found = fabric.read_sweep(state.path)
    return Probes(fabric.model_fabric(found), fabric.one_machine_cpus(found))


def points_of(state: SweepState, rows: Sequence[dict[str, Any]], cpus: float | None = None,
              probes: Probes | None = None) -> list[Point]:
    """The sweep's measured configurations (runs grouped) as model points."""
    cells = {c.name: c for c in state.cells}
    cpus = host_cpus() if cpus is None else cpus
    probes = probes or probes_of(state)
    out = []
    for unit in grouped(list(rows)):  # co-located cells too: each is read at the share of cores it had
        members = tuple(unit.get("_members", [unit]))
        try:
            spec = state.load_spec(cells[members[0]["cell"]])
        except (KeyError, OSError, ValueError, TypeError, StateError):
            continue  # a sweep copied without its specs: the model cannot tell what it ran
        # The worker's own count (its results), kept for the forecasts of this model's other cells; a
        # sweep from before it recorded one: counted here, on the meta device.
        model = resolved_model(spec.model, cuda=spec.layout.gpus_per_node > 0)
        flops = num(unit.get(FLOPS_PER_SAMPLE))
        if flops:
            fitcache.keep_flops_per_sample(model, flops)
        else:
            flops = fitcache.flops_per_sample(model)
        if not flops:
            continue
        foreign = num(unit.get(FOREIGN_CPU_SHARE))
        available = 1.0 - min(foreign, 0.95) if foreign is not None else 1.0
        work = work_of(spec, str(unit.get("strategy")), flops, moved_bytes(unit), measured_calls(unit), cpus, available,
                       probes.one_machine_cpus)
        found = observed(unit, work)
        if found is not None:
            out.append(Point(str(unit["cell"]), point_settings(unit), found, members))
    return out


def describe(model: perfmodel.Model) -> str:
    """The fitted model in words: compute per device and precision, the fabric, the overlap."""
    words = []
    for (device, precision), f in sorted(model.compute.items()):
        words.append(f"compute on {device} {precision}: {f.overhead_ms:.1f} ms + FLOPs at "
                     f"{f.flops_per_ms / 1e6:.3g} GFLOP/s per thread x threads^{f.gamma:.2f} ({f.points} point(s)"
                     + (f"; {f.note}" if f.note else "") + ")"
                     + "".join(f"; {t} thread(s) on their own: {o:.1f} ms + FLOPs at {r / 1e6:.3g} GFLOP/s"
                               for t, o, r in f.per_threads))
    if model.fabric is not None:
        scopes: dict[tuple[str, perfmodel.Link], list[str]] = {}  # a link that stands for several scopes: once
        for (k, s), link in sorted(model.fabric.links.items()):
            scopes.setdefault((k, link), []).append(s)
        links = "; ".join(f"{k}/{','.join(s)}: alpha {link.alpha_ms:.3g} ms, beta {link.bytes_per_ms / 1e6:.3g} GB/s"
                          for (k, link), s in scopes.items())
        cal = f", x{model.fabric.calibration:.2f} as measured in training" if model.fabric.calibration != 1 else ""
        words.append(f"communication: {links}{cal} ({model.fabric.source})")
    if model.available < 1:
        words.append(f"other tenants left {model.available:.0%} of the cores (median over the cells; forecasts "
                     "assume the same)")
    if model.overlap:
        words.append("overlap measured: " + ", ".join(f"{k if k != perfmodel.ANY else 'all'} {v:.0%}"
                                                        for k, v in sorted(model.overlap.items())))
    return "The model of the whole sweep: " + "; ".join(words) + "." if words else "No model: nothing measured."


def check(state: SweepState, rows: Sequence[dict[str, Any]], key: str, keep: bool = True) -> SweepCheck:
    """Leave-one-out over the sweep's configurations, kept in the cluster's record (``keep``: when
    every cell has ended), as the report's section and MLflow figures."""
    root = state.path.parent
    probes = probes_of(state)
    points = points_of(state, rows, probes=probes)
    if not validates(points):
        return SweepCheck(section([], points, "", forecastrecord.said(forecastrecord.errors(root, key), key)), {}, {})
    prior = forecastrecord.errors(root, key, without_sweep=state.name)
    checked = leave_one_out(points, probes.fit, prior_errors=[e["log_error"] for e in prior])
    if keep:
        forecastrecord.add(root, key, state.name, [
            {"cell": c.point.label, "kind": "loo", "predicted": c.predicted, "measured": c.measured} for c in checked])
    said = forecastrecord.said(forecastrecord.errors(root, key), key)
    how = describe(probes.fit([p.observed for p in points]))
    cell_figures = {}
    for c in checked:
        if c.predicted is None:
            continue
        figures = {FORECAST_METRIC: c.predicted, "forecast_error": math.expm1(c.error or 0.0)}
        for m in c.point.members:
            if m.get("run_id"):
                cell_figures[str(m["run_id"])] = figures
    return SweepCheck(section(checked, points, how, said), summary(checked), cell_figures)
