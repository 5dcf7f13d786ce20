"""Every check that needs more than the config itself, run on the login node before submission.

Composition (plan.compose) already refused unknown keys, non-finite numbers and contradictory
settings without importing torch. Here come the checks that must import or ask something: each
model builds (on the meta device) and is an nn.Module, the GPUs a local cell asks for exist, the
Slurm partitions hold the cells, the tracking store answers, and each cell's model state fits in
the GPU memory it was given. A refused grid creates nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from jobs.codec import to_plain
from jobs.spec import ConfigError
from launcher import fit
from launcher.plan import Cell, SweepError
from launcher.schema import ClusterKind, Config
from launcher.tracking import check_reachable, default_uri


def check(cells: list[Cell]) -> dict[int, fit.StateBytes]:
    """Raise SweepError listing every problem; return each cell's predicted per-rank state bytes."""
    errors: list[str] = []
    predicted = _models(cells, errors)
    _local_gpus(cells, errors)
    _fits(cells, predicted, errors)
    if errors:
        raise SweepError("\n".join(dict.fromkeys(errors)))
    if cells[0].config.cluster.name is ClusterKind.slurm:
        from launcher.slurm import check_partitions

        check_partitions(cells)
    _tracking(cells[0].config)
    return predicted


def _models(cells: list[Cell], errors: list[str]) -> dict[int, fit.StateBytes]:
    """Each distinct model is built once, on the meta device."""
    from jobs.models import check_buildable

    shapes: dict[str, list | None] = {}
    predicted = {}
    for cell in cells:
        model = cell.config.model
        key = json.dumps(to_plain(model), sort_keys=True, default=str)
        if key not in shapes:
            try:
                check_buildable(model)
                shapes[key] = fit.parameter_shapes(model)
            except ConfigError as exc:
                errors.append(f"[{cell.name}] {exc}")
                shapes[key] = None
        found = shapes[key]
        if found is not None:
            predicted[cell.index] = fit.predict(found, cell.config.strategy, cell.layout, cell.config.optimizer)
    return predicted


def visible_gpus() -> int:
    """GPUs on this machine, from nvidia-smi (no CUDA initialisation in the launcher)."""
    if not shutil.which("nvidia-smi"):
        return 0
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def _local_gpus(cells: list[Cell], errors: list[str]) -> None:
    wanted = max((c.layout.gpus_per_node * c.layout.nodes for c in cells
                  if c.config.cluster.name is ClusterKind.local), default=0)
    if not wanted:
        return
    found = visible_gpus()
    if found < wanted:
        errors.append(f"cluster.gpus_per_node: the local cluster runs one rank per GPU and a cell needs {wanted} "
                      f"GPU(s) on this machine; nvidia-smi finds {found}. Fix: lower cluster.gpus_per_node "
                      f"(and cluster.tasks_per_node) or nodes, use cluster=slurm, or cluster.gpus_per_node=0 for CPU "
                      f"ranks.")


def _fits(cells: list[Cell], predicted: dict[int, fit.StateBytes], errors: list[str]) -> None:
    """A cell whose parameters, gradients and optimizer state alone exceed cluster.gpu_mem_gib is refused
    (activations come on top), unless allow_oom=true."""
    for cell in cells:
        limit_gib = cell.config.cluster.gpu_mem_gib
        state = predicted.get(cell.index)
        if not limit_gib or state is None or cell.config.allow_oom or not cell.layout.gpus_per_node:
            continue
        if cell.config.strategy.cpu_offload:
            continue  # parameters and optimizer state live in host memory
        if state.total > limit_gib * fit.GIB:
            errors.append(f"[{cell.name}] predicted model state {fit.human(state.total)} per rank (params "
                          f"{fit.human(state.params)}, grads {fit.human(state.grads)}, optimizer "
                          f"{fit.human(state.optimizer)}) exceeds cluster.gpu_mem_gib={limit_gib:g}, before "
                          f"activations. Fix: shard more (strategy=fsdp, more nodes), offload (strategy=fsdp_offload), "
                          f"a smaller model, or allow_oom=true to run it anyway.")


def _tracking(cfg: Config) -> None:
    """A sweep that must log to MLflow refuses to start when the store cannot be reached."""
    if not cfg.tracking.enabled:
        return
    root = Path(cfg.output_root)
    uri = cfg.tracking.uri or default_uri(root)
    if not cfg.tracking.uri and not root.exists():
        return  # the default store is created under output_root
    problem = check_reachable(uri)
    if problem:
        raise SweepError(f"tracking.uri={uri!r}: {problem}. Fix: start the server (mlflow server ...), fix the URI, "
                         f"or run without MLflow (tracking=off).")
