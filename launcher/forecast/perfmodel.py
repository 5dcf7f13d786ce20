"""A cell's step time from what one rank computes and what it moves: the model behind every forecast.

Pure arithmetic over plain numbers (no torch, no files). A measured cell is an :class:`Observed`;
:func:`fit` turns a sweep's observed cells into a :class:`Model`, and :meth:`Model.predict` gives
the step of a cell that was not run (a :class:`Work`).

* **Compute**: ``compute_ms = overhead_ms + flops / rate`` on cores of its own, fitted per device kind
  and precision.
  ``flops`` are the training FLOPs one rank does per optimizer step (launcher/plan/fit.py's count
  per sample x samples per step; x 4/3 with activation checkpointing, which runs forward twice).
  On CPU the rate depends on the cores a rank really has: a rank of ``threads`` threads runs at
  ``rate_1 x threads^gamma`` while it has that many cores, and time-slices below that
  (``x min(1, cores / threads)``: two single-thread ranks on one core each run at half speed).
  ``gamma`` (how well intra-op threads scale; below 0 where threads that wait on each other cost
  more than they give, as on an oversubscribed host) is fitted where the sweep ran ranks of
  different thread counts, else 1 (stated); a thread count measured at two workloads or more gets
  its own overhead and rate (a rank's threads change its per-step overhead too). Other tenants of a host take a share of its cores: each
  measured cell is read at the share it had (``available``, 1 - the worker's foreign_cpu_share), and
  a forecast assumes the median share of the cells it was fitted on. The fit minimises the squared *relative* error, since the
  forecast's error is judged relatively; ``overhead_ms`` is held >= 0.
* **Communication**: per collective, ``calls x alpha + bytes x factor / beta`` with nccl-tests'
  bus factors for ring algorithms (all-reduce ``2(n-1)/n``, all-gather and reduce-scatter
  ``(n-1)/n``, n the group's ranks), alpha and beta per collective and scope (``intra``: the group
  lies within a node; ``inter``: it spans nodes; hsdp's shard group is intra, its replica
  all-reduce inter). They come from a fabric probe where one ran, calibrated by the sweep's
  measured communication; else they are fitted on the sweep's own multi-rank cells (one alpha and
  beta for every collective and scope, stated).
* **Exposed** communication is ``(1 - overlap) x comm``, with the overlap measured in the sweep's
  cells of the same strategy (``1 - comm_exposed_ms / comm_time_ms``).
* **Step** = compute + exposed; throughput = ranks x samples per rank per step / step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

INTRA, INTER = "intra", "inter"
ANY = "*"
# Candidates for gamma where thread counts differ: -3 (a second thread costs 8x: threads
# that wait on each other on an oversubscribed host) to 1 (linear).
_GAMMAS = tuple(g / 20 for g in range(-60, 21))


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of a ring collective over ``ranks`` ranks (0 on one rank)."""
    if ranks <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0  # broadcast and the rest: every byte crosses once


@dataclass(frozen=True)
class Collective:
    """One kind of collective a rank runs per optimizer step."""

    kind: str  # all_reduce, all_gather, reduce_scatter, broadcast, other
    bytes_per_step: float  # nccl-tests' size, summed over the step's calls (launcher/plan/traffic.py)
    ranks: int  # the group it runs over
    scope: str = INTRA  # INTRA or INTER
    calls_per_step: float = 1.0

    @property
    def bus_bytes(self) -> float:
        return self.bytes_per_step * bus_factor(self.kind, self.ranks)


@dataclass(frozen=True)
class Work:
    """What one rank of a cell does per optimizer step, and what it runs on."""

    device: str  # "cpu" or "gpu"
    precision: str
    strategy: str
    flops: float  # training FLOPs per rank per optimizer step
    samples: int  # samples per rank per optimizer step (batch x accumulation)
    world_size: int
    threads: int = 1  # compute threads per rank (CPU)
    cores: float = 1.0  # the cores a rank really has (CPU): min(threads, the host's cores / its ranks)
    collectives: tuple[Collective, ...] = ()
    # The share of its cores that other tenants left it (measured cells: 1 - foreign_cpu_share).
    available: float = 1.0

    @property
    def group(self) -> tuple[str, str]:
        return self.device, self.precision

    @property
    def time_slice(self) -> float:
        """The share of its threads' time a rank gets: 1 with a core per thread, less on shared cores."""
        return min(1.0, self.cores / max(self.threads, 1))


@dataclass(frozen=True)
class Observed:
    """A measured cell: its work and its window's figures (the probe's times scaled to the window)."""

    work: Work
    step_ms: float
    comm_ms: float | None = None  # time with some collective in flight
    exposed_ms: float | None = None  # of which no computation hid it

    @property
    def compute_ms(self) -> float | None:
        if self.work.world_size <= 1:
            return self.step_ms
        return None if self.exposed_ms is None else self.step_ms - self.exposed_ms


@dataclass(frozen=True)
class ComputeFit:
    """``compute_ms = (overhead_ms + flops / (flops_per_ms x threads^gamma)) / (time slice x available)``:
    the overhead is CPU work too, and slows with the rest on a shared core."""

    overhead_ms: float
    flops_per_ms: float  # of one thread with a core to itself
    gamma: float
    points: int
    note: str = ""
    # (threads, overhead_ms, flops_per_ms of the rank) fitted on their own, where the sweep measured
    # that thread count at two workloads or more: a rank's threads change its per-step overhead too.
    per_threads: tuple[tuple[int, float, float], ...] = ()

    def ms(self, work: Work, available: float = 1.0) -> float:
        own = {t: (o, r) for t, o, r in self.per_threads}
        if work.threads in own:
            overhead, rate = own[work.threads]
            alone = overhead + work.flops / rate
        else:
            alone = self.overhead_ms + work.flops / (self.flops_per_ms * max(work.threads, 1) ** self.gamma)
        return alone / (work.time_slice * available)


@dataclass(frozen=True)
class Link:
    alpha_ms: float  # per call
    bytes_per_ms: float  # bus bandwidth (beta)


@dataclass(frozen=True)
class Fabric:
    """Latency and bandwidth per (collective kind, scope); ANY stands for every kind or scope."""

    links: dict[tuple[str, str], Link]
    source: str  # where the figures come from, for every forecast's text
    calibration: float = 1.0  # measured communication over what the links predict for the sweep's cells

    def link(self, kind: str, scope: str) -> Link | None:
        for key in ((kind, scope), (ANY, scope), (kind, ANY), (ANY, ANY)):
            if key in self.links:
                return self.links[key]
        return None

    def ms(self, collectives: Sequence[Collective], calibrated: bool = True) -> float | None:
        total = 0.0
        for c in collectives:
            if c.ranks <= 1 or not c.bytes_per_step:
                continue
            link = self.link(c.kind, c.scope)
            if link is None:
                return None
            total += c.calls_per_step * link.alpha_ms + c.bus_bytes / link.bytes_per_ms
        return total * (self.calibration if calibrated else 1.0)


@dataclass(frozen=True)
class Prediction:
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_ms: float
    throughput_samples_per_s: float  # the whole job's

    @property
    def comm_share(self) -> float:
        return self.exposed_ms / self.step_ms if self.step_ms else 0.0


class CannotPredict(ValueError):
    """A cell the model has no basis for, with the reason (no measured cell on its device, ...)."""


@dataclass(frozen=True)
class Model:
    compute: dict[tuple[str, str], ComputeFit]
    fabric: Fabric | None
    overlap: dict[str, float]  # per strategy; ANY: over every strategy
    available: float = 1.0  # the share of the cores other tenants left, median over the fitted cells

    def predict(self, work: Work) -> Prediction:
        fit_ = self.compute.get(work.group)
        if fit_ is None:
            raise CannotPredict(f"no measured cell on {work.device} in {work.precision} to fit its compute rate on")
        compute_ms = fit_.ms(work, self.available if work.device == "cpu" else 1.0)
        comm_ms = 0.0
        if any(c.ranks > 1 and c.bytes_per_step for c in work.collectives):
            found = self.fabric.ms(work.collectives) if self.fabric else None
            if found is None:
                raise CannotPredict("no latency and bandwidth for its collectives: no fabric probe, and no measured "
                                    "multi-rank cell with communication to fit them on")
            comm_ms = found
        overlap = self.overlap.get(work.strategy, self.overlap.get(ANY, 0.0))
        exposed_ms = (1 - overlap) * comm_ms
        step_ms = compute_ms + exposed_ms
        return Prediction(step_ms, compute_ms, comm_ms, exposed_ms, 1000.0 * work.world_size * work.samples / step_ms)


# ---- fitting ------------------------------------------------------------------------------------

def fit(observed: Sequence[Observed], fabric: Fabric | None = None) -> Model:
    """The model of a sweep's measured cells; ``fabric``: a probe's links (else fitted here)."""
    compute = {}
    for group in sorted({o.work.group for o in observed}):
        points = [o for o in observed if o.work.group == group and o.compute_ms and o.compute_ms > 0]
        if points:
            compute[group] = fit_compute(points)
    multi = [o for o in observed if o.work.world_size > 1 and o.comm_ms is not None
             and any(c.ranks > 1 and c.bytes_per_step for c in o.work.collectives)]
    if fabric is not None:
        fabric = calibrate(fabric, multi)
    elif multi:
        fabric = fit_fabric(multi)
    cpu = [o.work.available for o in observed if o.work.device == "cpu"]
    return Model(compute, fabric, fit_overlap(multi), statistics.median(cpu) if cpu else 1.0)


def fit_compute(points: Sequence[Observed]) -> ComputeFit:
    """Least squares on relative error over the points (each with a compute time), gamma by grid
    where the points ran different thread counts."""
    threads = {o.work.threads for o in points}
    gammas = _GAMMAS if len(threads) > 1 else (1.0,)
    best: tuple[float, float, float, float] | None = None  # (residual, overhead, ms per flop, gamma)
    for gamma in gammas:
        # Each point as it would have run with its cores to itself.
        xs = [o.work.flops / max(o.work.threads, 1) ** gamma for o in points]
        ys = [float(o.compute_ms or 0.0) * o.work.time_slice * o.work.available for o in points]
        overhead, slope = relative_least_squares(xs, ys)
        residual = sum(((overhead + slope * x) / y - 1) ** 2 for x, y in zip(xs, ys, strict=True))
        if best is None or residual < best[0] - 1e-12:
            best = (residual, overhead, slope, gamma)
    assert best is not None
    _, overhead, slope, gamma = best
    note = "" if len(threads) > 1 else "one thread count measured: threads assumed to scale linearly"
    if len({o.work.flops for o in points}) < 2:
        note = "one workload measured: no fixed overhead fitted"
    return ComputeFit(overhead, 1.0 / slope, gamma, len(points), note, _per_threads(points))


def _per_threads(points: Sequence[Observed]) -> tuple[tuple[int, float, float], ...]:
    """(threads, overhead_ms, FLOP/ms) of each thread count measured at two workloads or more."""
    out = []
    for t in sorted({o.work.threads for o in points}):
        mine = [o for o in points if o.work.threads == t]
        if len({o.work.flops for o in mine}) < 2:
            continue
        overhead, slope = relative_least_squares(
            [o.work.flops for o in mine], [float(o.compute_ms or 0.0) * o.work.time_slice * o.work.available for o in mine])
        if slope > 0:
            out.append((t, overhead, 1.0 / slope))
    return tuple(out)


def relative_least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum(((a + b x) / y - 1)^2): least squares weighted by 1/y^2. Through
    the origin (a = 0) where one x value is all there is, or where the free fit's a would be negative."""
    w = [1.0 / y**2 for y in ys]
    sw, sx, sy = sum(w), _dot(w, xs), _dot(w, ys)
    sxx, sxy = _dot(w, [x * x for x in xs]), _dot(w, [x * y for x, y in zip(xs, ys, strict=True)])
    det = sw * sxx - sx * sx
    if len(set(xs)) > 1 and det > 0:
        a = (sxx * sy - sx * sxy) / det
        b = (sw * sxy - sx * sy) / det
        if a >= 0 and b > 0:
            return a, b
    if sxx > 0 and sxy > 0:
        return 0.0, sxy / sxx
    return statistics.fmean(ys), 0.0  # nothing grows with x: a constant


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def fit_fabric(multi: Sequence[Observed]) -> Fabric:
    """One alpha and beta for every collective and scope, from the sweep's measured communication:
    ``comm_ms = alpha x calls + bus_bytes / beta`` (relative least squares)."""
    calls = [sum(c.calls_per_step for c in o.work.collectives if c.ranks > 1) for o in multi]
    bus = [sum(c.bus_bytes for c in o.work.collectives) for o in multi]
    comm = [float(o.comm_ms or 0.0) for o in multi]
    # comm / calls = alpha + (bus / calls) / beta: a line in bytes per call.
    xs = [b / n for b, n in zip(bus, calls, strict=True)]
    ys = [m / n for m, n in zip(comm, calls, strict=True)]
    if all(y > 0 for y in ys):
        alpha, per_byte = relative_least_squares(xs, ys)
    else:
        alpha, per_byte = 0.0, 0.0
    if per_byte <= 0:  # communication that does not grow with bytes: all latency
        per_byte = 1e-12
    how = ("alpha and beta" if alpha > 0 else "beta alone (alpha 0)")
    source = (f"{how} fitted on this sweep's {len(multi)} multi-rank cell(s) (no fabric probe): one figure for "
              "every collective and scope")
    return Fabric({(ANY, ANY): Link(alpha, 1.0 / per_byte)}, source)


def calibrate(fabric: Fabric, multi: Sequence[Observed]) -> Fabric:
    """The probe's links times the median ratio of measured to predicted communication in the
    sweep's cells (collectives in a training step compete with compute, which the probe's do not)."""
    ratios = [o.comm_ms / p for o in multi if o.comm_ms and (p := fabric.ms(o.work.collectives, calibrated=False))]
    if not ratios:
        return fabric
    return Fabric(fabric.links, fabric.source, statistics.median(ratios))


def fit_overlap(multi: Sequence[Observed]) -> dict[str, float]:
    """The share of communication that computation hid, per strategy and over all (ANY)."""
    shares: dict[str, list[float]] = {}
    for o in multi:
        if o.comm_ms and o.exposed_ms is not None:
            share = min(1.0, max(0.0, 1 - o.exposed_ms / o.comm_ms))
            shares.setdefault(o.work.strategy, []).append(share)
            shares.setdefault(ANY, []).append(share)
    return {k: statistics.fmean(v) for k, v in shares.items()}


# ---- errors and intervals -----------------------------------------------------------------------

def log_error(predicted: float, measured: float) -> float:
    """ln(predicted / measured): symmetric in over- and under-forecasts, and additive."""
    return math.log(predicted / measured)


@dataclass(frozen=True)
class Spread:
    """How far forecasts have been off: the interval's half-width on the log scale at ``coverage``."""

    half_width: float  # ln units: the interval is [forecast / e^h, forecast x e^h]
    coverage: float  # the share of future forecasts it should hold (split conformal: k / (m + 1))
    errors: int  # how many validated forecasts it rests on

    def interval(self, value: float) -> tuple[float, float]:
        return value / math.exp(self.half_width), value * math.exp(self.half_width)


def spread(errors: Sequence[float], level: float = 0.9) -> Spread | None:
    """The conformal interval of a forecast from ``errors`` (log errors of validated forecasts): the
    k-th smallest absolute error with k = ceil(level (m + 1)), capped at m, so that a new forecast
    falls inside with probability k / (m + 1) when it errs like those did. None without errors."""
    m = len(errors)
    if not m:
        return None
    k = min(m, math.ceil(level * (m + 1)))
    return Spread(sorted(abs(e) for e in errors)[k - 1], k / (m + 1), m)
