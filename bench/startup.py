"""Figure 3: from typing the command to the first training step, launcher vs torchrun.

Ours: ``python -m launcher strategy=ddp cluster.tasks_per_node=2 ...`` on the local cluster
(compose, validate, MLflow runs in a SQLite store, submitit's local executor, the worker on two
ranks); the worker records the wall clock at the start of its first step (``first_step_unix_s``
in result.json). Reference: ``torchrun --standalone --nproc-per-node 2 bench/bare_loop.py``,
which records the same instant. Both clocks are the same machine's ``time.time()``; the start is
taken by this process right before it spawns the command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    PYTHON,
    REPO,
    TORCHRUN,
    Row,
    Settings,
    bench_env,
    ratio_of_medians,
    read_result,
    run_logged,
    wait_for_quiet,
)

TARGET = 1.3
# Enough steps for the first one to be a real training step; the rest only has to finish quickly.
STEPS, WARMUP_STEPS = 3, 1


def launcher_overrides(settings: Settings, work: Path, sweep_dir: Path) -> list[str]:
    """Our side's command line after ``python -m launcher``: the settings the bare loop gets."""
    return ["strategy=ddp", f"cluster.tasks_per_node={settings.nproc}", f"model={settings.model}",
            f"model.seq_len={settings.seq_len}", f"model.vocab_size={settings.vocab_size}", f"batch_size={settings.batch_size}", f"steps={STEPS}", f"warmup_steps={WARMUP_STEPS}", "repeats=1",
            "runs=1", f"output_root={work}", f"sweep_dir={sweep_dir}"]


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    work = settings.work / "startup"
    work.mkdir(parents=True, exist_ok=True)
    env = bench_env(settings.threads)
    ours: list[float] = []
    bare: list[float] = []
    busy: list[float] = []

    def run_ours(i: int) -> None:
        sweep_dir = work / f"ours-{i}"
        proc = run_logged([PYTHON, "-m", "launcher", *launcher_overrides(settings, work, sweep_dir)],
                          work / f"ours-{i}.log", env, check=False)
        results = list(sweep_dir.glob("cells/*/result.json"))
        result = read_result(results[0] if results else sweep_dir / "cells" / "result.json", proc)
        ours.append(json.loads(result)["first_step_unix_s"] - proc.start_unix_s)

    def run_bare(i: int) -> None:
        out = work / f"bare-{i}.json"
        proc = run_logged([TORCHRUN, "--standalone", "--nproc-per-node", str(settings.nproc),
                           str(REPO / "bench" / "bare_loop.py"), "--strategy", "ddp", "--out", str(out),
                           *settings.train_args(steps=STEPS, warmup_steps=WARMUP_STEPS)], work / f"bare-{i}.log", env,
                          check=False)
        bare.append(json.loads(read_result(out, proc))["first_step_unix_s"] - proc.start_unix_s)

    # One untimed run of each first: the MLflow store is created once (as on any machine that has
    # run a sweep before) and both sides start with warm file caches.
    log("  warm-up: one untimed run of each")
    run_ours(-1)
    run_bare(-1)
    ours.clear()
    bare.clear()
    log(f"  {settings.repeats} x (launcher, torchrun), ABBA order")
    for i in range(settings.repeats):
        order = ((run_ours, ours, "launcher"), (run_bare, bare, "torchrun"))
        for fn, values, name in (order if i % 2 == 0 else order[::-1]):
            busy.append(wait_for_quiet(settings.quiet_wait_s, log))
            fn(i)
            log(f"    {name} #{i + 1}: {values[-1]:.2f} s to the first step")
    ratio = ratio_of_medians(ours, bare)
    row = Row(figure=f"3. command start -> first training step, local {settings.nproc}-rank DDP job",
              unit="s", ours=ours, reference=bare, target=f"ratio <= {TARGET}",
              passed=None if ratio is None else ratio <= TARGET, ratio=ratio,
              note="reference: torchrun running bench/bare_loop.py")
    return [row], {"busy_cores_at_start": busy}


if __name__ == "__main__":
    import sys

    from bench.common import render_table

    rows, _ = run(Settings(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 1), print)
    print(render_table(rows))
