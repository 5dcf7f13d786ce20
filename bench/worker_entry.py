"""Our side of the throughput and telemetry benchmarks: jobs.worker.main under torchrun.

    torchrun --standalone --nproc-per-node 2 bench/worker_entry.py --strategy ddp --out-dir DIR \
        [--tracking-uri sqlite:///... --run-id ID]

Takes the same arguments as bench/bare_loop.py, builds the RunSpec the launcher would ship, and
calls the worker's real entry point (jobs.dist reads torchrun's environment). Timers are wrapped
around a few worker functions from outside, so the worker runs unmodified:

* the measured window: through the worker's timing hook (``jobs.worker.main(spec, on_window=...)``),
  from the barrier that opens the window to the end of the last step, so whatever the worker does
  between measured steps counts (the bare loop times its window the same way, wall clock after the
  same barrier);
* each step's start (``Trainer.step``), for the median step cycle time, start to start;
* telemetry on rank 0: ``summary.gather_ranks``, ``summary.summarize``, each sink call (JSONL and
  MLflow fan-out), and everything from the end of the window to the end of ``benchmark()``
  (loss read, memory and model-state figures, FLOPs, records, tags);
* MLflow client start-up (``MlflowSink.client``: import and store opening), at the end of the job.

Each rank writes ``bench-rank<R>.json`` into the run directory; the worker itself writes its usual
``result.json`` and ``metrics.jsonl`` there.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import time
from pathlib import Path

SCRIPT_START_UNIX_S = time.time()

TIMES_S: dict = {}
STEP_STARTS: list = []


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES_S[name] = TIMES_S.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def on_window(event: str) -> None:
    """The worker's timing hook: wall and CPU time of the measured window."""
    TIMES_S[f"_window_{event}"], TIMES_S[f"_cpu_{event}"] = time.perf_counter(), time.process_time()
    TIMES_S[f"_faults_{event}"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def install_timers(warmup_steps: int, total_steps: int) -> None:
    import jobs.loop
    import jobs.sinks
    import jobs.worker

    # Each step's start, through the one call every step makes whatever the loop around it looks like.
    trainer_step = jobs.loop.Trainer.step

    def timed_step(self, *args, **kwargs):
        STEP_STARTS.append(time.perf_counter())
        return trainer_step(self, *args, **kwargs)

    jobs.loop.Trainer.step = timed_step
    # The worker imports these by name: the names in jobs.worker are the ones it calls.
    jobs.worker.gather_ranks = _timed("gather_s", jobs.worker.gather_ranks)
    jobs.worker.summarize = _timed("summarize_s", jobs.worker.summarize)
    for method in ("set_tags", "log_steps", "log_summary", "finish"):
        setattr(jobs.sinks.FanOut, method, _timed(f"sink_{method}_s", getattr(jobs.sinks.FanOut, method)))
    jobs.sinks.MlflowSink.client = _timed("mlflow_client_start_s", jobs.sinks.MlflowSink.client)
    if _has_module("jobs.comm"):
        import jobs.comm

        # Extra profiled steps after the window: a measurement of its own, reported apart.
        jobs.comm.probe = _timed("comm_probe_s", jobs.comm.probe)

    benchmark = jobs.worker.benchmark

    def timed_benchmark(*args, **kwargs):
        out = benchmark(*args, **kwargs)
        end = TIMES_S.pop("_window_end")
        TIMES_S["window_s"] = end - TIMES_S.pop("_window_start")
        # CPU time of the whole process over the window, as bare_loop.py measures it.
        TIMES_S["cpu_window_s"] = TIMES_S.pop("_cpu_end") - TIMES_S.pop("_cpu_start")
        # Page faults over the window (memory the allocator returned to the OS and touches again).
        TIMES_S["minor_faults_window"] = TIMES_S.pop("_faults_end") - TIMES_S.pop("_faults_start")
        # Step cycle times, start to start, over the measured steps (as bare_loop.py computes them).
        starts = STEP_STARTS[warmup_steps:total_steps]
        TIMES_S["median_cycle_s"] = statistics.median(b - a for a, b in zip(starts, starts[1:] + [end], strict=True))
        TIMES_S["after_window_s"] = time.perf_counter() - end
        return out

    jobs.worker.benchmark = timed_benchmark


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--model", default="gpt_tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--tracking-uri")
    p.add_argument("--run-id")
    p.add_argument("--profile", action="store_true", help="cProfile rank 0 into <out-dir>/profile-rank0.pstats")
    args = p.parse_args()

    import torch

    from jobs.spec import (
        DataSpec,
        Layout,
        ModelSpec,
        PrecisionSpec,
        RunSpec,
        Strategy,
        StrategySpec,
        TrainSpec,
    )
    from jobs.worker import main as worker_main

    install_timers(args.warmup_steps, args.steps)
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    spec = RunSpec(
        cell=f"bench strategy={args.strategy}", out_dir=args.out_dir,
        strategy=StrategySpec(name=Strategy(args.strategy)), precision=PrecisionSpec(),
        model=ModelSpec(name=args.model, seq_len=args.seq_len, vocab_size=args.vocab_size), data=DataSpec(),
        train=TrainSpec(batch_size=args.batch_size, steps=args.steps, warmup_steps=args.warmup_steps, lr=args.lr,
                        seed=args.seed),
        # GPUs when the host has them, one per rank, as bench/bare_loop.py runs (the worker follows
        # the layout, not torch.cuda.is_available()).
        layout=Layout(nodes=max(1, world // local_world), tasks_per_node=local_world,
                      gpus_per_node=local_world if torch.cuda.is_available() else 0,
                      cpus_per_task=int(os.environ.get("OMP_NUM_THREADS", "1"))),
        tracking_uri=args.tracking_uri, run_id=args.run_id,
    )
    rank = int(os.environ["RANK"])
    if args.profile and rank == 0:
        import cProfile

        profiler = cProfile.Profile()
        result = profiler.runcall(worker_main, spec, on_window=on_window)
        profiler.dump_stats(str(Path(args.out_dir, "profile-rank0.pstats")))
    else:
        result = worker_main(spec, on_window=on_window)
    record = {"rank": rank, "script_start_unix_s": SCRIPT_START_UNIX_S,
              "samples_in_window": args.batch_size * (args.steps - args.warmup_steps), **TIMES_S}
    if rank == 0:
        record["reported_throughput_samples_per_s"] = result["summary"]["throughput_samples_per_s"]
        record["first_step_unix_s"] = result.get("first_step_unix_s")
    Path(args.out_dir, f"bench-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
