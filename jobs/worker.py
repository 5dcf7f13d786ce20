"""The entry point submitit runs on every rank: layout -> process group -> benchmark -> sinks.

``main(spec)`` is deliberately thin; :func:`benchmark` builds the model, wraps it, runs the
warm-up and measured windows and reduces the measurements across ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import traceback
from pathlib import Path
from typing import Any, Dict

from jobs.dist import DistEnv, process_group
from jobs.heartbeat import Heartbeat
from jobs.preempt import Preempted
from jobs.sinks import RUN_ID_FILE, FanOut, JsonlSink, MlflowSink, NullSink
from jobs.spec import Optimizer, Precision, RunSpec, Sharding, Strategy

RESULT_FILE = "result.json"
METRICS_FILE = "metrics.jsonl"


def main(spec: RunSpec) -> Dict[str, Any]:
    env = DistEnv.detect(os.environ, spec.layout.tasks_per_node if spec.emulate_nodes else None)
    import torch

    # Threads per rank chosen on purpose (torchrun would silently set 1): the cores of the task.
    torch.set_num_threads(max(1, spec.layout.cpus_per_task))
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
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
        with process_group(env, backend, timeout_s=spec.collective_timeout_s) as control_group:
            result = benchmark(spec, env, device, backend, sink, heartbeat, control_group)
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


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def benchmark(spec: RunSpec, env: DistEnv, device, backend: str, sink: NullSink, heartbeat: Heartbeat,
              control_group=None) -> Dict[str, Any]:
    import torch

    from jobs import metrics, models, parallel, schedule
    from jobs.data import input_batches, samples_unit
    from jobs.loop import Trainer, scaled_lr

    train, strat, prec = spec.train, spec.strategy, spec.precision
    if train.sync_batchnorm and device.type != "cuda":
        # The launcher refuses this before submitting; a RunSpec built by hand gets the same answer
        # here instead of torch's error from inside the first forward.
        raise ValueError("sync_batchnorm=true needs CUDA ranks: PyTorch's SyncBatchNorm refuses CPU input. "
                         "Set sync_batchnorm=false or run on GPU nodes.")
    # Same seed on every rank: identical initial weights (DDP broadcasts them anyway, FSDP
    # shards a model every rank built identically).
    torch.manual_seed(train.seed)
    model = models.build_model(spec.model)
    if train.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    if train.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        models.replace_units(model, lambda unit: checkpoint_wrapper(unit, checkpoint_impl=CheckpointImpl.NO_REENTRANT))

    low = None if prec.name is Precision.fp32 else parallel.torch_dtype(prec.name.value)
    autocast_dtype, scaler = None, None
    if strat.name is Strategy.ddp:
        model = parallel.apply_ddp(
            model, device, bucket_cap_mb=strat.bucket_cap_mb, gradient_as_bucket_view=strat.gradient_as_bucket_view,
            static_graph=strat.static_graph, find_unused_parameters=strat.find_unused_parameters,
            broadcast_buffers=strat.broadcast_buffers,
        )
        autocast_dtype, no_sync = low, model.no_sync
        if prec.name is Precision.fp16:
            scaler = torch.amp.GradScaler(device.type)
    else:
        mesh = parallel.fsdp_mesh(device.type, strat.sharding, env.num_nodes, env.local_world_size)
        param_dtype = parallel.torch_dtype(prec.param_dtype.value) if prec.param_dtype else low
        reduce_dtype = parallel.torch_dtype(prec.reduce_dtype.value) if (prec.reduce_dtype and low) else None
        model = parallel.apply_fsdp(
            model, mesh, units=models.shard_units(model) if strat.wrap.value == "block" else [],
            reshard_after_forward=strat.sharding is not Sharding.grad_op,
            param_dtype=param_dtype, reduce_dtype=reduce_dtype, cpu_offload=strat.cpu_offload, prefetch=strat.prefetch,
        )
        no_sync = lambda: _fsdp_no_sync(model)  # noqa: E731
        if prec.name is Precision.fp16:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler = ShardedGradScaler(device.type)
    if train.compile:
        model = torch.compile(model)

    lr = scaled_lr(train.lr, train.lr_scaling, env.world_size)
    if train.optimizer is Optimizer.adamw:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    batches = input_batches(spec.data, spec.model, batch_size=train.batch_size, accum_steps=train.grad_accum_steps,
                            seed=train.seed, rank=env.rank, world_size=env.world_size, device=device)
    trainer = Trainer(model, optimizer, accum_steps=train.grad_accum_steps, autocast_dtype=autocast_dtype,
                      device=device, no_sync=no_sync, scaler=scaler)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step_records(history_per_rank, lo: int, hi: int):
        """Per-step records for steps lo..hi-1: mean loss over ranks, the slowest rank's time."""
        out = []
        for step in range(lo, hi):
            idx = [h["steps"].index(step) for h in history_per_rank]
            out.append({"step": step,
                        "loss": sum(h["losses"][i] for h, i in zip(history_per_rank, idx, strict=True)) / len(idx),
                        "step_time_ms": 1e3 * max(h["step_time_s"][i] for h, i in zip(history_per_rank, idx, strict=True))})
        return out

    def log_before_stop(history, logged_through: int, step: int) -> int:
        # Collective: the steps so far reach JSONL and MLflow before the job stops, so the run's
        # step history stays continuous across a requeue.
        histories = metrics.gather_ranks(history.portable())
        # Steps before a layout change live only in the old ranks' histories: log from what all have.
        first = max([logged_through] + [h["steps"][0] for h in histories])
        sink.log_steps(step_records(histories, first, step))
        sink.flush()
        return step

    outcome = schedule.run(
        trainer, batches, model=model, optimizer=optimizer, env=env, device=device, out_dir=Path(spec.out_dir),
        total_steps=train.steps, warmup_steps=train.warmup_steps, accum_steps=train.grad_accum_steps,
        every_steps=spec.checkpoint.every_steps if spec.checkpoint.enabled else 0, sync=sync,
        on_step=heartbeat.beat, on_checkpoint=log_before_stop,
        reset_peak_memory=lambda: metrics.reset_peak_memory(device), control_group=control_group,
    )
    comm_figures = {}
    if train.comm_probe_steps and env.world_size > 1:
        from jobs import comm
        from jobs.loop import StepTrace, run_steps

        probe_trace = StepTrace()
        comm_figures = comm.probe(lambda n: run_steps(trainer, batches, n, sync, probe_trace), train.comm_probe_steps,
                                  on_gpu=device.type == "cuda")
    heartbeat.pause()  # the final reduction and logging are not stalls
    history = outcome.history
    first_step_unix_s = outcome.first_step_unix_s
    mine = {
        "step_time_s": history.measured_only("step_time_s"), "data_time_s": history.measured_only("data_time_s"),
        "history": history.portable(),
        "hostname": env.hostname, "master": f"{env.master_addr}:{env.master_port}", **metrics.peak_memory(device),
        **metrics.model_state_bytes(model, optimizer, grad_bytes=trainer.grad_bytes), **comm_figures,
    }
    per_rank = metrics.gather_ranks(mine)
    unit, per_sample = samples_unit(spec.model)
    summary = metrics.summarize(per_rank, samples_per_step=train.batch_size * train.grad_accum_steps,
                                tokens_per_sample=per_sample, repeats=train.repeats)
    # Every rank has every step when the layout is unchanged since the first start.
    histories = [r["history"] for r in per_rank]
    full = all(h["steps"] == list(range(train.steps)) for h in histories)
    mean_loss = ([sum(h["losses"][i] for h in histories) / len(histories) for i in range(train.steps)] if full
                 else histories[0]["losses"])
    summary.update(loss_first=mean_loss[0], loss_last=mean_loss[-1], nodes=env.num_nodes, lr=lr,
                   restarts=outcome.restarts)
    flops = models.flops_per_sample(model, spec.model)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = metrics.peak_flops_for(device_name, prec.name.value)
    achieved = metrics.mfu(flops, summary["throughput_samples_per_s_per_device"], peak)
    if achieved is not None:
        summary["mfu"] = achieved

    first_logged = max(outcome.logged_through, max(h["steps"][0] for h in histories))
    records = step_records(histories, first_logged, train.steps)
    hosts = sorted({r["hostname"] for r in per_rank})
    tags = {"hostnames": ",".join(hosts), "torch_version": str(torch.__version__), "backend": backend,
            "device_name": device_name, "world_size": str(env.world_size), "num_threads": str(torch.get_num_threads()),
            "layout_source": env.source, "master_addr": env.master_addr, "master_port": str(env.master_port),
            "job_id": env.job_id, "restarts": str(outcome.restarts), **_provenance(torch, device)}
    if outcome.resumed_from_step is not None:
        tags["resumed_from_step"] = str(outcome.resumed_from_step)
    sink.set_tags(tags)
    sink.log_steps(records)
    sink.log_summary(summary)
    return {"cell": spec.cell, "summary": summary, "tags": tags, "losses": mean_loss, "rank": env.rank,
            "first_step_unix_s": first_step_unix_s,
            # What each rank used to rendezvous: all equal, or the job could not have run.
            "rank_masters": [r["master"] for r in per_rank], "rank_hosts": [r["hostname"] for r in per_rank]}


def _provenance(torch, device) -> Dict[str, str]:
    """Versions and the environment variables that change what a benchmark measures (the rank
    layout, Slurm's variables included, is jobs/dist.py's alone and is tagged from DistEnv)."""
    tags = {"python_version": platform.python_version(), "cuda_version": str(torch.version.cuda),
            "hostname_rank0": platform.node()}
    if device.type == "cuda":
        tags["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        tags["device_count"] = str(torch.cuda.device_count())
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("NCCL_", "TORCH_", "OMP_", "CUDA_VISIBLE_DEVICES", "GLOO_", "MKL_"))}
    tags["env"] = json.dumps(env)[:5000]
    return tags


class Worker:
    """What submitit pickles and calls on every rank.

    Preemption is handled inside the step loop (jobs/schedule.py, jobs/preempt.py), where all ranks
    can agree and save together, not in submitit's per-process signal handler.
    """

    def __call__(self, spec: RunSpec) -> Dict[str, Any]:
        return main(spec)
