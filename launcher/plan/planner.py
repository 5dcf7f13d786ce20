"""The composed grid points -> cells: ``runs`` launches of each point with their names, directories
and resources (the parallel layout made here first, contract/parallel.py), the checks that span the
sweep (limits.cells, one cluster and model per sweep), and each cell's run spec (spec.json)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from contract.parallel import ParallelDims
from contract.spec import Layout, RunSpec, TrainSpec
from launcher.plan.cell import Cell
from launcher.plan.grid import Point, SweepError
from launcher.plan.schema import Config


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:80] or "run"


def layout_for(config: Config) -> Layout:
    """The cell's resources; its parallel layout made from them here first (contract/parallel.py), so
    a strategy the layout cannot hold is refused before anything is created."""
    c = config.cluster
    ranks_per_machine = c.tasks_per_node * (config.nodes if c.one_machine else 1)
    cpus = c.cpus_per_task
    if cpus is None:
        # Local: share this machine's cores among all its ranks. Slurm: 1 unless asked.
        cpus = max(1, (os.cpu_count() or 1) // ranks_per_machine) if c.one_machine else 1
    layout = Layout(nodes=config.nodes, tasks_per_node=c.tasks_per_node, gpus_per_node=c.gpus_per_node,
                    cpus_per_task=cpus)
    ParallelDims.of(config.strategy, layout)
    return layout


def plan(points: list[Point]) -> list[Cell]:
    """Cells with their resources: ``runs`` independent launches of every grid point, interleaved
    (run 1 of every point, then run 2, ...) so that a drift of the machine over the sweep reaches
    every configuration alike. Duplicate points (same resolved config) are refused."""
    seen: dict[str, str] = {}
    names = []
    for p in points:
        # Nothing swept: the cell is named by its strategy, as every cell's label names one.
        name = " ".join(f"{k}={v}" for k, v in p.swept.items()) or f"strategy={p.config.strategy.label}"
        key = repr(p.config)
        if key in seen:
            raise SweepError(
                f"[{name}] resolves to the same configuration as [{seen[key]}]: it would run twice. "
                f"Fix: remove the repeated value from the sweep, or set runs=N to measure it N times."
            )
        seen[key] = name
        names.append(name)
    _check_cells(points)
    cells: list[Cell] = []
    for run in range(1, max((p.config.first_runs for p in points), default=1) + 1):
        for p, name in zip(points, names, strict=True):
            if run > p.config.first_runs:
                continue
            i = len(cells)
            # runs=auto: every cell is one run of several, later rounds add "run=4" and on.
            full = f"{name} run={run}" if p.config.auto or p.config.first_runs > 1 else name
            cfg = p.config
            cells.append(Cell(index=i, name=full, dirname=cell_dirname(i, full), overrides=p.overrides,
                              strategy=cfg.strategy.label, precision=cfg.precision.name.value,
                              model=model_label(cfg), cluster=cfg.cluster, layout=layout_for(cfg), run=run,
                              resolved=cfg))
    _check_uniform(cells)
    return cells


def _check_cells(points: list[Point]) -> None:
    """Cells per sweep within limits.cells, counted before any is made: every run of every grid point
    (runs=auto: its first round; no later round starts that would pass the limit, launcher/decide.py,
    so a wide grid is not refused for runs it may never need)."""
    if not points:
        return
    limit = points[0].config.limits.cells
    most = sum(p.config.first_runs for p in points)
    if most > limit:
        raise SweepError(f"limits.cells={limit}: this sweep would run up to {most} cells ({len(points)} grid point(s) x "
                         f"their runs{', runs_min with runs=auto' if points[0].config.auto else ''}). Fix: sweep "
                         f"fewer values or fewer runs, or raise limits.cells={most} if you mean it.")


def cell_dirname(index: int, name: str) -> str:
    """A cell's directory under cells/: its index, then its name in safe characters."""
    return f"{index:02d}-{_slug(name.replace('=', '_').replace(' ', '-'))}"


def _check_uniform(cells: list[Cell]) -> None:
    """Sweep-level settings must not vary across cells (one cluster, one tracking store, one directory)."""
    first = cells[0].config if cells else None
    for c in cells[1:]:
        for key in ("cluster.name", "cluster.declared", "tracking", "fabric", "health", "output_root", "sweep_dir", "wait",
                    "runs", "runs_min", "runs_max", "runs_budget_min", "baseline", "cells", "cells_max",
                    "cells_budget_min", "limits"):
            mine, theirs = c.config, first
            for part in key.split("."):
                mine, theirs = getattr(mine, part), getattr(theirs, part)
            if mine != theirs:
                raise SweepError(f"[{c.name}] {key.split('.')[0]} differs between grid points: a sweep runs on one "
                                 f"cluster, logs to one store, writes one directory and follows one plan of runs. "
                                 f"Fix: sweep {key.split('.')[0]} in separate commands.")


def model_label(cfg: Config) -> str:
    """``gpt2-small``, ``hf:llama`` or ``custom:Linear``: what the report and MLflow call the model."""
    m = cfg.model
    if m.target_path:
        return f"custom:{m.target_path.rpartition('.')[2]}"
    if m.is_hf:
        return f"hf:{m.arch or Path(m.config_path or m.pretrained_path or 'config').name}"
    return m.name


def run_spec(cell: Cell, sweep_dir: Path, tracking_uri: str | None, run_id: str | None) -> RunSpec:
    cfg = cell.config
    train = TrainSpec(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(TrainSpec)})
    return RunSpec(
        cell=cell.name, out_dir=str((sweep_dir / "cells" / cell.dirname).resolve()),
        strategy=cfg.strategy, precision=cfg.precision, model=cfg.model, data=cfg.data, train=train,
        layout=cell.layout, tracking_uri=tracking_uri, run_id=run_id,
        emulate_nodes=cfg.cluster.one_machine, collective_timeout_s=cfg.collective_timeout_s,
        cost_per_device_hour=cfg.cluster.cost_per_device_hour, cost_per_node_hour=cfg.cluster.cost_per_node_hour,
        checkpoint=cfg.checkpoint,
    )
