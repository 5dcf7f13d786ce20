"""One rank of one cell (``python -m jobs spec.json`` calls :func:`main`, under every backend): layout ->
process group -> benchmark -> sinks. Preemption is handled inside the step loop (jobs/schedule.py,
jobs/preempt.py), where all ranks can agree and save together, not in a launcher's signal handler.

Orchestration only, as named steps: ``main(spec)`` places the rank and opens its sinks;
:func:`benchmark` builds the model (:func:`set_up`), runs the schedule (:func:`run_schedule`),
measures after the window (:func:`after_window`), gathers every rank's figures and hands them to
jobs/summary.py, the one owner of the run's measurements, then logs its report
(:func:`log_report`). A rank's run travels as one typed object (jobs/rankrun.py); a timing harness
observes the named points through jobs/hooks.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract import records
from contract.cell_run import METRICS_FILE
from contract.spec import InputKind, OptimizerImpl, Precision, RunSpec, Strategy
from jobs.dist import DistEnv, backend_for, check_gpu_placement, process_group, resolve_device
from jobs.heartbeat import Heartbeat
from jobs.hooks import Observer
from jobs.preempt import Preempted, listen
from jobs.rankrun import Rank, Run, Setup
from jobs.sinks import FanOut, JsonlSink, MlflowSink, NullSink
from jobs.summary import Report, gather_ranks, rank_figures, report, step_records

if TYPE_CHECKING:
    from contract.tuning import Tuning
    from jobs.schedule import Outcome

RESULT_FILE = "result.json"


def main(spec: RunSpec, observer: Observer | None = None) -> dict[str, Any]:
    """Run one cell on this rank. ``observer``: a timing harness's hooks (jobs/hooks.py); by
    default nothing observes."""
    started_s = time.time()  # the job's start as its MLflow run shows it (contract/cell_run.py)
    listen()  # a stop request sent while the model is built still stops the job (jobs/preempt.py)
    env = DistEnv.detect(os.environ)
    import torch

    # Threads per rank chosen on purpose (torchrun would silently set 1): the cores of the task.
    torch.set_num_threads(max(1, spec.layout.cpus_per_task))
    device, backend = resolve_device(spec.layout.gpus_per_node, env)
    observer = observer or Observer()
    out = Path(spec.out_dir)
    sink = open_sinks(spec, env, observer, started_s)
    heartbeat = Heartbeat(out, env.rank, env.hostname, stall_timeout_s=spec.collective_timeout_s)
    try:
        with process_group(env, backend_for(device.type), timeout_s=spec.collective_timeout_s,
                           device=device if device.type == "cuda" else None) as control_group:
            gpu_uuids = check_gpu_placement(env, device, control_group)
            result = benchmark(Rank(spec, env, device, backend, sink, heartbeat, observer, control_group, gpu_uuids))
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
        records.write_document(out / RESULT_FILE, result, indent=2)  # atomic: a status never reads half
    with observer.phase("sink_finish"):
        sink.finish("FINISHED")
    return result


def open_sinks(spec: RunSpec, env: DistEnv, observer: Observer, started_s: float) -> NullSink:
    """Rank 0's sinks (JSONL, which records the attempt's start first, and MLflow when tracked); a
    NullSink on every other rank."""
    if not env.is_head:
        return NullSink()
    out = Path(spec.out_dir)
    jsonl = JsonlSink(out / METRICS_FILE)
    jsonl.log_start(started_s)
    sinks: list[NullSink] = [jsonl]
    if spec.tracking_uri:  # the run id comes with the spec, or is found (or made) in the cell's directory
        sinks.append(MlflowSink(spec.tracking_uri, spec.run_id, out, observer=observer))
    return FanOut(*sinks, logged_steps=jsonl.logged_steps())


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


def resolve_tuning(spec: RunSpec, env: DistEnv, device) -> Tuning:
    """The step's tuning settings resolved for the device this rank got (contract/tuning.py: the
    launcher resolved them for the device it planned); a value it cannot run fails the rank with the
    setting's own message, before anything is built."""
    from contract.tuning import resolve

    return resolve(spec.train, spec.strategy, spec.model, cuda=device.type == "cuda", world_size=env.world_size,
                   tasks_per_node=env.local_world_size)


def build_model_to_wrap(spec: RunSpec, device, tuning: Tuning | None = None):
    """The model, ready for :func:`jobs.parallel.parallelize`: on ``device`` for DDP, on meta for
    FSDP (sharded before any memory is allocated; see jobs/parallel.py); a ``_target_`` model
    eagerly on the host for both (jobs.models.build_for). Its vocabulary padded as ``tuning`` says."""
    import torch

    from jobs import models

    # Same seed on every rank: identical initial weights (DDP broadcasts them anyway, FSDP
    # initialises its shards from the same draws; jobs.parallel.exact_sharded_init).
    torch.manual_seed(spec.train.seed)
    model_spec = spec.model if tuning is None else dataclasses.replace(spec.model, vocab_multiple=tuning.vocab_multiple)
    model = models.build_for(model_spec, device, sharded=spec.strategy.name is Strategy.fsdp)
    if spec.train.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if spec.train.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        models.replace_units(model, lambda unit: checkpoint_wrapper(unit, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return model


def benchmark(rank: Rank) -> dict[str, Any]:
    """Build, run the schedule, measure after the window, reduce and log: a few named steps."""
    import torch

    from jobs.interference import Interference

    refuse_unsupported(rank.spec, rank.device)
    # CUDA steps end on the device: this is the sync point of every measured step on GPU.
    sync = torch.cuda.synchronize if rank.device.type == "cuda" else (lambda: None)
    run = Run(rank, set_up(rank), Interference(rank.device), sync)
    outcome = run_schedule(run)
    with rank.observer.phase("after_window"):
        mine = after_window(run, outcome)
        with rank.observer.phase("gather"):
            per_rank = gather_ranks(mine)
        with rank.observer.phase("reduce"):
            reported = report(run, outcome, per_rank)
        log_report(rank, reported)
    return reported.result


def set_up(rank: Rank, compile_backend: Any = "inductor") -> Setup:
    """Model (on meta for FSDP), wrapping, matmul peak, optimizer, data and the step.
    ``compile_backend``: inductor, or a trace-only backend that counts graphs (bench/census.py)."""
    import torch

    from jobs import matmul_peak, memory, parallel
    from jobs.data import input_batches
    from jobs.loop import Trainer, scaled_lr

    spec, env, device = rank.spec, rank.env, rank.device
    train = spec.train
    tuning = resolve_tuning(spec, env, device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = tuning.cudnn_benchmark
    rss_before = memory.current_rss_bytes()
    memory.reset_peak_memory(device)
    par = parallel.parallelize(build_model_to_wrap(spec, device, tuning), spec.strategy, spec.precision, device=device,
                               dims=rank.dims, compile=tuning.compile, compile_backend=compile_backend,
                               reshard_after_forward=tuning.reshard_after_forward, channels_last=tuning.channels_last)
    setup_bytes = memory.setup_memory(device, rss_before)
    # The device's own matmul peak (CUDA only, ~a second), in the math the model's main ops run in
    # (so known only now): after the setup's memory is read, its buffers freed before the window
    # resets the peak counters.
    matmul = matmul_peak.measure(device, spec.precision.name.value,
                                 matmul_peak.math_mode(torch, par.model, spec.precision.name.value))
    lr = scaled_lr(train.lr, train.lr_scaling, rank.dims.data_parallel)  # the ranks that read different batches
    optimizer, impl = parallel.optimizer_for(par.model, train.optimizer, lr, tuning.optimizer_impl,
                                             auto=OptimizerImpl(train.optimizer_impl) is OptimizerImpl.auto)
    tuning = dataclasses.replace(tuning, optimizer_impl=impl)
    batches = input_batches(spec.data, spec.model, batch_size=train.batch_size, accum_steps=train.grad_accum_steps,
                            seed=train.seed, rank=rank.dims.data_rank(env.rank),
                            world_size=rank.dims.data_parallel, device=device, channels_last=tuning.channels_last)
    padded = tuning.vocab_multiple > 1 and spec.model.input is InputKind.tokens
    trainer = Trainer(par.model, optimizer, accum_steps=train.grad_accum_steps, autocast_dtype=par.autocast_dtype,
                      device=device, no_sync=par.no_sync, scaler=par.scaler,
                      vocab=spec.model.vocab_size if padded else None, chunked_loss=tuning.loss == "chunked",
                      events=tuning.step_timing == "events", step_forward=par.step_forward)
    return Setup(par, optimizer, batches, trainer, lr, setup_bytes, matmul, tuning)


def window_hook(run: Run) -> Callable[[str], None]:
    """Other processes on this rank's cores and GPU are sampled at the window's boundaries (CPU) and on
    a thread during it (GPU): never inside a step, and no collective (jobs/interference.py). Our
    samples sit outside the observer's: its "start" comes after ours, its "end" before ours, so a
    timing harness never times them."""
    interference, observer = run.interference, run.rank.observer

    def hook(event: str) -> None:
        if event == "start":
            interference.event(event)
            observer.window(event)
        else:
            observer.window(event)
            interference.event(event)

    return hook


def run_schedule(run: Run) -> Outcome:
    """Warm-up, the measured window, checkpoints and resume (jobs/schedule.py)."""
    from jobs import memory, schedule

    rank, setup = run.rank, run.setup
    spec, sink = rank.spec, rank.sink
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
        setup.trainer, setup.batches, env=rank.env, device=rank.device, out_dir=Path(spec.out_dir),
        schedule=schedule.Schedule(total_steps=train.steps, warmup_steps=train.warmup_steps,
                                   accum_steps=train.grad_accum_steps,
                                   every_steps=spec.checkpoint.every_steps if spec.checkpoint.enabled else 0,
                                   warmup_extend_max=train.warmup_extend_max,
                                   save_on_stop=spec.checkpoint.enabled),
        hooks=schedule.Hooks(sync=run.sync, on_step=rank.heartbeat.beat, on_checkpoint=log_before_stop,
                             reset_peak_memory=lambda: memory.reset_peak_memory(rank.device),
                             on_window=window_hook(run), before_step=rank.observer.step_start),
        control_group=rank.control_group,
    )


def after_window(run: Run, outcome: Outcome) -> dict[str, Any]:
    """This rank's measurements after the window: the run's health (agreed by all ranks), the window's
    peak memory, the communication and straggler probes (outside every figure), and what it
    contributes to the gather (jobs.summary.rank_figures)."""
    from jobs import brokenrun, memory

    rank = run.rank
    history = outcome.history
    # A run that trained on NaN, or not at all, is not a measurement: fail before any probe.
    with rank.observer.phase("health_check"):
        brokenrun.check(history.losses(), history.measured, history.skipped(), rank.env.rank, rank.control_group)
    # Peak memory of the measured window, read before the probe's profiler can add to it.
    window_memory = memory.peak_memory(rank.device)
    with rank.observer.phase("comm_probe"):
        comm_figures = communication_probe(run)
    with rank.observer.phase("local_probe"):
        local_s = local_probe(run)
    rank.heartbeat.pause()  # the final reduction and logging are not stalls
    with rank.observer.phase("rank_figures"):
        return rank_figures(run, outcome, window_memory, comm_figures, local_s)


def communication_probe(run: Run) -> dict[str, float]:
    """The profiled steps after the window (jobs/anatomy.py: communication figures and the step's
    anatomy; at every world size, one rank included), with the stall watchdog paused: parsing the trace can take longer than the stall
    timeout, and it is not a stall."""
    n_steps, env = run.rank.spec.train.comm_probe_steps, run.rank.env
    # At one rank too: nothing is communicated, and the anatomy shows where a wrapper's time goes.
    if not n_steps:
        return {}
    from jobs import anatomy
    from jobs.loop import StepTrace, run_steps

    run.rank.heartbeat.pause()
    probe_trace = StepTrace()
    trainer, batches = run.setup.trainer, run.setup.batches
    # Synced per step whatever step_timing says: the probe's parts are read from the host's timeline.
    return anatomy.probe(lambda n: run_steps(trainer, batches, n, run.sync, probe_trace, events=False), trainer, n_steps,
                         on_gpu=run.rank.device.type == "cuda", world_size=env.world_size)


def local_probe(run: Run) -> list[float]:
    """Each rank's own work per step, without gradient communication (jobs.loop.local_step_times):
    what names a straggler. After the window, with the stall watchdog paused."""
    n_steps = run.rank.spec.train.local_probe_steps
    if run.rank.env.world_size <= 1 or not n_steps:
        return []
    from jobs.loop import local_step_times

    run.rank.heartbeat.pause()  # after the window: not part of any measurement, and not a stall
    return local_step_times(run.setup.trainer, run.setup.batches, n_steps, run.sync)


def log_report(rank: Rank, reported: Report) -> None:
    """Rank 0's sinks get the report (every other rank's sink is a NullSink)."""
    sink, observer = rank.sink, rank.observer
    with observer.phase("sink_set_tags"):
        sink.set_tags(reported.tags)
    with observer.phase("sink_log_steps"):
        sink.log_steps(reported.steps)
    with observer.phase("sink_log_summary"):
        sink.log_summary(reported.summary)
    if reported.system:
        with observer.phase("sink_log_system"):
            sink.log_system(reported.system)

