"""Our side of the throughput and telemetry benchmarks: jobs.worker.main under torchrun.

    torchrun --standalone --nproc-per-node 2 bench/worker_entry.py --strategy ddp --out-dir DIR \
        [--tracking-uri sqlite:///... --run-id ID]

Takes the same arguments as bench/bare_loop.py, builds the RunSpec the launcher would ship, and
calls the worker's real entry point (jobs.dist reads torchrun's environment). Timing goes through
the worker's public hooks (jobs/hooks.py: ``jobs.worker.main(spec, observer=...)``); nothing of
jobs/ is patched, so the worker runs unmodified:

* the measured window: from the barrier that opens the window to the end of the last step, so
  whatever the worker does between measured steps counts (the bare loop times its window the same
  way, wall clock after the same barrier);
* each step's start (``step_start``), for the median step cycle time, start to start;
* telemetry on rank 0: each phase after the window (``jobs.hooks.PHASES``: health check, probes,
  this rank's figures, the gather, the summary, each sink call), and everything from the end of
  the window to the last sink call of ``benchmark()`` (``after_window``);
* MLflow client start-up (import and store opening) and the sinks' ``finish``, at the end of the job.

Each rank writes ``bench-rank<R>.json`` into the run directory; the worker itself writes its usual
``result.json`` and ``metrics.jsonl`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

SCRIPT_START_UNIX_S = time.time()

TIMES_S: dict = {}
STEP_STARTS: list = []


def _timings_class():
    """The worker's timing hooks (jobs.hooks.Observer), filled in here: imported late, so that the
    script's start time is taken before any of jobs/ is imported."""
    from jobs.hooks import Observer

    class Timings(Observer):
        """Wall and CPU time of the measured window, each step's start, each phase after the window."""

        def __init__(self, warmup_steps: int, total_steps: int) -> None:
            self.warmup_steps, self.total_steps = warmup_steps, total_steps

        def step_start(self, step: int) -> None:
            STEP_STARTS.append(time.perf_counter())

        def window(self, event: str) -> None:
            TIMES_S[f"_window_{event}"], TIMES_S[f"_cpu_{event}"] = time.perf_counter(), time.process_time()
            TIMES_S[f"_faults_{event}"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        @contextlib.contextmanager
        def phase(self, name: str) -> Iterator[None]:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                TIMES_S[f"{name}_s"] = TIMES_S.get(f"{name}_s", 0.0) + time.perf_counter() - t0
                if name == "after_window":
                    self._close_window()

        def _close_window(self) -> None:
            end = TIMES_S.pop("_window_end")
            TIMES_S["window_s"] = end - TIMES_S.pop("_window_start")
            # CPU time of the whole process over the window, as bare_loop.py measures it.
            TIMES_S["cpu_window_s"] = TIMES_S.pop("_cpu_end") - TIMES_S.pop("_cpu_start")
            # Page faults over the window (memory the allocator returned to the OS and touches again).
            TIMES_S["minor_faults_window"] = TIMES_S.pop("_faults_end") - TIMES_S.pop("_faults_start")
            # Step cycle times, start to start, over the measured steps (as bare_loop.py computes them).
            starts = STEP_STARTS[self.warmup_steps:self.total_steps]
            TIMES_S["median_cycle_s"] = statistics.median(
                b - a for a, b in zip(starts, starts[1:] + [end], strict=True))
            # From the window's last step to the last sink call of benchmark(), as before the phases
            # were named: the schedule's own closing (stop-request agreement) included.
            TIMES_S["after_window_s"] = time.perf_counter() - end

    return Timings


def parser() -> argparse.ArgumentParser:
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
    return p


def spec_for(args: argparse.Namespace, world: int, local_world: int, gpus: bool, cpus_per_task: int):
    """The RunSpec the launcher would ship for these arguments (its checks run as it is made)."""
    from contract.spec import (
        DataSpec,
        Layout,
        ModelSpec,
        PrecisionSpec,
        RunSpec,
        Strategy,
        StrategySpec,
        TrainSpec,
    )

    return RunSpec(
        cell=f"bench strategy={args.strategy}", out_dir=args.out_dir,
        strategy=StrategySpec(name=Strategy(args.strategy)), precision=PrecisionSpec(),
        model=ModelSpec(name=args.model, seq_len=args.seq_len, vocab_size=args.vocab_size), data=DataSpec(),
        train=TrainSpec(batch_size=args.batch_size, steps=args.steps, warmup_steps=args.warmup_steps, lr=args.lr,
                        seed=args.seed),
        # GPUs when the host has them, one per rank, as bench/bare_loop.py runs (the worker follows
        # the layout, not torch.cuda.is_available()).
        layout=Layout(nodes=max(1, world // local_world), tasks_per_node=local_world,
                      gpus_per_node=local_world if gpus else 0, cpus_per_task=cpus_per_task),
        tracking_uri=args.tracking_uri, run_id=args.run_id,
    )


def main() -> None:
    args = parser().parse_args()

    import torch

    from jobs.worker import main as worker_main

    timings = _timings_class()(args.warmup_steps, args.steps)
    world = int(os.environ["WORLD_SIZE"])
    spec = spec_for(args, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), torch.cuda.is_available(),
                    int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank = int(os.environ["RANK"])
    if args.profile and rank == 0:
        import cProfile

        profiler = cProfile.Profile()
        result = profiler.runcall(worker_main, spec, observer=timings)
        profiler.dump_stats(str(Path(args.out_dir, "profile-rank0.pstats")))
    else:
        result = worker_main(spec, observer=timings)
    record = {"rank": rank, "script_start_unix_s": SCRIPT_START_UNIX_S,
              "samples_in_window": args.batch_size * (args.steps - args.warmup_steps), **TIMES_S}
    if rank == 0:
        record["reported_throughput_samples_per_s"] = result["summary"]["throughput_samples_per_s"]
        record["first_step_unix_s"] = result.get("first_step_unix_s")
    Path(args.out_dir, f"bench-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
