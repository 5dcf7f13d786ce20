"""The entry point submitit runs on every rank: layout -> process group -> benchmark -> sinks.

``main(spec)`` is deliberately thin; :func:`benchmark` builds the model, wraps it, runs the
warm-up and measured windows and reduces the measurements across ranks.
"""

from __future__ import annotations

import json
import os
import platform
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.dist import DistEnv, backend_for, check_unique_gpus, choose_device, gpu_uuid, process_group
from jobs.heartbeat import Heartbeat
from jobs.mlflow_entry import TAG_MAX_CHARS
from jobs.preempt import Preempted, listen
from jobs.sinks import RUN_ID_FILE, FanOut, JsonlSink, MlflowSink, NullSink
from jobs.spec import Precision, RunSpec, Strategy
from jobs.summary import (
    foreign_cpu_share,
    gather_ranks,
    mean_losses,
    skipped_steps,
    step_records,
    stragglers,
    summarize,
)

RESULT_FILE = "result.json"
METRICS_FILE = "metrics.jsonl"


def main(spec: RunSpec, on_window=None) -> dict[str, Any]:
    """Run one cell on this rank. ``on_window(event)``: a timing hook, called with "start" when the
    measured window opens (after its barrier) and "end" after its last step (bench/ uses it)."""
    listen()  # a stop request sent while the model is built still stops the job (jobs/preempt.py)
    env = DistEnv.detect(os.environ, spec.layout.tasks_per_node if spec.emulate_nodes else None)
    import torch

    # Threads per rank chosen on purpose (torchrun would silently set 1): the cores of the task.
    torch.set_num_threads(max(1, spec.layout.cpus_per_task))
    device, backend = resolve_device(spec.layout.gpus_per_node, env)
    out = Path(spec.out_dir)
    sink: NullSink = NullSink()
    if env.is_head:
        jsonl = JsonlSink(out / METRICS_FILE)
        sinks: list = [jsonl]
        if spec.tracking_uri:  # the run id comes with the spec, or later in a file (Slurm: created after sbatch)
            sinks.append(MlflowSink(spec.tracking_uri, spec.run_id, out / RUN_ID_FILE))
        sink = FanOut(*sinks, logged_steps=jsonl.logged_steps())
    heartbeat = Heartbeat(out, env.rank, env.hostname, stall_timeout_s=spec.collective_timeout_s)
    try:
        with process_group(env, backend_for(device.type), timeout_s=spec.collective_timeout_s,
                           device=device if device.type == "cuda" else None) as control_group:
            gpu_uuids = check_gpu_placement(env, device, control_group)
            result = benchmark(spec, env, device, backend, sink, heartbeat, control_group, gpu_uuids=gpu_uuids,
                               on_window=on_window)
    except Preempted as exc:
        # Not a failure: the checkpoint is saved and the run stays open; the job resumes from it
        # when Slurm requeues it (or when its cell is resubmitted).
        heartbeat.close("preempted")
        if env.is_head and not exc.requeued:
            (out / "preempted.txt").write_text(f"rank {env.rank} on {env.hostname}: {exc}\n")
        raise
    except BaseException as exc:
        heartbeat.close("failed")
        error = f"rank {env.rank} on {env.hostname} failed: {type(exc).__name__}: {exc}"
        sink.finish("FAILED", error)
        (out / f"error-rank{env.rank}.txt").write_text(error + "\n\n" + traceback.format_exc())
        raise
    heartbeat.close("finished")
    if env.is_head:
        (out / RESULT_FILE).write_text(json.dumps(result, indent=2, sort_keys=True))
    sink.finish("FINISHED")
    return result


def resolve_device(gpus_per_node: int, env: DistEnv):
    """This rank's device and collective backend, from the configuration (jobs.dist.choose_device);
    on CUDA the device is made current before the process group exists."""
    import torch

    visible = torch.cuda.device_count() if gpus_per_node > 0 else 0
    name, backend = choose_device(gpus_per_node, *machine_slot(env), visible)
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, backend


def machine_slot(env: DistEnv) -> tuple[int, int]:
    """(this rank's index among the ranks on its machine, how many there are). The local cluster
    emulates nodes as groups of local processes on ONE machine: there every rank of the job shares
    the machine's GPUs, so the global rank picks the GPU, not the emulated node's local rank."""
    if env.source == "submitit-local":
        return env.rank, env.world_size
    return env.local_rank, env.local_world_size


def check_gpu_placement(env: DistEnv, device, group=None) -> list:
    """Collective on CUDA: every rank's (host, GPU UUID), gathered over ``group`` (the gloo control
    group: no NCCL traffic before the check); fails when two ranks share a GPU."""
    if device.type != "cuda":
        return []
    import torch.distributed as dist

    placements: list = [None] * env.world_size
    dist.all_gather_object(placements, (env.hostname, gpu_uuid(device)), group=group)
    check_unique_gpus(placements)
    return placements


def refuse_unsupported(spec: RunSpec, device) -> None:
    """Settings this device cannot run, refused before anything is built."""
    import torch

    if spec.train.sync_batchnorm and device.type != "cuda":
        # The launcher refuses this before submitting; a RunSpec built by hand gets the same answer
        # here instead of torch's error from inside the first forward.
        raise ValueError("sync_batchnorm=true needs CUDA ranks: PyTorch's SyncBatchNorm refuses CPU input. "
                         "Set sync_batchnorm=false or run on GPU nodes.")
    if spec.precision.name is Precision.bf16 and device.type == "cuda":
        from jobs.parallel import bf16_refusal

        problem = bf16_refusal(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
        if problem:
            raise ValueError(problem)


def build_model(spec: RunSpec, device):
    """The model, ready for :func:`jobs.parallel.parallelize`: on ``device`` for DDP, on meta for
    FSDP (sharded before any memory is allocated; see jobs/parallel.py); a ``_target_`` model
    eagerly on the host for both (jobs.models.build_for)."""
    import torch

    from jobs import models

    # Same seed on every rank: identical initial weights (DDP broadcasts them anyway, FSDP
    # initialises its shards from the same draws; jobs.parallel.exact_sharded_init).
    torch.manual_seed(spec.train.seed)
    model = models.build_for(spec.model, device, sharded=spec.strategy.name is Strategy.fsdp)
    if spec.train.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if spec.train.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        models.replace_units(model, lambda unit: checkpoint_wrapper(unit, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return model


@dataclass
class Setup:
    """What the measured steps run on, built once per job."""

    par: Any  # jobs.parallel.Parallelized
    optimizer: Any
    batches: Any
    trainer: Any
    lr: float
    memory: dict[str, float]  # setup_memory: what building and wrapping cost
    matmul: Any  # the device's measured matmul peak (CUDA), or None


def benchmark(spec: RunSpec, env: DistEnv, device, backend: str, sink: NullSink, heartbeat: Heartbeat,
              control_group=None, gpu_uuids=(), on_window=None) -> dict[str, Any]:
    """Build, run the schedule, measure after the window, reduce and log: a few named steps.
    ``on_window(event)``: called with "start"/"end" around the measured window (jobs.schedule.Hooks;
    timing harnesses use it)."""
    import torch

    from jobs import health, memory
    from jobs.interference import Interference

    refuse_unsupported(spec, device)
    built = set_up(spec, env, device)
    # CUDA steps end on the device: this is the sync point of every measured step on GPU.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    interference = Interference(device)
    outcome = run_schedule(spec, env, device, built, sync, sink, heartbeat, control_group,
                           window_hook(interference, on_window))
    # A run that trained on NaN, or not at all, is not a measurement: fail before any probe.
    history = outcome.history
    health.check(history.losses(), history.measured, history.skipped(), env.rank, control_group)
    # Peak memory of the measured window, read before the probe's profiler can add to it.
    window_memory = memory.peak_memory(device)
    mine = after_window(spec, env, device, built, sync, heartbeat, outcome, interference, window_memory)
    per_rank = gather_ranks(mine)
    return report(spec, env, device, backend, sink, built.par, per_rank, outcome, built.lr, gpu_uuids,
                  interference.missing)


def set_up(spec: RunSpec, env: DistEnv, device) -> Setup:
    """Model (on meta for FSDP), wrapping, matmul peak, optimizer, data and the step."""
    import torch

    from jobs import matmul_peak, memory, parallel
    from jobs.data import input_batches
    from jobs.loop import Trainer, scaled_lr

    train = spec.train
    rss_before = memory.current_rss_bytes()
    memory.reset_peak_memory(device)
    par = parallel.parallelize(build_model(spec, device), spec.strategy, spec.precision, device=device,
                               num_nodes=env.num_nodes, tasks_per_node=env.local_world_size, compile=train.compile)
    setup_bytes = memory.setup_memory(device, rss_before)
    # The device's own matmul peak (CUDA only, ~a second), in the math the model's main ops run in
    # (so known only now): after the setup's memory is read, its buffers freed before the window
    # resets the peak counters.
    matmul = matmul_peak.measure(device, spec.precision.name.value,
                                 matmul_peak.math_mode(torch, par.model, spec.precision.name.value))
    lr = scaled_lr(train.lr, train.lr_scaling, env.world_size)
    optimizer = parallel.build_optimizer(par.model, train.optimizer, lr)
    batches = input_batches(spec.data, spec.model, batch_size=train.batch_size, accum_steps=train.grad_accum_steps,
                            seed=train.seed, rank=env.rank, world_size=env.world_size, device=device)
    trainer = Trainer(par.model, optimizer, accum_steps=train.grad_accum_steps, autocast_dtype=par.autocast_dtype,
                      device=device, no_sync=par.no_sync, scaler=par.scaler)
    return Setup(par, optimizer, batches, trainer, lr, setup_bytes, matmul)


def window_hook(interference, on_window) -> Callable[[str], None]:
    """Other processes on this rank's cores and GPU are sampled at the window's boundaries (CPU) and on
    a thread during it (GPU): never inside a step, and no collective (jobs/interference.py). Our
    samples sit outside the caller's: its "start" comes after ours, its "end" before ours, so a
    timing harness never times them."""
    caller = on_window or (lambda event: None)

    def hook(event: str) -> None:
        if event == "start":
            interference.event(event)
            caller(event)
        else:
            caller(event)
            interference.event(event)

    return hook


def run_schedule(spec: RunSpec, env: DistEnv, device, built: Setup, sync, sink: NullSink, heartbeat: Heartbeat,
                 control_group, on_window: Callable[[str], None]):
    """Warm-up, the measured window, checkpoints and resume (jobs/schedule.py)."""
    from jobs import memory, schedule

    train = spec.train

    def log_before_stop(history, logged_through: int, step: int) -> int:
        # Collective: the steps so far reach JSONL and MLflow before the job stops, so the run's
        # step history stays continuous across a requeue.
        histories = gather_ranks(history.portable())
        # Steps before a layout change live only in the old ranks' histories: log from what all have.
        first = max([logged_through] + [h["steps"][0] for h in histories])
        sink.log_steps(step_records(histories, first, step))
        sink.flush()
        return step

    return schedule.run(
        built.trainer, built.batches, env=env, device=device, out_dir=Path(spec.out_dir),
        schedule=schedule.Schedule(total_steps=train.steps, warmup_steps=train.warmup_steps,
                                   accum_steps=train.grad_accum_steps,
                                   every_steps=spec.checkpoint.every_steps if spec.checkpoint.enabled else 0,
                                   warmup_extend_max=train.warmup_extend_max,
                                   save_on_stop=spec.checkpoint.enabled),
        hooks=schedule.Hooks(sync=sync, on_step=heartbeat.beat, on_checkpoint=log_before_stop,
                             reset_peak_memory=lambda: memory.reset_peak_memory(device), on_window=on_window),
        control_group=control_group,
    )


def after_window(spec: RunSpec, env: DistEnv, device, built: Setup, sync, heartbeat: Heartbeat, outcome,
                 interference, window_memory: dict[str, float]) -> dict[str, Any]:
    """This rank's measurements: its window, the communication and straggler probes (after the window,
    outside every figure), memory, model state and interference samples."""
    from jobs import memory

    train = spec.train
    comm_figures = communication_probe(built.trainer, built.batches, sync, train.comm_probe_steps, env, device,
                                       heartbeat)
    local_s = []
    if env.world_size > 1 and train.local_probe_steps:
        from jobs.loop import local_step_times

        heartbeat.pause()  # after the window: not part of any measurement, and not a stall
        local_s = local_step_times(built.trainer, built.batches, train.local_probe_steps, sync)
    heartbeat.pause()  # the final reduction and logging are not stalls
    history = outcome.history
    mine: dict[str, Any] = {
        "step_time_s": history.measured_only("step_time_s"), "data_time_s": history.measured_only("data_time_s"),
        "history": history.portable(),
        "hostname": env.hostname, "master": f"{env.master_addr}:{env.master_port}", **window_memory, **built.memory,
        **memory.model_state_bytes(built.par.model, built.optimizer, grad_bytes=built.trainer.grad_bytes),
        **comm_figures,
        "interference": interference.portable(env.hostname, env.node_rank),
        "local_step_time_s": local_s, "matmul_peak": built.matmul,
    }
    if built.par.scaler is not None:
        mine.update(skipped_steps(mine["history"]))
    return mine


def communication_probe(trainer, batches, sync, n_steps: int, env: DistEnv, device, heartbeat) -> dict[str, float]:
    """The profiled steps after the window (jobs/comm.py), with the stall watchdog paused: parsing
    the trace can take longer than the stall timeout, and it is not a stall."""
    if not n_steps or env.world_size <= 1:
        return {}
    from jobs import comm
    from jobs.loop import StepTrace, run_steps

    heartbeat.pause()
    probe_trace = StepTrace()
    return comm.probe(lambda n: run_steps(trainer, batches, n, sync, probe_trace), n_steps,
                      on_gpu=device.type == "cuda")


def report(spec: RunSpec, env: DistEnv, device, backend: str, sink: NullSink, par, per_rank, outcome, lr: float,
           gpu_uuids, gpu_interference_missing=None) -> dict[str, Any]:
    """Reduce the ranks' measurements into the summary, records and tags; log them (rank 0's sink)."""
    train = spec.train
    histories = [r["history"] for r in per_rank]
    # Steps run: the configured ones plus any warm-up extension (the window keeps its length).
    total_steps = train.steps + outcome.warmup_steps_extended
    mean_loss = mean_losses(histories, total_steps)
    summary, extra_tags = reduce_summary(spec, env, per_rank, outcome, lr, mean_loss)
    system = _gpu_figures(device, per_rank, summary, extra_tags, gpu_interference_missing,
                          samples_in_window=train.batch_size * train.grad_accum_steps * summary["measured_steps"]
                          * env.world_size)
    if "foreign_gpu_share" not in summary and gpu_interference_missing:
        extra_tags["gpu_interference_missing"] = gpu_interference_missing
    rank_medians_s, local_medians_s = _stragglers(per_rank, summary, extra_tags)
    tags = run_tags(spec, env, device, backend, par, per_rank, outcome, summary, gpu_uuids, extra_tags)
    first_logged = max(outcome.logged_through, max(h["steps"][0] for h in histories))
    sink.set_tags(tags)
    sink.log_steps(step_records(histories, first_logged, total_steps))
    sink.log_summary(summary)
    if system:
        sink.log_system(system)
    return {"cell": spec.cell, "summary": summary, "tags": tags, "losses": mean_loss, "rank": env.rank,
            "first_step_unix_s": outcome.first_step_unix_s,
            # What each rank used to rendezvous: all equal, or the job could not have run.
            "rank_masters": [r["master"] for r in per_rank], "rank_hosts": [r["hostname"] for r in per_rank],
            # Each rank's own median step time (the summary's step times are the slowest rank's).
            "rank_step_time_ms_p50": [1e3 * m for m in rank_medians_s],
            # Each rank's own work per step without gradient communication (names the straggler).
            "rank_local_step_time_ms_p50": [1e3 * m for m in local_medians_s] if local_medians_s else None}


def reduce_summary(spec: RunSpec, env: DistEnv, per_rank, outcome, lr: float,
                   mean_loss: list[float]) -> tuple[dict[str, Any], dict[str, str]]:
    """The job's figures from every rank's (throughput, step times, memory, interference, cost)."""
    from jobs import cost
    from jobs.data import samples_unit

    train = spec.train
    _, per_sample = samples_unit(spec.model)
    summary = summarize(per_rank, samples_per_step=train.batch_size * train.grad_accum_steps,
                                tokens_per_sample=per_sample, repeats=train.repeats)
    summary.update(loss_first=mean_loss[0], loss_last=mean_loss[-1], nodes=env.num_nodes, lr=lr,
                   restarts=outcome.restarts, warmup_steps_extended=outcome.warmup_steps_extended)
    foreign = foreign_cpu_share([r["interference"]["cpu_window"] for r in per_rank])
    if foreign is not None:
        summary["foreign_cpu_share"] = foreign
    gpu = [r["interference"]["gpu"] for r in per_rank if r["interference"]["gpu"]]
    if gpu:
        summary["foreign_gpu_share"] = max(g["foreign_gpu_share"] for g in gpu)
        summary["gpu_util_mean"] = sum(g["gpu_util_mean"] for g in gpu) / len(gpu)
    for unit, throughput in (("samples", summary["throughput_samples_per_s"]),
                             ("tokens", summary.get("throughput_tokens_per_s"))):
        price = cost.cost_per_1m(throughput, devices=env.world_size, nodes=env.num_nodes,
                                 cost_per_device_hour=spec.cost_per_device_hour,
                                 cost_per_node_hour=spec.cost_per_node_hour) if throughput else None
        if price is not None:
            summary[f"cost_per_1m_{unit}"] = price
    return summary, {}


def _stragglers(per_rank, summary: dict[str, Any], tags: dict[str, str]) -> tuple[list[float], list[float]]:
    """Each rank's median step time, and its own work's (empty where not measured); the spread into
    ``summary`` and the slowest / straggling rank into ``tags``."""
    from jobs import stats

    rank_medians_s = [stats.percentile(r["step_time_s"], 50) for r in per_rank]
    # Synchronous steps take every rank as long as the slowest, so stragglers are named from each
    # rank's own work (jobs.loop.local_step_times) where it was measured, else from step times.
    by_local = all(r["local_step_time_s"] for r in per_rank)
    local_medians_s = [stats.percentile(r["local_step_time_s"], 50) for r in per_rank] if by_local else []
    spread, straggler_tags = stragglers(local_medians_s if by_local else rank_medians_s,
                                                [r["hostname"] for r in per_rank])
    summary.update(spread)
    tags.update(straggler_tags, straggler_measure="local_step_time" if by_local else "step_time")
    return rank_medians_s, local_medians_s


def run_tags(spec: RunSpec, env: DistEnv, device, backend: str, par, per_rank, outcome, summary: dict[str, Any],
             gpu_uuids, extra_tags: dict[str, str]) -> dict[str, str]:
    """Where and how the job ran: hosts, versions, backend, precision mode, MFU, GPUs, resume."""
    import torch

    tags = {"hostnames": ",".join(sorted({r["hostname"] for r in per_rank})), "torch_version": str(torch.__version__),
            "backend": backend, "process_group_backend": backend_for(device.type), "precision_mode": par.plan.mode,
            "world_size": str(env.world_size), "num_threads": str(torch.get_num_threads()),
            "layout_source": env.source, "master_addr": env.master_addr, "master_port": str(env.master_port),
            "job_id": env.job_id, "restarts": str(outcome.restarts), **_provenance(torch, device), **extra_tags}
    tags.update(_mfu(spec, device, par, summary, [r.get("matmul_peak") for r in per_rank]))
    if gpu_uuids:
        tags["gpu_uuids"] = ",".join(f"{host}/{uuid}" for host, uuid in gpu_uuids)[:TAG_MAX_CHARS]
    if summary.get("fp16_skipped_steps"):
        # A skipped step costs no optimizer update: inside the window it makes the window look cheap.
        tags["fp16_skipped_in_window"] = "true"
    if outcome.resumed_from_step is not None:
        tags["resumed_from_step"] = str(outcome.resumed_from_step)
    if outcome.checkpoints_in_window:
        # Its peak memory (host RSS above all) includes staging a checkpoint (GPU review 3, G10).
        tags["checkpoints_in_window"] = str(outcome.checkpoints_in_window)
    return tags


def _gpu_figures(device, per_rank, summary: dict[str, Any], tags: dict[str, str], nvml_missing: str | None,
                 samples_in_window: float) -> list[dict[str, Any]]:
    """Energy of the window into ``summary`` (``energy_j``, ``energy_j_per_sample``, ``power_w_mean``;
    jobs.energy.energy_figures) and the why-not tags into ``tags``; returns the job's GPU system
    metrics for rank 0 to log. Off CUDA, or without NVML, no figure and a tag that says why."""
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


def _mfu(spec: RunSpec, device, par, summary: dict[str, Any], matmul_peaks=()) -> dict[str, str]:
    """Adds ``mfu`` (datasheet peak) and ``mfu_measured_peak`` (the matmul peak measured on each
    device before the window, jobs/matmul_peak.py) to the summary when known and at most 1;
    returns the tags that explain them, each formula included."""
    import torch

    from jobs import matmul_peak, models, peaks

    flops = models.flops_per_sample(par.model, spec.model)
    settings = peaks.precision_settings(torch)
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        precision = spec.precision.name.value
        # The same answer the measured peak was timed in (jobs.matmul_peak.math_mode).
        math = matmul_peak.math_mode(torch, par.model, precision)
        peak = peaks.peak_flops_for(device_name, precision, math)
        settings["peak_flops_math"] = math
    else:
        device_name, peak = platform.processor() or "cpu", None  # CPUs have no single meaningful peak
    per_device = summary["throughput_samples_per_s_per_device"]
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
        summary["measured_matmul_tflops"] = measured_tflops
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


def _provenance(torch, device) -> dict[str, str]:
    """Versions and the environment variables that change what a benchmark measures (the rank
    layout, Slurm's variables included, is jobs/dist.py's alone and is tagged from DistEnv)."""
    tags = {"python_version": platform.python_version(), "cuda_version": str(torch.version.cuda),
            "hostname_rank0": platform.node()}
    if device.type == "cuda":
        tags["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        tags["device_count"] = str(torch.cuda.device_count())
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("NCCL_", "TORCH_", "OMP_", "CUDA_VISIBLE_DEVICES", "GLOO_", "MKL_"))}
    tags["env"] = json.dumps(env)[:TAG_MAX_CHARS]
    return tags


class Worker:
    """What submitit pickles and calls on every rank.

    Preemption is handled inside the step loop (jobs/schedule.py, jobs/preempt.py), where all ranks
    can agree and save together, not in submitit's per-process signal handler.
    """

    def __call__(self, spec: RunSpec) -> dict[str, Any]:
        return main(spec)
