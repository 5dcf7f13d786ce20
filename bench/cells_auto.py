"""``cells=auto`` against the full grid, replayed: how often the search names another best configuration
than running every cell would, and how many launches it saves (docs/deciding.md, *Searching the grid*).

    python -m bench.cells_auto --record SWEEP [SWEEP ...]   # measured grids added to tests/data/search_grids.json
    python -m bench.cells_auto [--replays 500] [--seed 1]    # the simulation

The grids, both kinds said in the output:

* **measured**: sweeps run on this machine (``--record``): every configuration's measured window
  and the leave-one-out errors of the performance model on it (launcher/forecast/inputs.py);
* **from the model**: a GPU grid (2 strategies x 2 precisions x 3 batch sizes x 4 node counts of 8
  GPUs, 48 configurations) on the nominal node of launcher/forecast/searchsim.py, each configuration
  off the model by an error drawn from the recorded leave-one-out errors.

Each replay draws run-to-run noise for every configuration (the mean of ``--runs`` runs, each a
recorded run's throughput over its configuration's mean, tests/data/run_noise.json) and a cluster
record (``--record-size`` errors drawn from the recorded ones, leave-one-grid-out for measured grids);
the full grid's best at each scale is the best of all its noisy values, the search's the best of
those it ran (launcher/forecast/searchsim.py, replay). A different best is counted per replay (any
scale) and per scale, with how much slower the search's pick is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from launcher.forecast import search, searchsim
from launcher.forecast.perfmodel import INTER, INTRA, Collective, Observed, Work

ROOT = Path(__file__).resolve().parent.parent
GRIDS = ROOT / "tests" / "data" / "search_grids.json"
RUN_NOISE = ROOT / "tests" / "data" / "run_noise.json"
FLOPS_GPT2_SMALL = 6 * 124e6 * 1024  # training FLOPs of one 1024-token sample
PARAM_BYTES = 124e6 * 4
QUIET_MEDIAN = math.log(1.067)  # docs/forecast.md: the batch series' median leave-one-out error


def record(sweeps: list[Path], out: Path | None = None) -> dict[str, Any]:
    """Each sweep's configurations (shape and measured window) and the model's leave-one-out errors."""
    from launcher.forecast import cellsearch, inputs
    from launcher.forecast.cells import row_of
    from launcher.plan.cell import configuration
    from launcher.report.collect import collect
    from launcher.state import SweepState

    out = out or GRIDS
    # The grids recorded before from other sweeps are kept: the simulation replays every one.
    kept = _recorded(out)

    grids = []
    for path in sweeps:
        state = SweepState.load(path)
        probes = inputs.probes_of(state)
        points = inputs.points_of(state, collect(state), probes=probes)
        shapes = {s.name: s for s in cellsearch.shapes_of(state.cells, state.load_spec)}
        configurations = {}
        for cell in state.cells:
            point = next((p for p in points if p.settings == inputs.point_settings(row_of(cell))), None)
            if point is not None:
                configurations[configuration(cell.name)] = {"shape": dataclasses.asdict(shapes[configuration(cell.name)]),
                                                            "observed": dataclasses.asdict(point.observed)}
        errors = [c.error for c in inputs.leave_one_out(points, probes.fit) if c.error is not None]
        grids.append({"sweep": str(path), "command": " ".join(state.argv), "configurations": configurations,
                      "loo_errors": errors})
    recorded_now = {g["sweep"] for g in grids}
    grids = [g for g in kept if g["sweep"] not in recorded_now] + grids
    data = {"what": "measured grids for the cells=auto simulation: each configuration's window as the performance "
                    "model reads it, and the model's leave-one-out errors on the grid", "grids": grids}
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


class GridsError(ValueError):
    """The recorded grids' file cannot be read; the message says what to do."""


def _recorded(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    try:
        grids = json.loads(out.read_text())["grids"]
        if isinstance(grids, list) and all(isinstance(g, dict) and isinstance(g.get("sweep"), str) for g in grids):
            return grids
    except (ValueError, KeyError, TypeError):
        pass
    raise GridsError(f"{out} is not a record of measured grids, and recording into it would lose the grids it "
                     f"held. Fix: restore it (git checkout {out.name} in its folder), then record again.")


def _observed(plain: dict[str, Any]) -> Observed:
    work = dict(plain["work"])
    work["collectives"] = tuple(Collective(**c) for c in work["collectives"])
    return Observed(Work(**work), plain["step_ms"], plain.get("comm_ms"), plain.get("exposed_ms"))


def run_noise() -> list[float]:
    data = json.loads(RUN_NOISE.read_text())
    return [v for c in data["configurations"].values() for v in c["throughput"]]


def model_grid() -> tuple[list[search.Shape], dict[str, Work]]:
    """48 GPU configurations of a GPT-2-small-sized model on nodes of 8 GPUs."""
    shapes, works = [], {}
    for strategy in ("ddp", "fsdp"):
        for precision in ("fp32", "bf16"):
            for batch in (4, 8, 16):
                for nodes in (1, 2, 4, 8):
                    world = 8 * nodes
                    scope = INTER if nodes > 1 else INTRA
                    moved = ([Collective("all_reduce", PARAM_BYTES, world, scope, 4)] if strategy == "ddp" else
                             [Collective("all_gather", 2 * PARAM_BYTES, world, scope, 24),
                              Collective("reduce_scatter", PARAM_BYTES, world, scope, 12)])
                    name = f"strategy={strategy} precision={precision} batch_size={batch} nodes={nodes}"
                    works[name] = Work("gpu", precision, strategy, FLOPS_GPT2_SMALL * batch, batch, world,
                                       collectives=tuple(moved))
                    shapes.append(search.Shape(name, "gpt2-small", "gpu", precision, strategy, world, nodes,
                                               FLOPS_GPT2_SMALL * batch))
    return shapes, works


@dataclasses.dataclass
class Tally:
    replays: int = 0
    different: int = 0
    scales: int = 0
    scales_different: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    ran: list[float] = dataclasses.field(default_factory=list)  # share of the grid's launches run
    rounds: list[int] = dataclasses.field(default_factory=list)

    def add(self, r: searchsim.Replayed, grid: int) -> None:
        self.replays += 1
        self.different += bool(r.different)
        self.scales += len(r.full_best)
        self.scales_different += len(r.different)
        self.losses += [r.loss(s) for s in r.different]
        self.ran.append(len(r.outcome.ran) / grid)
        self.rounds.append(r.outcome.rounds)

    def line(self, source: str, grid: int) -> str:
        loss = f"{statistics.median(self.losses):.1%} median, {max(self.losses):.1%} most" if self.losses else "-"
        return (f"| {source} | {grid} | {self.replays} | {self.different / self.replays:.1%} | "
                f"{self.scales_different / self.scales:.1%} | {loss} | {statistics.fmean(self.ran):.0%} | "
                f"{1 - statistics.fmean(self.ran):.0%} | {statistics.fmean(self.rounds):.1f} |")


def simulate(replays: int, seed: int, runs: int = 3, record_size: int = 20,
             data: dict[str, Any] | None = None) -> list[str]:
    """The table's rows: each measured grid, then the grid from the model."""
    data = data if data is not None else {"grids": _recorded(GRIDS)}
    noise, rng = run_noise(), random.Random(seed)
    errors = [e for g in data["grids"] for e in g["loo_errors"]]
    rows = []
    for i, g in enumerate(data["grids"]):
        grid = {n: _observed(c["observed"]) for n, c in g["configurations"].items()}
        shapes = [search.Shape(**c["shape"]) for c in g["configurations"].values()]
        others = [e for j, o in enumerate(data["grids"]) if j != i for e in o["loo_errors"]] or g["loo_errors"]
        tally = Tally()
        for _ in range(replays):
            record = [rng.choice(others) for _ in range(record_size)] if others else []
            tally.add(searchsim.replay(shapes, grid, rng, noise, runs, record), len(grid))
        rows.append(tally.line(f"measured: {Path(g['sweep']).name} ({len(g['loo_errors'])} LOO errors)", len(grid)))
    shapes, works = model_grid()
    # The recorded errors as they are, and scaled to the median of the checked series of a quiet
    # machine (docs/forecast.md, Checked on this machine: 3.7% to 11.3%, 6.7% the batch series).
    median = statistics.median(abs(e) for e in errors) if errors else 0.0
    quiet = [e * QUIET_MEDIAN / median for e in errors] if median else []
    for pool, source in ((errors, f"from the model, errors drawn from the {len(errors)} recorded LOO errors"),
                         (quiet, f"from the model, the same errors scaled to a {QUIET_MEDIAN:.1%} median")):
        if not pool:
            continue
        tally = Tally()
        for _ in range(replays):
            grid = searchsim.observed_grid(works, searchsim.nominal(), {n: rng.choice(pool) for n in works})
            record = [rng.choice(pool) for _ in range(record_size)]
            tally.add(searchsim.replay(shapes, grid, rng, noise, runs, record), len(works))
        rows.append(tally.line(source, len(works)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cells_auto", description=__doc__.splitlines()[0])
    p.add_argument("--record", nargs="+", metavar="SWEEP", help="measured sweep directories, added to " + str(GRIDS))
    p.add_argument("--replays", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=3, help="runs per configuration (their mean is its value)")
    p.add_argument("--record-size", type=int, default=20, help="checked forecast errors in the cluster's record")
    args = p.parse_args(argv)
    if args.record:
        from launcher.state import StateError

        try:
            added = record([Path(s) for s in args.record])["grids"][-len(args.record):]
        except (StateError, GridsError) as exc:  # nothing is written: everything is read first
            print(f"python -m bench.cells_auto --record: {exc}", file=sys.stderr)
            return 2
        for g in added:
            off = [abs(math.expm1(e)) for e in g["loo_errors"]]
            print(f"{g['sweep']}: {len(g['configurations'])} configuration(s), leave-one-out off by "
                  f"{statistics.median(off) if off else float('nan'):.1%} (median)")
        return 0
    try:
        data = {"grids": _recorded(GRIDS)}
    except GridsError as exc:
        print(f"python -m bench.cells_auto: {exc}", file=sys.stderr)
        return 2
    print("| grid | configurations | replays | different best (any scale) | per scale | search's pick slower by | "
          "launches run | saved | rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in simulate(args.replays, args.seed, args.runs, args.record_size, data):
        print(row, flush=True)
    print(f"(seed {args.seed}; {args.runs} runs per configuration, run noise from {RUN_NOISE.name}; a record of "
          f"{args.record_size} checked forecast errors per replay; level {search.LEVEL:.0%}, default allowance "
          f"±{math.expm1(search.DEFAULT_ERROR):.0%} as {search.DEFAULT_ENTRIES} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
