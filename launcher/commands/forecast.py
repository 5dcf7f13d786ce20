"""``python -m launcher.forecast SWEEP_DIR key=value,... [--verify]``: cells that were not run,
forecast from a sweep that was.

The sweep's measured configurations fit the performance model (launcher/forecast/perfmodel.py, read
from the sweep by launcher/forecast/inputs.py). The cells to forecast are the sweep's own command
with the given settings replacing its own (``nodes=4,8,16``, ``batch_size=16,32``,
``model=gpt2-small``, ``model.params.n_layer=24``), composed and analysed as a launch would be
(the fit on the meta device, the bytes of launcher/plan/traffic.py) but asking no cluster: a grid
larger than any cluster known here can be forecast. Each forecast carries the interval of the
forecast errors checked on this cluster (launcher/forecast/forecastrecord.py) and says how far they
have been off. ``--verify`` runs the largest forecast cell once and sets its forecast against the
measurement (the error joins the record).
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path

from contract import records
from contract.metrics import THROUGHPUT_SAMPLES_PER_S
from launcher.commands.command import FAILURE_EXIT, Command, Parser, Refused
from launcher.forecast import forecastrecord, inputs, perfmodel
from launcher.forecast.cells import Basis, Forecast, basis, forecast_cells, notes, row_of, throughput_of
from launcher.plan import fit
from launcher.plan.cell import Cell
from launcher.plan.grid import SweepError
from launcher.report.collect import collect
from launcher.report.noisefloor import floor_key
from launcher.report.rows import md_cell
from launcher.state import SweepState

HELP = """\
usage: python -m launcher.forecast SWEEP_DIR [key=value,... ...] [--verify]

Forecast throughput, step time, scaling efficiency, comm share and memory fit of cells that were not
run, from a sweep that was, with the interval of the forecast errors checked on this cluster.

  key=value,...   settings replacing the sweep's own (a grid), e.g. nodes=4,8,16 batch_size=16,32
                  model=gpt2-small model.params.n_layer=8,16
  --verify        run the largest forecast cell once and report forecast against measurement
  -h, --help      this help

example:
  python -m launcher.forecast outputs/2026-11-24_22-31-46 nodes=4,8,16
"""


FORECAST_ONLY = "limits.local_ranks_per_core=1000000"
# Exit codes (docs/troubleshooting.md): 0 forecast, 2 refused, 1 asked and nothing could be forecast
# (a failure to do what was asked, not a refusal of the input: the table says why for each cell).
NOTHING_FORECAST = FAILURE_EXIT


class ForecastError(Exception):
    """A forecast that cannot be made, with the fix in its message."""


class ForecastCommand(Command):
    name = "forecast"
    nothing = "nothing was forecast"
    help_text = HELP

    def add_arguments(self, parser: Parser) -> None:
        parser.add_argument("--verify", action="store_true")
        parser.add_argument("words", nargs="*", metavar="SWEEP_DIR key=value,...")

    def run(self, args: argparse.Namespace) -> int:
        dirs = [w for w in args.words if "=" not in w]
        if len(dirs) != 1:
            raise Refused(f"{' '.join(dirs) or 'no sweep directory'}: give one sweep directory (the key=value words "
                          f"are settings); nothing was forecast. Fix: see python -m launcher.forecast --help.")
        state = SweepState.load(Path(dirs[0]))
        try:
            made = forecast(state, [w for w in args.words if "=" in w])
        except (SweepError, ForecastError) as exc:
            raise Refused(str(exc)) from None
        print(render(*made))
        if not any(f.prediction for f in made[0]):
            print(f"error: nothing could be forecast: none of the {len(made[0])} cell(s) asked for has a forecast (the "
                  "table says why for each). Fix: forecast settings the sweep's measurements reach, or measure one "
                  "cell of the kind asked first (a multi-rank cell, a fabric probe: docs/forecast.md).",
                  file=sys.stderr)
            return NOTHING_FORECAST
        return verify(state, made[0], made[2]) if args.verify else 0


main = ForecastCommand.main


def forecast(state: SweepState, overrides: list[str]) -> tuple[list[Forecast], perfmodel.Model, Basis, list[str],
                                                              list[inputs.Point]]:
    """(each target cell's forecast, the model, what its intervals rest on, notes, the measured points)."""
    cells = target_cells(state, overrides)  # the asked settings checked first: a refusal names them
    probes = inputs.probes_of(state)
    points = inputs.points_of(state, collect(state), probes=probes)
    if not points:
        raise ForecastError(f"{state.sweep_dir} has no measured configuration the model can read (cells done, with "
                            "their spec.json). Fix: forecast from a sweep whose cells finished.")
    from launcher import preflight

    made, model, cpus = forecast_cells(cells, preflight.analyse(cells), points, probes)
    return made, model, basis(state, points, probes), notes(made, cpus), points


def target_cells(state: SweepState, overrides: list[str]) -> list[Cell]:
    """The sweep's command with ``overrides`` replacing its settings of the same keys, one run each."""
    from launcher.plan import grid, planner
    from launcher.plan.schema import AUTO_ONLY, SEARCH_ONLY

    config_dirs, own = _command(state.argv)
    keys = {_key(o) for o in overrides}
    # One run each: runs=auto and the settings read only with it (runs_min, baseline, ...) go with it.
    kept = [o for o in own if _key(o) not in keys | {"runs", "sweep_dir", "wait", *AUTO_ONLY, *SEARCH_ONLY}]
    extra = grid.search_path(config_dirs)
    # A forecast runs nothing: the ranks-per-core bound of the local cluster (limits.local_ranks_per_core)
    # does not apply to it, and --verify drops this override again before it runs a cell.
    points, swept = grid.expand([*kept, *overrides, "runs=1", FORECAST_ONLY], True, extra)
    cells = planner.plan(grid.compose(points, swept, extra=extra))
    shown = {*swept, *keys}  # named by what the sweep swept and what the forecast sets
    for cell in cells:
        cell.name = " ".join(o for o in cell.overrides if _key(o) in shown) or cell.name
    return cells


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(config directories, overrides) of a sweep's recorded command line."""
    dirs, overrides = [], []
    it = iter(argv[1:])
    for arg in it:
        if arg in ("--config-dir", "-cd"):
            dirs.append(next(it, ""))
        elif arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
        elif "=" in arg and not arg.startswith("-"):
            overrides.append(arg)
    return dirs, overrides


# ---- what the terminal shows ----------------------------------------------------------------------

def render(made: list[Forecast], model: perfmodel.Model, basis: Basis, notes: list[str],
           points: list[inputs.Point]) -> str:
    lines = ["| cell | ranks | samples/s (interval) | samples/s/dev | step ms | scaling eff | comm share | "
             "state+act/rank | fits | measured |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for f in made:
        lines.append(_line(f, made, basis.spread, points))
    return "\n".join([*lines, "", "Recommendation at each scale (from the forecasts):", *recommend(made, basis.ratio),
                      "", basis.said, inputs.describe(model), *notes])


def _line(f: Forecast, made: list[Forecast], spread: perfmodel.Spread | None, points: list[inputs.Point]) -> str:
    memory = fit.human(f.state.peak) if f.state else "-"
    fits = _fits(f)
    measured = f"{f.measured:.1f}" if f.measured else "-"
    name = md_cell(f.cell.name)
    if f.prediction is None:
        return f"| {name} | {f.cell.world_size} | - | - | - | - | - | {memory} | {fits} | {measured} |  ({md_cell(f.why_not)})"
    p = f.prediction
    interval = "" if spread is None else " ({:.1f}–{:.1f})".format(*spread.interval(p.throughput_samples_per_s))
    eff = _scaling(f, made, points)
    return (f"| {name} | {f.cell.world_size} | {p.throughput_samples_per_s:.1f}{interval} | "
            f"{p.throughput_samples_per_s / f.cell.world_size:.1f} | {p.step_ms:.1f} | "
            f"{'-' if eff is None else f'{eff:.0%}'} | {p.comm_share:.0%} | {memory} | {fits} | {measured} |")


def _fits(f: Forecast) -> str:
    """Whether the state and activations fit a GPU's memory (where known); CPU cells: not checked."""
    limit = f.cell.cluster.gpu_mem_gib
    if f.state is None or not f.cell.layout.gpus_per_node or not limit:
        return "-"
    return "yes" if f.state.peak <= limit * fit.GIB else f"**no** (> {limit:g} GiB)"


def _scaling(f: Forecast, made: list[Forecast], points: list[inputs.Point]) -> float | None:
    """Per-device throughput over that of the same settings at the fewest ranks: measured in the
    sweep where it ran, else forecast."""
    if f.prediction is None:
        return None
    mine = _but_nodes(inputs.point_settings(row_of(f.cell)))
    peers = [(p.observed.work.world_size, throughput_of(p.observed)) for p in points if _but_nodes(p.settings) == mine]
    peers += [(g.cell.world_size, g.prediction.throughput_samples_per_s) for g in made
              if g.prediction and _but_nodes(inputs.point_settings(row_of(g.cell))) == mine]
    ranks, base = min(peers)
    if ranks == f.cell.world_size:
        return None
    return (f.prediction.throughput_samples_per_s / f.cell.world_size) / (base / ranks)


def _but_nodes(settings: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in settings.items() if k != "nodes"}


def recommend(made: list[Forecast], ratio_spread: perfmodel.Spread | None) -> list[str]:
    """Per model and world size: the fastest forecast, and whether the next one is apart: their
    forecast ratio beyond how far forecast ratios on this cluster have been off (``ratio_spread``;
    one model forecasts both, so their errors are not independent), or cannot be told from it."""
    out = []
    groups: dict[tuple[str, int], list[Forecast]] = {}
    for f in made:
        if f.prediction is not None:
            groups.setdefault((f.cell.model, f.cell.world_size), []).append(f)
    for (model, ranks), group in sorted(groups.items(), key=lambda kv: kv[0][1]):
        ranked = sorted(group, key=lambda f: -(f.prediction.throughput_samples_per_s if f.prediction else 0.0))
        best = ranked[0]
        assert best.prediction is not None
        said = (f"- **{ranks} rank(s)** ({model}): {'fastest ' if len(ranked) > 1 else ''}"
                f"**{md_cell(best.cell.name)}** at {best.prediction.throughput_samples_per_s:.1f} samples/s")
        if len(ranked) > 1 and ranked[1].prediction is not None:
            ratio = ranked[1].prediction.throughput_samples_per_s / best.prediction.throughput_samples_per_s
            apart = ratio_spread is not None and ratio < math.exp(-ratio_spread.half_width)
            band = f" (forecast ratios here: ×/÷{math.exp(ratio_spread.half_width):.2f})" if ratio_spread else ""
            said += (f"; next {md_cell(ranked[1].cell.name)} at {ratio:.2f}×, "
                     + (f"apart beyond the error of forecast ratios{band}." if apart else
                        f"within the error of forecast ratios{band}: run both to decide."))
        out.append(said + ("" if len(ranked) > 1 else "."))
    return out or ["- nothing could be forecast."]


# ---- --verify -----------------------------------------------------------------------------------

def verify(state: SweepState, made: list[Forecast], spread_basis: Basis) -> int:
    """Run the largest forecast cell once (a sweep of its own beside this one), then set its forecast
    against the measurement and add the error to this cluster's record."""
    from launcher import preflight, sweep
    from launcher.plan import grid, planner

    candidates = [f for f in made if f.prediction and f.work and f.measured is None]
    if not candidates:
        print("--verify: every forecast cell was measured already, or none could be forecast; nothing to run.")
        return 0
    target = max(candidates, key=lambda f: (f.cell.world_size, f.work.flops if f.work else 0.0))
    assert target.prediction is not None
    out = records.new_folder(state.path.parent, f"verify-{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}")
    command = [*(o for o in target.cell.overrides if o != FORECAST_ONLY), f"sweep_dir={out}"]
    print(f"\n--verify: running {target.cell.name} once -> {out}", flush=True)
    points, swept = grid.expand(command, False)
    cells = planner.plan(grid.compose(points, swept))
    code = sweep.run(cells, ["python -m launcher", *command], preflight.check(cells))
    ran = SweepState.load(out)
    measured = [r for r in collect(ran) if r.get(THROUGHPUT_SAMPLES_PER_S)]
    if not measured:
        print(f"--verify: the cell left no measurement (exit {code}); see {out}.", file=sys.stderr)
        return 1
    value = float(measured[0][THROUGHPUT_SAMPLES_PER_S])
    predicted = target.prediction.throughput_samples_per_s
    key = floor_key(state)
    forecastrecord.add(state.path.parent, key, ran.name, [{"cell": target.cell.name, "kind": "verify",
                                                           "predicted": predicted, "measured": value}])
    inside = ""
    if spread_basis.spread is not None:
        low, high = spread_basis.spread.interval(predicted)
        inside = f"; interval {low:.1f}–{high:.1f}: {'inside' if low <= value <= high else 'OUTSIDE'}"
    print(f"--verify: {target.cell.name}: forecast {predicted:.1f} samples/s, measured {value:.1f} "
          f"({predicted / value - 1:+.1%}{inside}). Kept in {forecastrecord.RECORD_FILE}.")
    return 0
