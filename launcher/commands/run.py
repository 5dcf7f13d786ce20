"""``python -m launcher [-m] key=value ...``: compose -> validate -> plan -> submit.

Thin on purpose: the work lives in launcher/plan/ (grid, validation, resources), sweep.py
(tracking, submission, waiting) and launcher/report/ (the comparison table).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.commands import listing
from launcher.commands.command import USER_ERROR_EXIT, Command, Parser, Refused

HELP = """\
usage: python -m launcher [-m] [--plan] [--config-dir DIR] [key=value ...]
       (installed: ddp-fsdp-bench [-m] ...)

Run benchmark grid points of distributed training (DDP / FSDP) and compare them.

  -m, --multirun     expand comma-separated values into a grid (strategy=ddp,fsdp nodes=1,2)
  --plan             compose and check everything, print the cells, their resources, predicted
                     per-rank model state and the sbatch calls; submit and create nothing
  --config-dir DIR   also look for configs in DIR (a site's cluster/*.yaml, experiment/*.yaml)
  --allow-concurrent start even when the same sweep (same command, same output_root) is still running
  -h, --help         this help

config groups (launcher/conf/):
{groups}
top-level settings: nodes, batch_size (per device), steps, warmup_steps, runs (N or auto: runs_min,
  runs_max, runs_budget_min, baseline; docs/deciding.md), cells (all or auto: a pilot, then only the
  cells that can still win; cells_max, cells_budget_min), repeats, grad_accum_steps,
  seed, optimizer (adamw|sgd), lr, lr_scaling (none|linear|sqrt), activation_checkpointing,
  sync_batchnorm, output_root, sweep_dir, wait, collective_timeout_s, allow_oom; the step's tuning,
  each auto by device (docs/configuration.md): compile, optimizer_impl, channels_last,
  cudnn_benchmark, loss, step_timing
named experiments: +experiment=NAME (the grid comes with it), e.g.
  python -m launcher -m +experiment=resnet50_ddp_vs_fsdp_cpu
any value: group.key=value, e.g. cluster.tasks_per_node=2 strategy.bucket_cap_mb=50

examples:
  python -m launcher -m strategy=ddp,fsdp nodes=1,2
  python -m launcher -m strategy=ddp,fsdp,zero2,hsdp precision=fp32,bf16 nodes=2
  python -m launcher -m cluster=slurm cluster.partition=gpu cluster.gpus_per_node=8 \\
      cluster.tasks_per_node=8 model=gpt2-small strategy=ddp,fsdp nodes=1,2,4
  python -m launcher --plan -m cluster.declared=true cluster.gpus_per_node=2 cluster.tasks_per_node=2 \\
      cluster.gpu_mem_gib=22.35 model=gpt2-xl batch_size=1 strategy=ddp,fsdp   (does it fit on 24 GB GPUs?)

the commands (each with --help):
{commands}
"""


def _groups() -> str:
    from launcher.plan.grid import CONF_DIR

    lines = []
    for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        options = sorted(p.stem for p in group.glob("*.yaml"))
        if options:
            lines.append(f"  {group.name:<10} {', '.join(options)}")
    return "\n".join(lines)


class RunCommand(Command):
    name = "run"
    nothing = "nothing was submitted"

    def help(self) -> str:
        return HELP.format(groups=_groups(), commands=listing())

    def add_arguments(self, parser: Parser) -> None:
        parser.add_argument("-m", "--multirun", action="store_true")
        parser.add_argument("--plan", action="store_true")
        parser.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR")
        parser.add_argument("--allow-concurrent", action="store_true")
        parser.add_argument("overrides", nargs="*", metavar="key=value")

    def run(self, args: argparse.Namespace) -> int:
        for d in args.config_dir:
            if not d or not Path(d).is_dir():
                raise Refused(f"--config-dir {d!r} is not a directory; nothing was submitted. Fix: give a directory "
                              f"holding the site's configs (cluster/*.yaml, experiment/*.yaml).")
        return launch(args, self.argv)


main = RunCommand.main


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Compose, check and plan the grid; print the plan (--plan) or run the sweep, recorded as the
    command line ``argv`` (a later forecast reads the sweep's own settings from it)."""
    from launcher import preflight
    from launcher.masking import mask
    from launcher.plan import grid, planner

    try:
        extra = grid.search_path(args.config_dir)
        points, swept = grid.expand(args.overrides, args.multirun, extra)
        cells = planner.plan(grid.compose(points, swept, extra=extra))
        predicted = preflight.check(cells, plan_only=args.plan)
    except grid.SweepError as exc:
        print(f"error: invalid configuration; nothing was submitted.\n{mask('', str(exc))}", file=sys.stderr)
        return USER_ERROR_EXIT
    except Exception as exc:  # Hydra's parser errors on malformed overrides
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0]}\nnothing was submitted. "
              f"Fix: write overrides as key=value (see --help).", file=sys.stderr)
        return USER_ERROR_EXIT
    if args.plan:
        from launcher import preview
        from launcher.cluster.backends import backend_for

        # Declared nodes ask nothing of a cluster, its MaxArraySize included.
        size = None if cells[0].cluster.declared else backend_for(cells[0].cluster.name).max_array_size(cells)
        print(preview.render(cells, predicted, size))
        return 0

    from launcher import sweep

    try:
        return sweep.run(cells, ["python -m launcher", *argv], predicted, allow_concurrent=args.allow_concurrent)
    except grid.SweepError as exc:
        print(f"error: {exc}\nnothing was submitted.", file=sys.stderr)
        return USER_ERROR_EXIT
