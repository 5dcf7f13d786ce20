"""One owner of a run's measurements: the reduction across ranks, the summary schema, the per-step
records and the run's tags (:func:`report`; torchtitan's MetricsProcessor plays this part).

Every name carries its unit, and is declared in contract/metrics.py with its reduction across ranks:
throughput is summed (each rank's own samples over its own time), step time is the slowest rank's
per step (a synchronous step ends when the last rank ends), memory is the maximum over ranks (the
rank that runs out first).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contract import metrics
from contract.metrics import (
    COMPILE_TIME_S,
    FLOPS_PER_SAMPLE,
    FOREIGN_CPU_SHARE,
    FOREIGN_GPU_SHARE,
    GPU_UTIL_MEAN,
    MEASURED_MATMUL_TFLOPS,
    MEASURED_STEPS,
    RESTARTS,
    STEP_LOSS,
    STEP_TIME_MS,
    STEP_TIME_MS_P50,
    THROUGHPUT_CV,
    THROUGHPUT_SAMPLES_PER_S,
    THROUGHPUT_SAMPLES_PER_S_PER_DEVICE,
)
from contract.stats import coefficient_of_variation, percentile
from jobs.stragglers import straggler_figures

if TYPE_CHECKING:
    from jobs.rankrun import Run
    from jobs.schedule import Outcome


def gather_ranks(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (one collective, after measuring)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def summarize(per_rank: list[dict[str, Any]], *, samples_per_step: int, tokens_per_sample: int, repeats: int,
              data_parallel: int | None = None) -> dict[str, float]:
    """Reduce per-rank measurements of the measured window into the job's summary metrics.

    Each rank entry holds ``step_time_s`` and ``data_time_s`` (lists over measured steps),
    memory figures and model-state bytes. ``data_parallel``: how many ranks read different batches
    (contract.parallel.ParallelDims.data_parallel; None: every rank its own).
    """
    world = len(per_rank)
    # Ranks of one model-parallel group step through the same samples: counted once.
    distinct = (data_parallel or world) / world
    n_steps = len(per_rank[0]["step_time_s"])
    # The job's step time is the slowest rank's, step by step.
    slowest = [max(r["step_time_s"][i] for r in per_rank) for i in range(n_steps)]
    # The headline: every rank's samples over its own whole measured time (total work over total
    # time, every step counted), summed over ranks. A mean of window rates would overweight fast
    # windows: a stall in one window hardly moves it.
    throughput = window_rate(per_rank, range(n_steps), samples_per_step, distinct)
    # The windows are only for the spread within the run; together they hold every step.
    per_window = [window_rate(per_rank, w, samples_per_step, distinct) for w in step_windows(n_steps, repeats)]
    out: dict[str, float] = {
        "world_size": world,
        MEASURED_STEPS: n_steps,
        THROUGHPUT_SAMPLES_PER_S: throughput,
        THROUGHPUT_SAMPLES_PER_S_PER_DEVICE: throughput / world,
        THROUGHPUT_CV: coefficient_of_variation(per_window),
        STEP_TIME_MS_P50: 1e3 * percentile(slowest, 50),
        "step_time_ms_p90": 1e3 * percentile(slowest, 90),
        "step_time_ms_max": 1e3 * max(slowest),
        "data_time_share": max(sum(r["data_time_s"]) / sum(r["step_time_s"]) for r in per_rank),
    }
    if tokens_per_sample > 1:
        out["throughput_tokens_per_s"] = throughput * tokens_per_sample
        out["throughput_tokens_per_s_per_device"] = throughput * tokens_per_sample / world
    out.update(rank_figures_reduced(per_rank))
    return out


def step_windows(n_steps: int, repeats: int) -> list[range]:
    """``repeats`` contiguous windows over ``n_steps`` steps, none empty, their lengths differing by
    at most one (20 steps in 3: 7, 6, 7): no step is left over."""
    count = max(1, min(repeats, n_steps))
    bounds = [round(i * n_steps / count) for i in range(count + 1)]
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def window_rate(per_rank: list[dict[str, Any]], steps: range, samples_per_step: int, distinct: float) -> float:
    """Samples per second over ``steps``: each rank's samples over its own time in them, summed."""
    return distinct * sum(samples_per_step * len(steps) / sum(r["step_time_s"][i] for i in steps)
                          for r in per_rank)


# How the registry's reductions over ranks apply to figures every rank measured itself.
_REDUCE: dict[metrics.OverRanks, Callable[[list[float]], float]] = {
    metrics.OverRanks.MAX: max, metrics.OverRanks.SUM: sum, metrics.OverRanks.MEAN: statistics.fmean}


def rank_figures_reduced(per_rank: list[dict[str, Any]]) -> dict[str, float]:
    """Each registered figure of the ranks' entries (memory, bytes, communication, skipped steps),
    reduced over the ranks as contract/metrics.py declares it; the rest of an entry (step times,
    history, host) is not a figure of its own. A figure some ranks could not measure (a probe's
    bytes where that rank's trace lost its collectives) is reduced over the ranks that did."""
    out = {}
    for key in dict.fromkeys(k for r in per_rank for k in r):
        metric = metrics.REGISTRY.get(key)
        if metric is not None and metric.over_ranks in _REDUCE:
            out[key] = _REDUCE[metric.over_ranks]([r[key] for r in per_rank if key in r])
    return out


# ---- per-step records ------------------------------------------------------------------------

def step_records(histories: list[dict[str, Any]], lo: int, hi: int) -> list[dict[str, float]]:
    """Per-step records for steps lo..hi-1 from every rank's portable history: the mean loss over
    ranks and the slowest rank's step time (a synchronous step ends when the last rank ends)."""
    out = []
    for step in range(lo, hi):
        idx = [h["steps"].index(step) for h in histories]
        pairs = list(zip(histories, idx, strict=True))
        out.append({"step": step, STEP_LOSS: sum(h["losses"][i] for h, i in pairs) / len(pairs),
                    STEP_TIME_MS: 1e3 * max(h["step_time_s"][i] for h, i in pairs)})
    return out


def mean_losses(histories: list[dict[str, Any]], total_steps: int) -> list[float]:
    """Loss per step averaged over ranks; rank 0's own when not every rank ran every step (a
    resume on a different layout: the old ranks' steps live only in rank 0's restored history)."""
    if all(h["steps"] == list(range(total_steps)) for h in histories):
        return [sum(h["losses"][i] for h in histories) / len(histories) for i in range(total_steps)]
    return histories[0]["losses"]


def skipped_steps(history: dict[str, Any]) -> dict[str, int]:
    """fp16 steps the GradScaler skipped (inf/NaN gradients), inside and before the measured window."""
    flags = history.get("skipped") or []
    pairs = list(zip(flags, history["measured"], strict=False))  # no flags without a scaler
    return {"fp16_skipped_steps": sum(1 for s, m in pairs if s and m),
            "fp16_skipped_steps_warmup": sum(1 for s, m in pairs if s and not m)}


def foreign_cpu_share(windows: list[dict[str, Any] | None]) -> float | None:
    """The largest share, over hosts, of the host's job cores' time that other processes used
    during the measured window (jobs/interference.py samples it; None without a full sample).

    Per host: the cores are the union of its ranks' affinity sets; the busy time is read from the
    first rank's sample (one consistent reading of every core); our time is the sum of the host's
    ranks' own CPU time. ``max(0, busy - ours) / (window_s * cores)``.
    """
    by_host: dict[str, list[dict[str, Any]]] = {}
    for w in windows:
        if w is None:
            return None  # a rank without a window: the comparison would miss its time
        by_host.setdefault(w["host"], []).append(w)
    shares = []
    for ranks in by_host.values():
        cores = sorted(set().union(*(set(r["cpus"]) for r in ranks)))
        ref = ranks[0]
        busy_s = sum(ref["busy_ticks_delta"].get(c, 0) for c in cores) / ref["ticks_per_s"]
        ours_s = sum(r["own_cpu_delta_s"] for r in ranks)
        capacity_s = ref["window_s"] * len(cores)
        if capacity_s <= 0:
            continue
        shares.append(max(0.0, busy_s - ours_s) / capacity_s)
    return max(shares) if shares else None


# ---- the job's report: summary, tags, records (rank 0 logs it; every rank computes it) ---------

@dataclass
class Report:
    """What the job reports: the summary metrics, the run's tags, the per-step records not logged
    yet, the GPUs' system metrics, and ``result`` (result.json, and what ``jobs.worker.main`` returns)."""

    summary: dict[str, Any]
    tags: dict[str, str]
    steps: list[dict[str, float]]
    system: list[dict[str, Any]]
    result: dict[str, Any]


def report(run: Run, outcome: Outcome, per_rank: list[dict[str, Any]]) -> Report:
    """Reduce every rank's measurements (``per_rank``, from :func:`gather_ranks`) into the report."""
    spec, env = run.rank.spec, run.rank.env
    train = spec.train
    histories = [r["history"] for r in per_rank]
    # Steps run: the configured ones plus any warm-up extension (the window keeps its length).
    total_steps = train.steps + outcome.warmup_steps_extended
    mean_loss = mean_losses(histories, total_steps)
    summary = job_summary(run, per_rank, outcome, mean_loss)
    tags: dict[str, str] = {}
    missing = run.interference.missing
    system = gpu_figures(run.rank.device, per_rank, summary, tags, missing,
                         samples_in_window=train.batch_size * train.grad_accum_steps * summary[MEASURED_STEPS]
                         * run.rank.dims.data_parallel)
    if FOREIGN_GPU_SHARE not in summary and missing:
        tags["gpu_interference_missing"] = missing
    rank_medians_s, local_medians_s = straggler_figures(per_rank, summary, tags, run.rank.device.type)
    tags = run_tags(run, per_rank, outcome, summary, tags)
    first_logged = max(outcome.logged_through, max(h["steps"][0] for h in histories))
    result = {"cell": spec.cell, "summary": summary, "tags": tags, "losses": mean_loss, "rank": env.rank,
              "first_step_unix_s": outcome.first_step_unix_s,
              # What each rank used to rendezvous: all equal, or the job could not have run.
              "rank_masters": [r["master"] for r in per_rank], "rank_hosts": [r["hostname"] for r in per_rank],
              # Each rank's own median step time (the summary's step times are the slowest rank's).
              "rank_step_time_ms_p50": [1e3 * m for m in rank_medians_s],
              # Each rank's own work per step without gradient communication (names the straggler).
              "rank_local_step_time_ms_p50": [1e3 * m for m in local_medians_s] if local_medians_s else None}
    return Report(summary, tags, step_records(histories, first_logged, total_steps), system, result)


def job_summary(run: Run, per_rank: list[dict[str, Any]], outcome: Outcome,
                mean_loss: list[float]) -> dict[str, Any]:
    """The job's figures from every rank's (throughput, step times, memory, interference, cost)."""
    from jobs.cost import cost_per_1m
    from jobs.data import samples_unit

    spec, env = run.rank.spec, run.rank.env
    train = spec.train
    _, per_sample = samples_unit(spec.model)
    with run.rank.observer.phase("summarize"):
        summary: dict[str, Any] = summarize(per_rank, samples_per_step=train.batch_size * train.grad_accum_steps,
                                            tokens_per_sample=per_sample, repeats=train.repeats,
                                            data_parallel=run.rank.dims.data_parallel)
    summary.update(loss_first=mean_loss[0], loss_last=mean_loss[-1], nodes=env.num_nodes, lr=run.setup.lr,
                   restarts=outcome.restarts, warmup_steps_extended=outcome.warmup_steps_extended)
    if run.setup.tuning is not None and run.setup.tuning.compile:
        summary[COMPILE_TIME_S] = max(compile_time_s(r["history"]) for r in per_rank)
    foreign = foreign_cpu_share([r["interference"]["cpu_window"] for r in per_rank])
    if foreign is not None:
        summary[FOREIGN_CPU_SHARE] = foreign
    gpu = [r["interference"]["gpu"] for r in per_rank if r["interference"]["gpu"]]
    if gpu:
        summary[FOREIGN_GPU_SHARE] = max(g[FOREIGN_GPU_SHARE] for g in gpu)
        summary[GPU_UTIL_MEAN] = sum(g[GPU_UTIL_MEAN] for g in gpu) / len(gpu)
    for unit, throughput in (("samples", summary[THROUGHPUT_SAMPLES_PER_S]),
                             ("tokens", summary.get("throughput_tokens_per_s"))):
        price = cost_per_1m(throughput, devices=env.world_size, nodes=env.num_nodes,
                            cost_per_device_hour=spec.cost_per_device_hour,
                            cost_per_node_hour=spec.cost_per_node_hour) if throughput else None
        if price is not None:
            summary[f"cost_per_1m_{unit}"] = price
    return summary


def compile_time_s(history: dict[str, Any]) -> float:
    """torch.compile's cost on one rank: how much longer the warm-up's steps took than the measured
    steps' median, summed (compiling happens in the first steps; the window holds none of it).
    Measured on the rank's portable history (jobs.schedule.History.portable)."""
    steady = [t for t, m in zip(history["step_time_s"], history["measured"], strict=True) if m]
    if not steady:
        return 0.0
    median = percentile(steady, 50)
    return sum(max(0.0, t - median) for t, m in zip(history["step_time_s"], history["measured"], strict=True)
               if not m)


def run_tags(run: Run, per_rank: list[dict[str, Any]], outcome: Outcome, summary: dict[str, Any],
             extra_tags: dict[str, str]) -> dict[str, str]:
    """Where and how the job ran: hosts, versions, backend, precision mode, MFU, GPUs, resume."""
    import torch

    from contract.mlflow_client import TAG_MAX_CHARS
    from jobs.dist import backend_for
    from jobs.models import units_text

    rank, par = run.rank, run.setup.par
    env, device = rank.env, rank.device
    tags = {"hostnames": ",".join(sorted({r["hostname"] for r in per_rank})), "torch_version": str(torch.__version__),
            "backend": rank.backend, "process_group_backend": backend_for(device.type),
            "precision_mode": par.plan.mode, "world_size": str(env.world_size),
            "num_threads": str(torch.get_num_threads()), "layout_source": env.source, "master_addr": env.master_addr,
            "master_port": str(env.master_port), "job_id": env.job_id, RESTARTS: str(outcome.restarts),
            **provenance(torch, device), **extra_tags}
    if run.setup.tuning is not None:
        tags.update(run.setup.tuning.tags())
    tags.update(par.compile_plan.tags())
    tags["shard_units"] = units_text(par.model)[:TAG_MAX_CHARS]  # what FSDP wrapped, or would have
    if outcome.graphs_in_window:
        # torch.compile compiled inside the measured window: those steps held compilation.
        tags["compile.graphs_in_window"] = str(outcome.graphs_in_window)
    tags.update(mfu_figures(run, summary, [r.get("matmul_peak") for r in per_rank]))
    if rank.gpu_uuids:
        tags["gpu_uuids"] = ",".join(f"{host}/{uuid}" for host, uuid in rank.gpu_uuids)[:TAG_MAX_CHARS]
    if summary.get("fp16_skipped_steps"):
        # A skipped step costs no optimizer update: inside the window it makes the window look cheap.
        tags["fp16_skipped_in_window"] = "true"
    if outcome.resumed_from_step is not None:
        tags["resumed_from_step"] = str(outcome.resumed_from_step)
    if outcome.checkpoints_in_window:
        # Its peak memory (host RSS above all) includes staging a checkpoint (GPU review 3, G10).
        tags["checkpoints_in_window"] = str(outcome.checkpoints_in_window)
    return tags


def gpu_figures(device, per_rank: list[dict[str, Any]], summary: dict[str, Any], tags: dict[str, str],
                nvml_missing: str | None, samples_in_window: float) -> list[dict[str, Any]]:
    """Energy of the window into ``summary`` (``energy_j``, ``energy_j_per_sample``, ``power_w_mean``;
    jobs.energy.energy_figures) and the why-not tags into ``tags``; returns the job's GPU system
    metrics for rank 0 to log. Off CUDA, or without NVML, no figure and a tag that says why."""
    from contract.mlflow_client import TAG_MAX_CHARS
    from jobs import energy

    if device.type != "cuda":
        tags["energy_missing"] = f"{device.type} ranks: energy is measured on CUDA devices only (NVML)"
        return []
    if nvml_missing:
        tags["energy_missing"] = nvml_missing
        tags["system_metrics_missing"] = nvml_missing
        return []
    interference = [r["interference"] for r in per_rank]
    joules, energy_tags = energy.energy_figures([i.get("gpu_energy") for i in interference], samples_in_window)
    summary.update(joules)
    tags.update(energy_tags)
    series = [i.get("gpu_series") for i in interference]
    refused = sorted({f"{what}: {why}" for s in series if s for what, why in s["unsupported"].items()})
    if refused:
        tags["nvml_refused"] = "; ".join(refused)[:500]
    # Which physical GPU each system/node<N>/gpu<I>_ name stands for.
    tags["system_metrics_devices"] = ",".join(
        f"node{s['node_id']}/gpu{s['device_index']}={r['hostname']}" for s, r in zip(series, per_rank, strict=True)
        if s)[:TAG_MAX_CHARS]
    return energy.system_records(series)


def mfu_figures(run: Run, summary: dict[str, Any], matmul_peaks=()) -> dict[str, str]:
    """Adds ``mfu`` (datasheet peak) and ``mfu_measured_peak`` (the matmul peak measured on each
    device before the window, jobs/matmul_peak.py) to the summary when known and at most 1;
    returns the tags that explain them, each formula included."""
    import torch

    from jobs import matmul_peak, models, peaks

    spec, device, model = run.rank.spec, run.rank.device, run.setup.par.model
    flops = models.flops_per_sample(model, spec.model)
    if flops:
        summary[FLOPS_PER_SAMPLE] = flops
    settings = peaks.precision_settings(torch)
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        precision = spec.precision.name.value
        # The same answer the measured peak was timed in (jobs.matmul_peak.math_mode).
        math = matmul_peak.math_mode(torch, model, precision)
        peak = peaks.peak_flops_for(device_name, precision, math)
        settings["peak_flops_math"] = math
    else:
        device_name, peak = platform.processor() or "cpu", None  # CPUs have no single meaningful peak
    per_device = summary[THROUGHPUT_SAMPLES_PER_S_PER_DEVICE]
    achieved, reason = peaks.mfu_checked(flops, per_device, peak)
    settings["mfu_formula"] = ("flops_per_sample x throughput_samples_per_s_per_device / peak_flops_per_s "
                               f"(datasheet peak for {device_name!r}, {settings.get('peak_flops_math', 'no math mode')})")
    if achieved is not None:
        summary["mfu"] = achieved
        summary["peak_flops_per_s"] = peak
    elif reason:
        settings["mfu_missing"] = reason
    measured_tflops, why = peaks.measured_peak(list(matmul_peaks))
    if measured_tflops is not None:
        first = matmul_peaks[0]
        summary[MEASURED_MATMUL_TFLOPS] = measured_tflops
        settings["mfu_measured_formula"] = (
            "flops_per_sample x throughput_samples_per_s_per_device / (measured_matmul_tflops x 1e12); "
            f"measured_matmul_tflops: mean over the job's devices of 2*n^3 x {first['iterations']} / time of "
            f"{first['iterations']} {first['dtype']} {first['n']}x{first['n']} matmuls (after warm-ups, CUDA events"
            f"{', TF32 allowed' if first.get('tf32') else ''}), timed on each device before the window")
        settings["measured_peak_math"] = str(first.get("math", first["dtype"]))
        achieved, why = peaks.mfu_checked(flops, per_device, measured_tflops * 1e12)
        if achieved is not None:
            summary["mfu_measured_peak"] = achieved
    if why:
        settings["mfu_measured_missing"] = why
    return {"device_name": device_name, **settings}


def provenance(torch, device) -> dict[str, str]:
    """Versions and the environment variables that change what a benchmark measures (the rank
    layout, Slurm's variables included, is jobs/dist.py's alone and is tagged from DistEnv)."""
    from contract.mlflow_client import TAG_MAX_CHARS

    tags = {"python_version": platform.python_version(), "python_executable": sys.executable,
            "cuda_version": str(torch.version.cuda), "hostname_rank0": platform.node()}
    if device.type == "cuda":
        tags["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        tags["device_count"] = str(torch.cuda.device_count())
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("NCCL_", "TORCH_", "OMP_", "CUDA_VISIBLE_DEVICES", "GLOO_", "MKL_"))}
    tags["env"] = json.dumps(env)[:TAG_MAX_CHARS]
    return tags


def rank_figures(run: Run, outcome: Outcome, window_memory: dict[str, float], comm_figures: dict[str, float],
                 local_step_time_s: list[float]) -> dict[str, Any]:
    """What this rank contributes to the gather after the window: its step and data times, history,
    memory, model state, communication figures, interference samples and matmul peak."""
    from jobs.memory import model_state_bytes

    env, setup = run.rank.env, run.setup
    history = outcome.history
    mine: dict[str, Any] = {
        "step_time_s": history.measured_only("step_time_s"), "data_time_s": history.measured_only("data_time_s"),
        "history": history.portable(),
        "hostname": env.hostname, "master": f"{env.master_addr}:{env.master_port}", **window_memory, **setup.memory,
        **model_state_bytes(setup.par.model, setup.optimizer, grad_bytes=setup.trainer.grad_bytes),
        **comm_figures,
        "interference": run.interference.portable(env.hostname, env.node_rank),
        "local_step_time_s": local_step_time_s, "matmul_peak": setup.matmul,
    }
    if setup.par.scaler is not None:
        mine.update(skipped_steps(mine["history"]))
    return mine
