"""The metric registry: every figure a run reports, declared once.

The worker writes these names into its summary (jobs/summary.py), MLflow shows the headline ones
first (contract/cell_run.py), and the report's table, ``cells.csv``, ``--compare`` and the findings
read their labels, formats and directions from here. Standard library only: the launcher imports
it on a login node, without torch.

Each :class:`Metric` says

* ``name``: the key in summaries, rows and MLflow, its unit at the end (``step_time_ms_p50``);
* ``unit``: the unit in words, for people and docs;
* ``over_ranks``: how the ranks' values become the job's (:class:`OverRanks`);
* ``over_runs``: how independent runs of one configuration become its row (:class:`OverRuns`);
* ``direction``: whether higher or lower is better, or neither (a setting, a count);
* ``headline``: its place among the figures MLflow shows first (1 first; None: not a headline);
* ``label`` and ``fmt``: its column in the report's table (None: no column), and how a value is
  written there (a format spec, or one of ``rate``, ``count``, ``bytes``);
* ``optional``: the column is shown only where some row has a value (tokens, MFU, energy, cost);
* ``csv_lead``: it leads ``cells.csv`` (in declaration order) instead of following sorted;
* ``or_else``: a metric whose value the column shows where this one was not measured;
* ``source``: who computes it: the worker, the launcher before launch, or the report over cells;
* ``claim``: the name a claim about it goes by (findings, ``--compare``, and the noise floor's
  file, which keeps that name); None: no claim is made about it;
* ``min_effect``: the smallest relative change worth a claim (for an exact count: the band
  within which two values are the same).

The order of declaration is the order of the report's columns and of the CSV's leading figures.
Adding a measured figure touches the module that measures it and this registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class OverRanks(str, Enum):
    """How the ranks' values of one job become the job's value."""

    SUM = "sum"  # each rank's own rate, added (throughput)
    MEAN = "mean"  # the average rank (per-device throughput, power)
    MAX = "max"  # the worst rank: the one that runs out of memory first, or waits longest
    MAX_PER_STEP = "max per step"  # a synchronous step ends when its slowest rank does
    SAME = "same"  # one value for the job: configured or counted, equal on every rank
    DERIVED = "derived"  # computed from the job's other figures (a ratio, a spread, a price)
    NONE = "none"  # not a figure of one job (computed by the report over cells)


class OverRuns(str, Enum):
    """How the independent runs of one configuration become its row (launcher/report/rows.py)."""

    MEAN = "mean"  # over the runs that have a result
    RECOMPUTED = "recomputed"  # derived again from the means (relative performance, scaling)
    GROUPING = "grouping"  # made by the grouping itself (how many runs, their spread)


class Direction(str, Enum):
    HIGHER = "higher"
    LOWER = "lower"
    NONE = "none"


class Source(str, Enum):
    WORKER = "worker"  # in the job's summary (jobs/summary.py)
    LAUNCHER = "launcher"  # predicted before launch (launcher/plan/fit.py)
    REPORT = "report"  # derived over cells (launcher/report/rows.py)
    FABRIC = "fabric"  # the fabric probe (jobs/fabric.py), on the sweep's parent run: one per probed shape


# The names other modules write (the worker's summary, the report's readers): each once, here.
ANATOMY_BACKWARD_MS = "anatomy_backward_ms"
ANATOMY_COPIES_MS = "anatomy_copies_ms"
ANATOMY_DATA_WAIT_MS = "anatomy_data_wait_ms"
ANATOMY_FORWARD_MS = "anatomy_forward_ms"
ANATOMY_UNATTRIBUTED_MS = "anatomy_unattributed_ms"
FLOPS_PER_SAMPLE = "flops_per_sample"
COMM_EXPOSED_MS = "comm_exposed_ms"
COMM_PROBE_STEP_TIME_MS = "comm_probe_step_time_ms"
COMM_TIME_MS = "comm_time_ms"
COMPILE_TIME_S = "compile_time_s"
ENERGY_J = "energy_j"
FOREIGN_CPU_SHARE = "foreign_cpu_share"
FOREIGN_GPU_SHARE = "foreign_gpu_share"
GPU_UTIL_MEAN = "gpu_util_mean"
MEASURED_MATMUL_TFLOPS = "measured_matmul_tflops"
MEASURED_STEPS = "measured_steps"
MODEL_STATE_BYTES = "model_state_bytes"
PREDICTED_ACTIVATION_BYTES = "predicted_activation_bytes"
PREDICTED_MODEL_STATE_BYTES = "predicted_model_state_bytes"
RELATIVE_PERF = "relative_perf"
RESTARTS = "restarts"
SCALING_EFFICIENCY = "scaling_efficiency"
STEP_TIME_MS_P50 = "step_time_ms_p50"
STEP_TIME_RANK_SPREAD = "step_time_rank_spread"
THROUGHPUT_CV = "throughput_cv"
THROUGHPUT_SAMPLES_PER_S = "throughput_samples_per_s"
THROUGHPUT_SAMPLES_PER_S_PER_DEVICE = "throughput_samples_per_s_per_device"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    over_ranks: OverRanks
    direction: Direction
    over_runs: OverRuns = OverRuns.MEAN
    headline: int | None = None
    label: str | None = None
    fmt: str = "g"
    optional: bool = False
    csv_lead: bool = False
    or_else: str | None = None
    source: Source = Source.WORKER
    claim: str | None = None
    min_effect: float | None = None

    def read(self, row: Mapping[str, Any]) -> Any:
        """Its value in a summary or a report row; its stand-in's where it was not measured."""
        if self.or_else is None:
            return row.get(self.name)
        return row.get(self.name, row.get(self.or_else))


_S, _M, _X, _STEP = OverRanks.SUM, OverRanks.MEAN, OverRanks.MAX, OverRanks.MAX_PER_STEP
_SAME, _DER, _NONE = OverRanks.SAME, OverRanks.DERIVED, OverRanks.NONE
_UP, _DOWN, _FLAT = Direction.HIGHER, Direction.LOWER, Direction.NONE
_REPORT = Source.REPORT

METRICS: tuple[Metric, ...] = (
    # ---- the report's columns, in their order -------------------------------------------------
    Metric("world_size", "ranks", _SAME, _FLAT, label="ranks", fmt="count"),
    Metric(THROUGHPUT_SAMPLES_PER_S, "samples/s", _S, _UP, headline=8, label="samples/s", fmt="rate",
           csv_lead=True, claim="throughput", min_effect=0.05),
    Metric(THROUGHPUT_SAMPLES_PER_S_PER_DEVICE, "samples/s per device", _M, _UP, headline=1,
           label="samples/s/dev", fmt="rate", csv_lead=True),
    # The spread of throughput over a run's windows; its column reads it with the window count.
    Metric(THROUGHPUT_CV, "coefficient of variation", _DER, _DOWN, csv_lead=True),
    Metric("throughput_tokens_per_s", "tokens/s", _S, _UP, label="tokens/s", fmt="rate", optional=True),
    Metric("throughput_tokens_per_s_per_device", "tokens/s per device", _M, _UP, label="tokens/s/dev",
           fmt="rate", optional=True),
    Metric(STEP_TIME_MS_P50, "ms", _STEP, _DOWN, headline=2, label="step p50 ms", fmt=".1f", csv_lead=True,
           claim="step_time", min_effect=0.05),
    Metric("step_time_ms_p90", "ms", _STEP, _DOWN, label="step p90 ms", fmt=".1f", csv_lead=True),
    # CPU ranks have no allocator peak: the column and the claims use their resident set instead.
    # Memory peaks move less between runs than speed, so their band is narrower (and a claim still
    # needs their own measured noise).
    Metric("peak_mem_allocated_gib", "GiB", _X, _DOWN, headline=3, label="peak mem GiB", fmt=".2f",
           csv_lead=True, or_else="peak_rss_gib", claim="peak_memory", min_effect=0.03),
    Metric("peak_rss_gib", "GiB", _X, _DOWN, headline=4, csv_lead=True),
    # Counted exactly (bytes of tensors), so no noise: below 1% apart is the same layout.
    Metric(MODEL_STATE_BYTES, "bytes", _X, _DOWN, headline=5, label="state {unit}/rank", fmt="bytes",
           csv_lead=True, min_effect=0.01),
    Metric("mfu", "share of the datasheet peak", _DER, _UP, headline=7, label="MFU", fmt=".1%", optional=True),
    Metric("mfu_measured_peak", "share of the measured matmul peak", _DER, _UP, label="MFU (measured peak)",
           fmt=".1%", optional=True),
    Metric("energy_j_per_sample", "J/sample", _S, _DOWN, label="J/sample", fmt=".3g", optional=True),
    Metric("power_w_mean", "W per device", _M, _FLAT, label="W/device", fmt=".0f", optional=True),
    Metric("cost_per_1m_samples", "price per 1M samples", _DER, _DOWN, label="cost/1M samples", fmt=",.2f",
           optional=True),
    Metric(RELATIVE_PERF, "share of the best cell's throughput", _NONE, _UP, OverRuns.RECOMPUTED,
           label="rel perf", fmt=".0%", csv_lead=True, source=_REPORT),
    Metric(SCALING_EFFICIENCY, "share of linear scaling", _NONE, _UP, OverRuns.RECOMPUTED, label="scaling eff",
           fmt=".0%", csv_lead=True, source=_REPORT),
    Metric("comm_share", "share of step time", _X, _DOWN, headline=6, label="comm share", fmt=".0%",
           csv_lead=True),
    Metric("runs", "runs", _NONE, _FLAT, OverRuns.GROUPING, label="runs", fmt="count", optional=True,
           source=_REPORT),
    Metric("run_spread", "coefficient of variation", _NONE, _DOWN, OverRuns.GROUPING, label="run spread",
           fmt=".1%", optional=True, source=_REPORT),
    # ---- every other figure: in cells.csv and MLflow, no column -----------------------------------
    Metric(MEASURED_STEPS, "steps", _SAME, _FLAT),
    Metric("step_time_ms_max", "ms", _STEP, _DOWN),
    Metric("data_time_share", "share of step time", _X, _DOWN),
    Metric(STEP_TIME_RANK_SPREAD, "slowest rank's median over the median rank's", _DER, _DOWN),
    Metric("peak_mem_reserved_gib", "GiB", _X, _DOWN),
    Metric("setup_rss_growth_gib", "GiB", _X, _DOWN),
    Metric("setup_peak_mem_allocated_gib", "GiB", _X, _DOWN),
    Metric("param_bytes", "bytes", _X, _DOWN),
    Metric("grad_bytes", "bytes", _X, _DOWN),
    Metric("optim_state_bytes", "bytes", _X, _DOWN),
    Metric(COMM_TIME_MS, "ms per step", _X, _DOWN),
    Metric(COMM_EXPOSED_MS, "ms per step", _X, _DOWN),
    Metric(COMM_PROBE_STEP_TIME_MS, "ms", _X, _DOWN),
    Metric("memcpy_time_ms", "ms per step", _X, _DOWN),
    Metric("fp16_skipped_steps", "steps", _X, _DOWN),
    Metric("fp16_skipped_steps_warmup", "steps", _X, _DOWN),
    Metric("loss_first", "loss", _M, _FLAT),
    Metric("loss_last", "loss", _M, _FLAT),
    Metric("nodes", "nodes", _SAME, _FLAT),
    Metric("lr", "learning rate", _SAME, _FLAT),
    Metric(RESTARTS, "restarts", _SAME, _DOWN),
    Metric("warmup_steps_extended", "steps", _SAME, _FLAT),
    # torch.compile's cost, outside every figure: the warm-up's extra time over its steady steps.
    Metric(COMPILE_TIME_S, "s (the warm-up's time above its steady steps)", _X, _DOWN),
    Metric(FOREIGN_CPU_SHARE, "share of the job's cores", _X, _DOWN),
    Metric(FOREIGN_GPU_SHARE, "share of the job's GPUs", _X, _DOWN),
    Metric(GPU_UTIL_MEAN, "percent", _M, _FLAT),
    Metric("cost_per_1m_tokens", "price per 1M tokens", _DER, _DOWN),
    Metric(ENERGY_J, "J", _S, _DOWN),
    Metric("peak_flops_per_s", "FLOP/s", _SAME, _FLAT),
    # Counted by the worker on its built model (jobs/models/flops.py): the forecasts read it from the
    # results, so nothing on the launcher's side builds a model to count it.
    Metric(FLOPS_PER_SAMPLE, "FLOP per training sample (forward and backward)", _SAME, _FLAT),
    Metric(MEASURED_MATMUL_TFLOPS, "TFLOP/s", _M, _FLAT),
    Metric(PREDICTED_MODEL_STATE_BYTES, "bytes", _X, _FLAT, source=Source.LAUNCHER),
    Metric(PREDICTED_ACTIVATION_BYTES, "bytes", _X, _FLAT, source=Source.LAUNCHER),
    # ---- forecasts checked (launcher/forecast/inputs.py): each configuration forecast from the others
    Metric("forecast_throughput_samples_per_s", "samples/s (leave-one-out forecast)", _NONE, _FLAT, source=_REPORT),
    Metric("forecast_error", "forecast over measured throughput, minus 1", _NONE, _FLAT, source=_REPORT),
    # The sweep's parent run: over its configurations.
    Metric("forecast_error_median", "median absolute forecast error (share of the measured)", _NONE, _DOWN,
           source=_REPORT),
    Metric("forecast_error_median_at_measured_cores", "the same, each forecast at the share of cores its cell had",
           _NONE, _DOWN, source=_REPORT),
    Metric("forecast_interval_coverage", "share of measurements inside their forecast's interval", _NONE, _UP,
           source=_REPORT),
    Metric("forecast_points", "configurations forecast", _NONE, _FLAT, source=_REPORT),
)

# The fabric probe's figures (jobs/fabric.py): per collective and scope, logged on the sweep's parent
# run with the probed shape's ranks as their step (launcher/forecast/fabric.py).
FABRIC_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
FABRIC_SCOPES = ("intra_node", "inter_node")
FABRIC_FIGURES = (
    ("latency_us", "us (fitted alpha)", Direction.LOWER),
    ("bandwidth_gb_per_s", "GB/s of bus bandwidth (fitted beta)", Direction.HIGHER),
    ("busbw_gb_per_s_peak", "GB/s of bus bandwidth (the best message size)", Direction.HIGHER),
    ("fit_error", "root mean square relative error of the fit", Direction.LOWER),
)


def fabric_name(collective: str, scope: str, figure: str) -> str:
    """``fabric_all_reduce_inter_node_latency_us``: one figure of one collective in one scope."""
    return f"fabric_{collective}_{scope}_{figure}"


_FABRIC = Source.FABRIC
METRICS += tuple(Metric(fabric_name(c, s, figure), unit, _DER, direction, source=_FABRIC)
                 for s in FABRIC_SCOPES for c in FABRIC_COLLECTIVES for figure, unit, direction in FABRIC_FIGURES)
METRICS += (
    Metric("fabric_probe_s", "s of collectives (the probe's own cost, its job's start-up not counted)", _SAME,
           _DOWN, source=_FABRIC),
    Metric("fabric_job_s", "s of the probe job on its ranks (torch's import, the process group, the collectives)",
           _SAME, _DOWN, source=_FABRIC),
    Metric("fabric_cores_per_rank", "cores a rank really has (affinity and cgroup quota, shared)", _SAME, _FLAT,
           source=_FABRIC),
)


# ---- a step's anatomy (jobs/anatomy.py): parts that add up to the probe's step time -------------
# Reduced over ranks as the mean: a mean of sums is the sum of means, so the job's parts still add
# up to the job's probe step time (a maximum per part would not).
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "other")
# The parts, in the order they are summed and drawn; the last is the remainder, never spread.
STEP_PARTS = ("anatomy_data_wait_ms", "anatomy_forward_ms", "anatomy_backward_ms", "anatomy_optimizer_ms",
              "anatomy_copies_ms", *(f"comm_{k}_exposed_ms" for k in COLLECTIVE_KINDS), "anatomy_unattributed_ms")
ANATOMY_STEP = "anatomy_step_time_ms"


def comm_bytes(kind: str) -> str:
    return f"comm_{kind}_bytes_per_step"


def comm_calls(kind: str) -> str:
    return f"comm_{kind}_calls_per_step"


def predicted_comm_bytes(kind: str) -> str:
    return f"predicted_comm_{kind}_bytes_per_step"


def _anatomy() -> tuple[Metric, ...]:
    ms = "ms per step (the profiled probe's)"
    out = [Metric(ANATOMY_STEP, "ms per step (the profiled probe's: the profiler's cost included)", _M, _DOWN)]
    out += [Metric(name, ms, _M, _DOWN) for name in STEP_PARTS]
    for k in COLLECTIVE_KINDS:
        out += [Metric(f"comm_{k}_overlapped_ms", ms + ", hidden by computation, not in the sum", _M, _FLAT),
                Metric(comm_bytes(k), "bytes per optimizer step (nccl-tests' size)", _M, _DOWN),
                Metric(comm_calls(k), "collectives per optimizer step", _M, _FLAT),
                Metric(f"comm_{k}_algbw_gbps", "GB/s (bytes over time in flight)", _M, _UP),
                Metric(f"comm_{k}_busbw_gbps", "GB/s (nccl-tests' bus bandwidth)", _M, _UP),
                Metric(predicted_comm_bytes(k), "bytes per optimizer step (the strategy's theory)", _X, _FLAT,
                       source=Source.LAUNCHER)]
    return tuple(out)


METRICS = METRICS + _anatomy()

# The per-step series: one record per measured step in metrics.jsonl and MLflow's per-step metrics
# (jobs/summary.py's step_records), beside the summary; not columns of the report.
STEP_LOSS = "loss"
STEP_TIME_MS = "step_time_ms"
STEP_SERIES: tuple[Metric, ...] = (
    Metric(STEP_LOSS, "loss (the mean over ranks)", _M, _FLAT),
    Metric(STEP_TIME_MS, "ms (the slowest rank's: a synchronous step ends when it does)", _STEP, _DOWN),
)

REGISTRY: dict[str, Metric] = {m.name: m for m in METRICS}


def get(name: str) -> Metric:
    """The metric called ``name``; a KeyError names the registry to add it to."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a registered metric: declare it in contract/metrics.py") from None


def headlines() -> tuple[str, ...]:
    """The names MLflow shows first, in their headline order."""
    return tuple(m.name for m in sorted((m for m in METRICS if m.headline), key=lambda m: m.headline or 0))


def columns() -> tuple[Metric, ...]:
    """The metrics that are columns of the report's table, in column order."""
    return tuple(m for m in METRICS if m.label)


def claimed() -> dict[str, Metric]:
    """The metrics claims are made about, by their claim's name, in declaration order."""
    return {m.claim: m for m in METRICS if m.claim}


def csv_lead() -> tuple[str, ...]:
    """The figures that lead cells.csv, in their order."""
    return tuple(m.name for m in METRICS if m.csv_lead)
