"""The benchmark suite: every comparison side by side in one run, one table, BENCH_RESULTS.md.

    python -m bench            # the whole suite (a few minutes on 2 cores)
    python -m bench --quick    # fewer repeats and steps
    python -m bench --only throughput,startup

Figures (each a ratio of ours to a reference measured in the same run, alternating ABBA):
  1. worker throughput vs a bare hand-written DDP / FSDP2 loop (torchrun, same settings)
  1c. the same, paired: both step paths alternating in blocks inside one torchrun job
  2. telemetry's share of the measured step time (same runs as 1, real SQLite MLflow run)
  3. command start -> first training step: python -m launcher (local) vs torchrun + bare loop
  4. a 16-cell Slurm sweep: start -> last cell accepted by sbatch, vs hydra-submitit-launcher 1.2.0
  5. --help and config composition import neither torch nor mlflow
  6. a 1000-cell Slurm sweep and status over it, vs hydra-submitit-launcher (a cluster whose
     MaxArraySize admits 1000 tasks; otherwise reported as skipped, with the reason)

Figure 4 needs a Slurm cluster (SLURM_CONF exported) and hydra-submitit-launcher
(pip install -e '.[bench]'); without them it is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from bench import imports, paired, slurm_submit, startup, thousand, throughput
from bench.common import PYTHON, REPO, Row, Settings, machine, render_table

FIGURES = {"throughput": throughput, "paired": paired, "startup": startup, "slurm": slurm_submit, "imports": imports,
           "thousand": thousand}


def probe_device() -> dict[str, object]:
    """Torch version and accelerator, asked of a fresh interpreter (this one keeps torch out)."""
    code = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
            "'cuda': c, 'gpus': torch.cuda.device_count() if c else 0, "
            "'name': torch.cuda.get_device_name(0) if c else 'cpu'}))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true", help="2 repeats, shorter runs")
    p.add_argument("--repeats", type=int, help="repeats per side (default 4, --quick 2)")
    p.add_argument("--only", help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--nproc", type=int, help="ranks (default: the GPUs, else 2)")
    p.add_argument("--threads", type=int, help="threads per rank (default: cores / ranks)")
    p.add_argument("--model", help="a GPT-family model name (default: gpt_tiny on CPU, gpt2-small on GPU)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--batch-size", type=int, help="per rank (default 8)")
    p.add_argument("--steps", type=int, help="steps per throughput run, warm-up included (default 60, --quick 40)")
    p.add_argument("--warmup-steps", type=int, help="default 10")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                   help="pin each rank to its own cores in the throughput runs (default: on for CPU ranks when "
                   "ranks x threads fit the cores)")
    p.add_argument("--quiet-wait", type=float, help="seconds each measured run may wait for other processes to "
                   "leave the cores (default 60, --quick 20; 0: never wait)")
    p.add_argument("--work", type=Path, help="where runs write (default outputs/bench/<date>_<time>)")
    p.add_argument("--results", type=Path, default=REPO / "BENCH_RESULTS.md", help="the results file to write")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    only = [x.strip() for x in args.only.split(",")] if args.only else list(FIGURES)
    unknown = [x for x in only if x not in FIGURES]
    if unknown:
        print(f"error: unknown figure {unknown[0]}; pick from {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    device = probe_device()
    gpu = bool(device["cuda"])
    nproc = args.nproc or (int(device["gpus"]) if gpu else 2)
    settings = Settings(
        nproc=nproc,
        threads=args.threads or max(1, (os.cpu_count() or 1) // nproc),
        model=args.model or ("gpt2-small" if gpu else "gpt_tiny"),
        seq_len=args.seq_len or (1024 if gpu else 128),
        vocab_size=args.vocab_size or (50257 if gpu else 4096),
        batch_size=args.batch_size or 8,
        # Telemetry is a per-job constant (~50 ms here), so its share depends on the window: 50
        # measured steps of ~0.15 s is a short benchmark run, and long enough for a stable median.
        steps=args.steps or (40 if args.quick else 60),
        warmup_steps=args.warmup_steps if args.warmup_steps is not None else 10,
        repeats=args.repeats or (2 if args.quick else 4),
        quick=args.quick,
        quiet_wait_s=args.quiet_wait if args.quiet_wait is not None else (20.0 if args.quick else 60.0),
        work=args.work or REPO / "outputs" / "bench" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S"),
    )
    cores = os.cpu_count() or 1
    settings.pin = args.pin if args.pin is not None else (not gpu and settings.nproc * settings.threads <= cores
                                                          and bool(shutil.which("taskset")))
    settings.work.mkdir(parents=True, exist_ok=True)
    info = machine(str(device["torch"]), f"{device['gpus']} x {device['name']}" if gpu else "cpu (gloo)")
    command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
    print(f"bench: {command}\n  {info['cpu']}, {info['cores']} cores, torch {info['torch']}, {info['device']}; "
          f"{settings.nproc} ranks x {settings.threads} threads, {settings.model}, batch {settings.batch_size}/rank, "
          f"{settings.repeats} repeats{', ranks pinned' if settings.pin else ''}; work dir {settings.work}", flush=True)

    rows: list[Row] = []
    details: dict[str, object] = {}
    t0 = time.perf_counter()
    for name in only:
        print(f"[{name}]", flush=True)
        t = time.perf_counter()
        new_rows, new_details = FIGURES[name].run(settings, lambda msg: print(msg, flush=True))
        rows.extend(new_rows)
        details[name] = new_details
        print(f"  ({time.perf_counter() - t:.0f} s)", flush=True)
    elapsed = time.perf_counter() - t0
    info["load average at end (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    table = render_table(rows)
    print(f"\n{table}\n\nsuite time: {elapsed:.0f} s")
    (settings.work / "results.json").write_text(json.dumps(
        {"command": command, "machine": info, "settings": {k: str(v) for k, v in vars(settings).items()},
         "rows": [vars(r) for r in rows], "details": details}, indent=1, default=str))
    if not args.no_write:
        from bench.results import write_results

        write_results(args.results, command=command, info=info, settings=settings, rows=rows, details=details,
                      elapsed_s=elapsed, measured=only)
        print(f"results: {args.results}")
    failed = [r for r in rows if r.passed is False]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
