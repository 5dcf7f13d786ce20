"""Figure 5: ``python -m launcher --help`` and config composition import neither torch nor MLflow.
Beside it, ``python -m bench.imports chain``: each package's longest import chain, from the source
(the imports that run, inside functions included; and with the type checker's beside it).

Each check runs in a fresh interpreter: ``--help`` under ``python -X importtime`` (the modules it
imported are read from that report), composition of the 16-cell grid (expand, compose, validate,
plan) in a subprocess that prints ``sys.modules``' heavy entries afterwards. Reference for the
``--help`` time: the Hydra app of the Slurm benchmark (bench/hsl_app) answering ``--help``.
"""

from __future__ import annotations

import ast
import functools
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import PYTHON, REPO, Row, Settings, bench_env, ratio_of_medians

HEAVY = ("torch", "mlflow", "submitit", "numpy", "pandas", "sqlalchemy", "matplotlib")
GRID = ["strategy=ddp,fsdp", "precision=fp32,bf16", "nodes=1,2", "seed=0,1", "runs=1"]

COMPOSE = f"""
import json, sys, time
t0 = time.perf_counter()
from launcher.plan.grid import compose, expand
from launcher.plan.planner import plan
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


def _type_only(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: imports for the type checker, which never run."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test).endswith(
        "TYPE_CHECKING") for stmt in node.body for n in ast.walk(stmt)}


def import_graph(package: str | tuple[str, ...], root: Path = REPO, run_only: bool = True) -> dict[str, set[str]]:
    """Every module of ``package`` (a package's __init__ counts as one; several packages: all of
    theirs) -> the modules of those packages it imports, at the top or inside functions (``from a.b
    import c`` is ``a.b.c`` where that is a module); with ``run_only``, not those under
    ``if TYPE_CHECKING:``."""
    def name(path: Path) -> str:
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    packages = (package,) if isinstance(package, str) else package
    paths = {name(p): p for top in packages for p in (root / top).rglob("*.py") if name(p) != top}
    graph = {}
    for module, path in paths.items():
        found = set()
        tree = ast.parse(path.read_text())
        skipped = _type_only(tree) if run_only else set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[module] = (found & set(paths)) - {module}
    return graph


def longest_chain(package: str | tuple[str, ...], root: Path = REPO, run_only: bool = True) -> list[str]:
    """The longest path of imports inside ``package`` (or across several): a -> b -> c means a
    imports b, which imports c (``run_only``: the imports that run; else the type checker's too)."""
    graph = import_graph(package, root, run_only)

    @functools.cache
    def longest(module: str) -> tuple[str, ...]:
        return max(((module, *longest(n)) for n in sorted(graph[module])), key=len, default=(module,))

    return list(max((longest(m) for m in sorted(graph)), key=len))


if __name__ == "__main__":
    import sys

    from bench.common import render_table

    if sys.argv[1:] == ["chain"]:
        across = ("launcher", "jobs", "contract")
        chain = longest_chain(across)
        # (Across the packages, the type checker's imports close circles (a value and the spec that
        # types it), so only the imports that run are followed.)
        print(f"{', '.join(across)}: {len(chain)} modules: {' -> '.join(chain)}")
        for package in ("launcher", "jobs"):
            chain = longest_chain(package)
            checker = longest_chain(package, run_only=False)
            print(f"{package}: {len(chain)} modules: {' -> '.join(chain)}")
            print(f"  (with the imports under `if TYPE_CHECKING:`, which never run: {len(checker)} modules)")
        raise SystemExit(0)
    rows, details = run(Settings(repeats=2), print)
    print(render_table(rows))
    print(details)
