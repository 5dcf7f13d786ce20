"""``cells=auto`` replayed on grids whose values are known: the simulation's replays
(bench/cells_auto.py) and ``--plan``'s expected cost of a search, with the rule of
launcher/forecast/search.py and the performance model of launcher/forecast/perfmodel.py fitted
round by round on the configurations "measured" so far. Pure arithmetic (no files, no torch).

A replay's grid is either measured (each configuration's observed window, from a real sweep) or
made from a model (:func:`nominal`): each configuration's value is the model's, off by an error
drawn from recorded forecast errors (the cluster's misfit), and each "measurement" carries run-to-run
noise drawn from recorded runs. The full grid's best at each scale is the best of all its measured
values; the search's best, the best of the configurations it ran.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.forecast import perfmodel, search
from launcher.forecast.perfmodel import ANY, INTER, INTRA, Fabric, Link, Observed, Work


def nominal() -> perfmodel.Model:
    """A stated node, for a grid with nothing measured yet: GPUs at 400 TFLOP/s in bf16 and 200 in
    fp32 (about 40% of an H100's dense peak) plus 5 ms a step; 150 GB/s within a node, 40 GB/s
    across; CPU ranks at 20 GFLOP/s a thread over 1 GB/s; 60% of DDP's communication and 50% of
    the rest hidden. Only the ratios between configurations steer a search."""
    compute = {("gpu", "bf16"): perfmodel.ComputeFit(5.0, 4e11, 1.0, 0), ("gpu", "fp32"): perfmodel.ComputeFit(5.0, 2e11, 1.0, 0),
               ("gpu", "fp16"): perfmodel.ComputeFit(5.0, 4e11, 1.0, 0), ("cpu", "fp32"): perfmodel.ComputeFit(10.0, 2e7, 1.0, 0),
               ("cpu", "bf16"): perfmodel.ComputeFit(10.0, 1.5e7, 1.0, 0), ("cpu", "fp16"): perfmodel.ComputeFit(10.0, 1e7, 1.0, 0)}
    links = {(ANY, INTRA): Link(0.02, 1.5e8), (ANY, INTER): Link(0.05, 4e7)}
    return perfmodel.Model(compute, Fabric(links, "nominal"), {"ddp": 0.6, ANY: 0.5})


@dataclass(frozen=True)
class Replayed:
    """One replay: the search's outcome, the full grid's best per scale, and its launches."""

    outcome: search.Outcome
    full_best: dict[tuple[str, int], str]
    measured: dict[str, float]

    @property
    def different(self) -> list[tuple[str, int]]:
        """The scales whose best the search named differently from the full grid."""
        return [s for s, name in self.full_best.items() if self.outcome.best.get(s) != name]

    def loss(self, scale: tuple[str, int]) -> float:
        """How much slower the search's best is than the full grid's at ``scale`` (0: the same)."""
        return 1 - self.measured[self.outcome.best[scale]] / self.measured[self.full_best[scale]]


def observed_grid(works: dict[str, Work], model: perfmodel.Model, misfit: dict[str, float]) -> dict[str, Observed]:
    """Each configuration's window as ``model`` gives it, its step off by ``misfit`` (ln forecast /
    measured, as a recorded error: the measured step is the model's times e^error)."""
    out = {}
    for name, work in works.items():
        p = model.predict(work)
        f = math.exp(misfit.get(name, 0.0))
        out[name] = Observed(work, p.step_ms * f, p.comm_ms * f if work.world_size > 1 else None,
                             p.exposed_ms * f if work.world_size > 1 else None)
    return out


def replay(shapes: Sequence[search.Shape], grid: dict[str, Observed], rng: random.Random,
           run_noise: Sequence[float] = (), runs: int = 1, record: Sequence[float] = (),
           cells_max: int | None = None, level: float = search.LEVEL) -> Replayed:
    """The search and the full grid on one draw of ``grid``: each configuration measured once per
    replay as the mean of ``runs`` runs, each run off by a factor drawn from ``run_noise``
    (relative throughputs of recorded runs); the model refitted on what the search measured."""
    factor = {name: sum(rng.choice(run_noise) if run_noise else 1.0 for _ in range(runs)) / runs for name in grid}
    drawn = {name: dataclasses.replace(o, step_ms=o.step_ms / factor[name]) for name, o in grid.items()}
    value = {name: 1000.0 * o.work.world_size * o.work.samples / o.step_ms for name, o in drawn.items()}

    def forecast(measured: list[str]) -> dict[str, float | None]:
        model = perfmodel.fit([drawn[n] for n in measured])
        out: dict[str, float | None] = {}
        for name, o in drawn.items():
            try:
                out[name] = model.predict(dataclasses.replace(o.work, available=1.0)).throughput_samples_per_s
            except perfmodel.CannotPredict:
                out[name] = None
        return out

    outcome = search.replay(shapes, value.__getitem__, forecast, record, cells_max, level)
    full: dict[tuple[str, int], str] = {}
    for s in shapes:
        if s.scale not in full or value[s.name] > value[full[s.scale]]:
            full[s.scale] = s.name
    return Replayed(outcome, full, value)


def expected(shapes: Sequence[search.Shape], works: dict[str, Work], errors: Sequence[float], replays: int = 40,
             seed: int = 1, cells_max: int | None = None) -> list[Replayed]:
    """Searches of a grid not measured yet, on the nominal model (:func:`nominal`) with each
    configuration off by an error drawn from ``errors`` (the default allowance where none): what
    ``--plan cells=auto`` expects it to run."""
    rng = random.Random(seed)
    pool = list(errors) or [e * search.DEFAULT_ERROR for e in (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)]
    model = nominal()
    out = []
    for _ in range(replays):
        grid = observed_grid(works, model, {name: rng.choice(pool) for name in works})
        out.append(replay(shapes, grid, rng, record=errors, cells_max=cells_max))
    return out
