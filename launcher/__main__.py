"""``python -m launcher [-m] key=value ...``: compose -> validate -> plan -> submit.

Thin on purpose: the work lives in plan.py (grid, validation, resources), sweep.py (tracking,
submission, waiting) and report.py (the comparison table).
"""

from __future__ import annotations

import sys
from typing import List, Optional

HELP = """\
usage: python -m launcher [-m] [key=value ...]

Run benchmark grid points of distributed training (DDP / FSDP) and compare them.

  -m, --multirun     expand comma-separated values into a grid (strategy=ddp,fsdp nodes=1,2)
  -h, --help         this help

config groups (launcher/conf/):
{groups}
top-level settings: nodes, batch_size (per device), steps, warmup_steps, repeats, grad_accum_steps,
  seed, optimizer (adamw|sgd), lr, lr_scaling (none|linear|sqrt), activation_checkpointing,
  compile, sync_batchnorm, output_root, sweep_dir, wait, collective_timeout_s
any value: group.key=value, e.g. cluster.tasks_per_node=2 strategy.bucket_cap_mb=50

examples:
  python -m launcher -m strategy=ddp,fsdp nodes=1,2
  python -m launcher -m strategy=ddp,fsdp,zero2,hsdp precision=fp32,bf16 nodes=2
  python -m launcher -m cluster=slurm cluster.partition=gpu cluster.gpus_per_node=8 \\
      cluster.tasks_per_node=8 model=gpt2-small strategy=ddp,fsdp nodes=1,2,4
"""


def _groups() -> str:
    from launcher.plan import CONF_DIR

    lines = []
    for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        options = sorted(p.stem for p in group.glob("*.yaml"))
        if options:
            lines.append(f"  {group.name:<10} {', '.join(options)}")
    return "\n".join(lines)


def check_tracking(cfg) -> None:
    """A sweep that must log to MLflow refuses to start when the store cannot be reached."""
    if not cfg.tracking.enabled:
        return
    from pathlib import Path

    from launcher.plan import SweepError
    from launcher.tracking import check_reachable, default_uri

    root = Path(cfg.output_root)
    uri = cfg.tracking.uri or default_uri(root)
    if not cfg.tracking.uri and not root.exists():
        return  # the default store is created under output_root
    problem = check_reachable(uri)
    if problem:
        raise SweepError(f"tracking.uri={uri!r}: {problem}. Fix: start the server (mlflow server ...), fix the URI, "
                         f"or run without MLflow (tracking=off).")


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(HELP.format(groups=_groups()))
        return 0
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    unknown = [a for a in overrides if a.startswith("-")]
    if unknown:
        print(f"error: unknown option {unknown[0]}; nothing was submitted. Fix: see python -m launcher --help.",
              file=sys.stderr)
        return 2

    from launcher.plan import SweepError, compose, expand, plan

    try:
        points, swept = expand(overrides, multirun)
        cells = plan(compose(points, swept))
        if cells[0].config.cluster.name.value == "slurm":
            from launcher.slurm import check_partitions

            check_partitions(cells)
        check_tracking(cells[0].config)
    except SweepError as exc:
        from launcher.safety import mask

        print(f"error: invalid configuration; nothing was submitted.\n{mask('', str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # Hydra's parser errors on malformed overrides
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0]}\nnothing was submitted. "
              f"Fix: write overrides as key=value (see --help).", file=sys.stderr)
        return 2

    from launcher import sweep

    try:
        return sweep.run(cells, ["python -m launcher", *args])
    except SweepError as exc:
        print(f"error: {exc}\nnothing was submitted.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
