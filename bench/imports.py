"""Figure 5: ``python -m launcher --help`` and config composition import neither torch nor MLflow.

Each check runs in a fresh interpreter: ``--help`` under ``python -X importtime`` (the modules it
imported are read from that report), composition of the 16-cell grid (expand, compose, validate,
plan) in a subprocess that prints ``sys.modules``' heavy entries afterwards. Reference for the
``--help`` time: the Hydra app of the Slurm benchmark (bench/hsl_app) answering ``--help``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable

from bench.common import PYTHON, REPO, Row, Settings, bench_env, ratio_of_medians

HEAVY = ("torch", "mlflow", "submitit", "numpy", "pandas", "sqlalchemy", "matplotlib")
GRID = ["strategy=ddp,fsdp", "precision=fp32,bf16", "nodes=1,2", "seed=0,1", "runs=1"]

COMPOSE = f"""
import json, sys, time
t0 = time.perf_counter()
from launcher.plan.grid import compose, expand, plan
points, swept = expand({GRID!r}, True)
cells = plan(compose(points, swept))
elapsed = time.perf_counter() - t0
print(json.dumps({{"cells": len(cells), "seconds": elapsed,
                  "heavy": sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})}}))
"""


def _wall(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    return time.perf_counter() - t0, proc


def imported_top_level(importtime_report: str) -> list[str]:
    """Top-level packages named in a ``-X importtime`` report (stderr)."""
    names = set()
    for line in importtime_report.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return sorted(names)


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    env = bench_env(settings.threads)
    n = max(5, 2 * settings.repeats)
    ours: list[float] = []
    ref: list[float] = []
    for _ in range(n):
        seconds, proc = _wall([PYTHON, "-m", "launcher", "--help"], env)
        if proc.returncode != 0 or "usage: python -m launcher" not in proc.stdout:
            raise RuntimeError(f"python -m launcher --help failed:\n{proc.stderr[-2000:]}")
        ours.append(seconds)
        seconds, proc = _wall([PYTHON, str(REPO / "bench" / "hsl_app" / "app.py"), "--help"], env)
        if proc.returncode == 0:
            ref.append(seconds)
    _, traced = _wall([PYTHON, "-X", "importtime", "-m", "launcher", "--help"], env)
    help_heavy = [m for m in imported_top_level(traced.stderr) if m in HEAVY]
    log(f"  --help: {statistics.median(ours):.3f} s median of {n}; heavy imports: {help_heavy or 'none'}")

    compose_s: list[float] = []
    compose_heavy: list[str] = []
    for _ in range(max(3, settings.repeats)):
        _, proc = _wall([PYTHON, "-c", COMPOSE], env)
        if proc.returncode != 0:
            raise RuntimeError(f"composing the grid failed:\n{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        compose_s.append(out["seconds"])
        compose_heavy = sorted(set(compose_heavy) | {m.split(".")[0] for m in out["heavy"]})
    log(f"  compose 16 cells: {statistics.median(compose_s):.3f} s; heavy imports: {compose_heavy or 'none'}")

    forbidden = {"torch", "mlflow"}
    rows = [
        Row(figure="5. `python -m launcher --help`, whole process (torch or mlflow imported?)", unit="s",
            ours=ours, reference=ref, target="imports neither torch nor mlflow",
            passed=not forbidden & set(help_heavy), ratio=ratio_of_medians(ours, ref),
            note=f"heavy modules imported: {', '.join(help_heavy) or 'none'}; reference: a Hydra app's --help"),
        Row(figure="5b. expand + compose + validate + plan of the 16-cell grid, in-process (torch or mlflow imported?)",
            unit="s", ours=compose_s, reference=[], target="imports neither torch nor mlflow",
            passed=not forbidden & set(compose_heavy),
            note=f"heavy modules imported: {', '.join(compose_heavy) or 'none'}"),
    ]
    return rows, {"help_heavy_imports": help_heavy, "compose_heavy_imports": compose_heavy}


if __name__ == "__main__":
    from bench.common import render_table

    rows, details = run(Settings(repeats=2), print)
    print(render_table(rows))
    print(details)
