"""``cells=auto``: the rule that searches a grid instead of sweeping it, in plain functions.

Pure arithmetic over names and numbers (no files, no torch): the live search
(launcher/forecast/cellsearch.py), ``--plan`` (its expected cost) and the simulation
(bench/cells_auto.py) call the same functions.

    pilot: the fewest configurations the performance model can be fitted on (:func:`pilot`)
      -> every configuration not run forecast, with its interval (launcher/forecast/perfmodel.py)
      -> run (:func:`choose`): those whose interval reaches the best at their scale (same model and
         world size: measured or forecast), and those the model cannot forecast
      -> refit on everything measured, the errors of this round's forecasts added -> ...
      -> stop when every scale's best is measured and every other configuration of that scale is
         measured or pruned, or when cells_max or the wall-time budget is spent.

**Pruned** is a configuration whose forecast, times the interval's upper factor ``e^h``, stays below
the best *measured* configuration of its scale. ``h`` is the ``LEVEL`` (95%) split-conformal quantile
of the absolute log errors of checked forecasts (the cluster's record and this search's own,
launcher/forecast/forecastrecord.py), pooled with a default allowance as a prior (:func:`band`). The best of a
scale is lost only when the truly best configuration's forecast fell short of it by more than
``h``: one forecast erring low beyond a two-sided 95% band, at most 2.5% when errors are symmetric
and exchangeable with the recorded ones, whichever and however many others were pruned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

LEVEL = 0.95  # the intervals' coverage: a forecast errs low beyond them at most (1 - LEVEL) / 2
# Before a cluster has a record, forecasts are taken to err up to 25% (the leave-one-out errors of
# docs/forecast.md reach 11% median, their largest 25-46% before the model read a rank's cores),
# worth DEFAULT_ENTRIES checked forecasts: a thin record stays near it, a long one outweighs it.
DEFAULT_ERROR = math.log(1.25)
DEFAULT_ENTRIES = 4
# Each device's precisions, the one it computes fastest in first: the pilot takes its extra points
# (the multi-rank configurations, the largest world size) in it, since the other precisions' are
# forecast from theirs. CPUs without bf16 matrix units emulate bf16 and fp16 (on this project's test
# machine bf16 steps took 10 to 20 times fp32's); GPUs run them on tensor cores at twice fp32's rate.
FAST_FIRST = {"cpu": ("fp32", "bf16", "fp16"), "gpu": ("bf16", "fp16", "fp32")}

# The settings the performance model reads (the rest of a grid's swept settings it cannot tell apart).
MODELLED = ("strategy", "precision", "nodes", "batch_size", "grad_accum_steps", "activation_checkpointing", "model",
            "model.", "cluster.tasks_per_node", "cluster.gpus_per_node", "cluster.cpus_per_task", "seed", "runs",
            "cells", "cells_max", "cells_budget_min", "runs_min", "runs_max", "runs_budget_min", "sweep_dir", "wait",
            "tracking.", "output_root", "steps", "warmup_steps", "repeats", "limits.")


@dataclass(frozen=True)
class Shape:
    """A configuration (grid point) as the search sees it."""

    name: str
    model: str  # the model and its parameters: configurations of one scale share it
    device: str
    precision: str
    strategy: str
    world_size: int
    nodes: int
    size: float  # work per rank per step (FLOPs, else samples): orders the cheap before the costly
    unmodelled: str = ""  # a swept setting the model does not read ("" none)

    @property
    def scale(self) -> tuple[str, int]:
        return self.model, self.world_size


def unmodelled(swept: Sequence[str]) -> list[str]:
    """The swept settings the performance model cannot tell apart."""
    return [k for k in swept if not any(k == m or (m.endswith(".") and k.startswith(m)) for m in MODELLED)]


def pilot(shapes: Sequence[Shape]) -> list[tuple[str, str]]:
    """(name, why) of the fewest configurations the model can be fitted on for every model and device:
    the cheapest of each strategy and precision; a second workload per device and precision (the
    overhead beside the rate); the cheapest multi-rank configuration of each strategy (its
    communication and overlap); and the largest world size (the fabric's second point). Cheapest:
    the fewest ranks, then the device's fastest precision (FAST_FIRST), then the least work."""
    chosen: dict[str, str] = {}

    def take(group: list[Shape], key: Callable[[Shape], tuple], why: str) -> None:
        if group:
            best = min(group, key=key)
            chosen.setdefault(best.name, why)

    cheap = lambda s: (s.world_size, _precision_rank(s), s.size, s.name)  # noqa: E731
    for model, device, precision, strategy in sorted({(s.model, s.device, s.precision, s.strategy) for s in shapes}):
        take([s for s in shapes if (s.model, s.device, s.precision, s.strategy) == (model, device, precision, strategy)],
             cheap, f"cheapest of {strategy} {precision}")
    for device, precision in sorted({(s.device, s.precision) for s in shapes}):
        mine = [s for s in shapes if (s.device, s.precision) == (device, precision)]
        smallest = min(s.world_size for s in mine)
        if len({s.size for s in mine if s.world_size == smallest}) > 1:
            take([s for s in mine if s.world_size == smallest], lambda s: (-s.size, s.name),
                 f"second workload on {device} {precision}")
    for strategy in sorted({s.strategy for s in shapes}):
        take([s for s in shapes if s.strategy == strategy and s.world_size > 1], cheap,
             f"cheapest multi-rank {strategy}")
    widest = max((s.world_size for s in shapes), default=1)
    if len({s.world_size for s in shapes if s.world_size > 1}) > 1:
        take([s for s in shapes if s.world_size == widest], cheap, f"the largest world size ({widest} ranks)")
    for s in shapes:  # what the model cannot forecast is run in any case: at once
        if s.unmodelled:
            chosen.setdefault(s.name, f"{s.unmodelled} is not in the performance model")
    return [(s.name, chosen[s.name]) for s in shapes if s.name in chosen]


def _precision_rank(shape: Shape) -> int:
    order = FAST_FIRST.get(shape.device, ())
    return order.index(shape.precision) if shape.precision in order else len(order)


@dataclass(frozen=True)
class Band:
    """The intervals' half-width ``h`` (ln units: forecast x/÷ e^h) and what it rests on."""

    half_width: float
    errors: int  # checked forecasts it rests on (the default's entries not counted)
    said: str


def band(errors: Sequence[float], level: float = LEVEL) -> Band:
    """The half-width: the ``level`` split-conformal quantile ``q`` of |errors| (the k-th smallest,
    k = ceil(level (m + 1)), capped at m) pooled with the default as a prior worth DEFAULT_ENTRIES
    entries, as the drift between sweeps is (docs/deciding.md): ``h^2 = (k0 h0^2 + m q^2) / (k0 + m)``."""
    m = len(errors)
    q = sorted(abs(e) for e in errors)[min(m, math.ceil(level * (m + 1))) - 1] if m else 0.0
    h = math.sqrt((DEFAULT_ENTRIES * DEFAULT_ERROR**2 + m * q * q) / (DEFAULT_ENTRIES + m))
    said = (f"forecasts x/÷{math.exp(h):.2f}: the {level:.0%} conformal quantile of {m} checked forecast(s)"
            + (f" (x/÷{math.exp(q):.2f})" if m else "") + f" pooled with the default ±{math.expm1(DEFAULT_ERROR):.0%} "
            f"as {DEFAULT_ENTRIES} entries")
    return Band(h, m, said)


@dataclass(frozen=True)
class Candidate:
    """A configuration at one look: measured (samples/s, the mean of its runs) or forecast, or neither."""

    shape: Shape
    measured: float | None = None
    forecast: float | None = None
    why_not: str = ""  # why it has no forecast


@dataclass
class Choice:
    """One look's outcome: what to run next (name, why), what is pruned (candidate, the measured
    best that beat it), what stays open, and the scales still undecided."""

    run: list[tuple[str, str]] = field(default_factory=list)
    pruned: list[tuple[Candidate, Candidate]] = field(default_factory=list)
    open: list[Candidate] = field(default_factory=list)
    undecided: list[tuple[str, int]] = field(default_factory=list)


def choose(candidates: Sequence[Candidate], half_width: float) -> Choice:
    """Per scale: run what the model cannot forecast and every configuration whose upper bound
    (forecast x e^h) reaches the best value there (measured or forecast); prune those whose upper
    bound stays below the best measured one. A scale is decided once nothing is left to run."""
    out = Choice()
    up = math.exp(half_width)
    for scale in sorted({c.shape.scale for c in candidates}):
        mine = [c for c in candidates if c.shape.scale == scale]
        measured = [c for c in mine if c.measured is not None]
        best_measured = max(measured, key=lambda c: c.measured or 0.0, default=None)
        values = [c.measured if c.measured is not None else c.forecast for c in mine]
        best = max((v for v in values if v is not None), default=None)
        for c in mine:
            if c.measured is not None:
                continue
            if c.forecast is None:
                out.run.append((c.shape.name, f"cannot be forecast: {c.why_not}"))
            elif best_measured is not None and c.forecast * up < (best_measured.measured or 0.0):
                out.pruned.append((c, best_measured))
            elif best is not None and c.forecast * up >= best:
                out.run.append((c.shape.name, f"its interval reaches the best at {scale[1]} rank(s) "
                                              f"({c.forecast:.1f} x{up:.2f} >= {best:.1f} samples/s)"))
            else:
                out.open.append(c)
        if any(name in {c.shape.name for c in mine} for name, _ in out.run) or \
                any(o.shape.scale == scale for o in out.open):
            out.undecided.append(scale)
    return out


def cap(run: list[tuple[str, str]], candidates: Sequence[Candidate], room: int) -> list[tuple[str, str]]:
    """At most ``room`` of the configurations to run: those the model cannot forecast first, then
    the highest forecasts (the likeliest to win)."""
    value = {c.shape.name: (c.forecast is not None, -(c.forecast or 0.0)) for c in candidates}
    return sorted(run, key=lambda r: value.get(r[0], (False, 0.0)))[:max(0, room)]


# ---- a whole search over known values (the simulation, --plan's expected cost) ------------------

@dataclass
class Outcome:
    """A search replayed: the configurations run (in order), the best measured per scale, the rounds."""

    ran: list[str]
    best: dict[tuple[str, int], str]
    rounds: int
    stopped: str


def replay(shapes: Sequence[Shape], measure: Callable[[str], float],
           forecast: Callable[[list[str]], dict[str, float | None]], record: Sequence[float] = (),
           cells_max: int | None = None, level: float = LEVEL) -> Outcome:
    """The search on a grid whose values are known: ``measure(name)`` is a configuration's measured
    samples/s, ``forecast(measured names)`` each configuration's forecast from a model fitted on those
    (None: cannot); ``record`` the cluster's checked forecast errors. Each forecast made before its
    configuration ran joins the errors of the next rounds, as in a live search."""
    by_name = {s.name: s for s in shapes}
    measured: dict[str, float] = {}
    errors = list(record)
    todo = [name for name, _ in pilot(shapes)]
    rounds, stopped = 0, "every scale decided"
    forecasts: dict[str, float | None] = {}
    while todo:
        rounds += 1
        for name in todo:
            measured[name] = measure(name)
            if forecasts.get(name):
                errors.append(math.log(float(forecasts[name] or 0.0) / measured[name]))
        forecasts = forecast(list(measured))
        candidates = [Candidate(s, measured.get(s.name), None if s.name in measured else forecasts.get(s.name),
                                "no basis") for s in shapes]
        todo = [name for name, _ in choose(candidates, band(errors, level).half_width).run]
        if cells_max is not None and len(measured) + len(todo) > cells_max:
            todo = [name for name, _ in cap([(n, "") for n in todo], candidates, cells_max - len(measured))]
            stopped = f"cells_max={cells_max} reached"
    best = {}
    for scale in {s.scale for s in shapes}:
        ran = [n for n in measured if by_name[n].scale == scale]
        if ran:
            best[scale] = max(ran, key=lambda n: measured[n])
    return Outcome(list(measured), best, rounds, stopped)
