"""Every check that needs more than the config itself, run on the login node before submission.

Composition (plan.compose) already refused unknown keys, non-finite numbers and contradictory
settings without importing torch. Here come the checks that must import or ask something: each
model builds (on the meta device) and is an nn.Module, the GPUs a local cell asks for exist, the
Slurm partitions hold the cells, a local memory limit can be imposed, the tracking store answers,
and each cell's model state fits in the GPU memory it was given. A refused grid creates nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from contract.codec import to_plain
from contract.spec import ConfigError, ModelSpec
from contract.tuning import missing_compiler, resolved_model
from launcher.cluster.backends import backend_for
from launcher.forecast import cellsearch, timeforecast
from launcher.plan import fit, fitcache, traffic
from launcher.plan.cell import Cell
from launcher.plan.grid import SweepError
from launcher.plan.schema import AUTO, Config, declared_gpu_mem_gib
from launcher.track.tracking import check_reachable, default_uri


def check(cells: list[Cell], plan_only: bool = False) -> dict[int, fit.StateBytes]:
    """Raise SweepError listing every problem; return each cell's predicted per-rank state bytes.
    ``plan_only`` (--plan, a what-if): a cell that does not fit its GPU is not a problem but an
    answer, shown in the plan (launcher/preview.py); only a real run refuses it."""
    predicted = analyse(cells)
    errors: list[str] = []
    # What the cluster cannot give (GPUs, memory limits, partitions), and what it resolves for the cells
    # (cluster.gpu_mem_gib, a GPU rank's cores and memory): applied here, the check changes nothing.
    # Declared nodes are taken at their word: no cluster is asked.
    if cells[0].cluster.declared:
        _declared_gpu_memory(cells)
    else:
        resources = backend_for(cells[0].cluster.name).check_resources(cells)
        resources.apply(cells)
        for warning in resources.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        errors += resources.errors
    if not plan_only:
        _fits(cells, predicted, errors)  # beside what the nodes cannot give: every problem of a cell at once
    _refuse(errors)
    _time_limits(cells, predicted)
    _looks(cells[0].config)
    cellsearch.check(cells)  # cells=auto: a grid it can search, a baseline of the same grid
    _baseline(cells)
    _writable(cells[0].config)
    _interpreter(cells[0].cluster)
    _tracking(cells[0].config)
    _compiler(cells)
    return predicted


def _interpreter(cluster) -> None:
    """cluster.python on a backend whose ranks run on this machine: it must be here and import the
    worker (its torch included), or every rank would exit at once with a shell's 127. (Slurm's
    nodes are not this machine: their interpreter is theirs to have.)"""
    import shlex
    import shutil
    import subprocess

    if not cluster.one_machine or not cluster.python:
        return
    command = shlex.split(cluster.python)
    fix = ("give the path of an interpreter of this machine that has this project and torch installed, e.g. "
           f"cluster.python={sys.executable}, or drop cluster.python (the ranks then run with the launcher's own).")

    def refused(why: str) -> SweepError:
        return SweepError(str(ConfigError("cluster.python", cluster.python, why, fix)))

    if not command or shutil.which(command[0]) is None:
        raise refused(f"is no interpreter of this machine (the ranks of cluster={cluster.name} run here).")
    try:
        done = subprocess.run([*command, "-c", "import torch, jobs.worker"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise refused(f"could not be run: {exc}.") from exc
    if done.returncode:
        raise refused(f"cannot import the worker: {(done.stderr.strip().splitlines() or ['no message'])[-1]}.")


def _time_limits(cells: list[Cell], predicted: dict[int, fit.StateBytes]) -> None:
    """cluster.timeout_min=auto: each such cell's own limit, and what it rests on."""
    auto = [c for c in cells if c.cluster.timeout_min == AUTO]
    if not auto:
        return
    first = auto[0].cluster
    key = backend_for(first.name).noise_floor_key(first)
    asked = timeforecast.asked(auto, predicted, Path(auto[0].config.output_root), key)
    for cell in auto:
        cell.cluster.timeout_min, cell.time_asked = asked[cell.index].minutes, asked[cell.index].how


def _compiler(cells: list[Cell], environ: Mapping[str, str] | None = None) -> None:
    """compile=true (or auto resolved to it) on CPU ranks of this machine needs a C++ compiler (inductor
    builds their kernels): looked for here, in the environment the ranks inherit. Not where the ranks
    run elsewhere (Slurm's nodes), run after cluster.setup lines (which may load one), or are declared."""
    compiled = [c for c in cells if c.cluster.one_machine and not c.cluster.declared and not c.cluster.setup
                and not c.layout.gpus_per_node and c.config.tuning().compile]
    problem = missing_compiler(environ) if compiled else None
    if problem:
        raise SweepError(str(ConfigError(
            "compile", True, f"{problem}: {len(compiled)} cell(s) would fail inside their ranks ({compiled[0].name}"
            f"{', ...' if len(compiled) > 1 else ''}).", "install a C++ compiler (Debian: apt-get install g++; or set "
            "CXX to one's path), or run eager with compile=false.")))


def _looks(config: Config) -> None:
    """runs=auto's planned looks within limits.looks: each look tests at a share of 5%, so more looks
    mean smaller levels and fewer decisions (runs_max=1000000 would plan 32 looks at 2.6e-7)."""
    if not config.auto:
        return
    from launcher.report.sequential import schedule

    looks = len(schedule(config.runs_min, config.resolved_runs_max))
    if looks > config.limits.looks:
        raise SweepError(str(ConfigError(
            "runs_max", config.resolved_runs_max, f"with runs_min={config.runs_min} plans {looks} looks, beyond limits.looks="
            f"{config.limits.looks} (each look tests at a share of 5%: more looks, smaller levels, fewer decisions).",
            f"raise runs_min, lower runs_max, or raise limits.looks={looks}.")))


def _baseline(cells: list[Cell]) -> None:
    """A runs=auto baseline read whole before the first job: its sweep.json and every result.json
    parse, it has results, and some configuration of this grid can be compared with one of its own
    (the rule of --compare, launcher/report/compare.py). A damaged or unlike baseline found after
    round 1 would leave the new sweep without a report, or its rounds chasing comparisons that mean
    nothing."""
    config = cells[0].config
    if not config.baseline:
        return
    from launcher.report import compare
    from launcher.report.collect import collect
    from launcher.state import StateError, SweepState

    try:
        state = SweepState.load(Path(config.baseline))
        done = [c for c in state.cells if c.status.value == "done" and state.read_result(c)]
        rows = collect(state)
    except StateError as exc:
        raise SweepError(f"baseline={config.baseline!r}: {exc}") from exc
    if not done:
        raise SweepError(f"baseline={config.baseline!r}: no cell of that sweep has a result "
                         f"({len(state.cells)} cell(s), none done): there is nothing to compare with. Fix: give a sweep "
                         f"that finished (python -m launcher.status {config.baseline}).")
    planned = [{"cell": c.name, "settings": dict(o.split("=", 1) for o in c.overrides if "=" in o), "model": c.model,
                "strategy": c.strategy, "precision": c.precision, "nodes": c.nodes, "world_size": c.world_size,
                "status": "done"} for c in cells]
    found = compare.compare(rows, planned)
    if not found.matches:
        why = "; ".join(f"{m.name}: {m.why_not}" for m in found.not_compared[:3]) or \
            "no configuration in common (neither the same settings nor the same swept values)"
        raise SweepError(f"baseline={config.baseline!r}: none of its configurations can be compared with this "
                         f"sweep's ({why}). Fix: give a baseline of the same model, world sizes and settings, apart "
                         f"from the one under test, or compare afterwards (python -m launcher.report --compare A B).")


def analyse(cells: list[Cell]) -> dict[int, fit.StateBytes]:
    """Each cell's model analysed (built on the meta device, or read from the fit cache): its
    per-rank state and the bytes its strategy moves; its FLOPs per sample counted into the cache for
    the forecasts (launcher/forecast/inputs.py). Raise SweepError for a model that cannot build.
    Asks no cluster: launcher.forecast analyses cells larger than any cluster it knows."""
    errors: list[str] = []
    predicted = _models(cells, errors)
    _refuse(errors)
    built = [resolved_model(c.config.model, cuda=c.layout.gpus_per_node > 0) for c in cells]
    for model in {json.dumps(to_plain(m), sort_keys=True, default=str): m for m in built}.values():
        fitcache.flops_per_sample(model)
    return predicted


def _refuse(errors: list[str]) -> None:
    """Raise the errors, each once per grid point: the runs of a point share its settings, so
    "[strategy=ddp run=2] ..." says nothing that "[strategy=ddp] ..." does not."""
    if errors:
        raise SweepError("\n".join(dict.fromkeys(_RUN_IN_NAME.sub(r"[\1]", e) for e in errors)))


_RUN_IN_NAME = re.compile(r"^\[(.*?) run=\d+\]")


def _models(cells: list[Cell], errors: list[str]) -> dict[int, fit.StateBytes]:
    """Each distinct model and batch shape is analysed once (or read from launcher/plan/fitcache.py):
    built on the meta device, its parameter shapes, and one meta forward for the activations."""
    analyses: dict[str, tuple[list, int | None, list[bool]] | None] = {}
    predicted = {}
    for cell in cells:
        cfg = cell.config
        # What the ranks build: the vocabulary padded as on the cell's device (contract/tuning.py).
        built = resolved_model(cfg.model, cuda=cell.layout.gpus_per_node > 0)
        model = to_plain(built)
        shape = {"batch_size": cfg.batch_size, "low_dtype": LOW_DTYPE.get(cfg.precision.name.value),
                 "checkpointing": cfg.activation_checkpointing}
        key = json.dumps([model, shape], sort_keys=True, default=str)
        if key not in analyses:
            analyses[key] = _analyse(built, model, shape, cell.name, errors)
        found = analyses[key]
        if found is not None:
            shapes, activations, in_unit = found
            state = fit.predict(shapes, cfg.strategy, cell.layout, cfg.optimizer)
            params = [traffic.Param(shape, inside) for (shape, _), inside in zip(shapes, in_unit, strict=True)]
            predicted[cell.index] = dataclasses.replace(
                state, activations=activations,
                loss_grads=fit.loss_grad_bytes(built, cfg.batch_size, cfg.tuning().loss,
                                               LOW_DTYPE.get(cfg.precision.name.value), cfg.tuning().compile),
                comm_bytes_per_step=traffic.bytes_per_step(params, cfg.strategy, cfg.precision, cell.layout,
                                                           cfg.grad_accum_steps, _buffer_bytes(built, cfg)))
    return predicted


LOW_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def _buffer_bytes(model: ModelSpec, cfg: Config) -> int:
    """The model's buffer bytes where DDP broadcasts them (else 0: nothing is built for it)."""
    if cfg.strategy.name.value != "ddp" or not cfg.strategy.broadcast_buffers:
        return 0
    return fitcache.buffer_bytes(model)


def _analyse(model: ModelSpec, plain: dict, shape: dict, cell_name: str,
             errors: list[str]) -> tuple[list, int | None, list[bool]] | None:
    """(parameter shapes, activation bytes or None, each parameter inside an FSDP unit or not), or
    None after recording why it cannot build."""
    cache_key = fitcache.key(plain, shape)
    hit = fitcache.read(cache_key, fitcache.ANALYSIS)
    if hit is not None:
        return [(tuple(dims), size) for dims, size in hit["shapes"]], hit["activations"], hit["in_unit"]
    from jobs.models.checks import check_buildable
    from launcher.plan.forwardcheck import check_forward

    try:
        check_buildable(model)
        if model.target_path:
            check_forward(model)
    except ConfigError as exc:
        errors.append(f"[{cell_name}] {exc}")
        return None
    shapes, activations, in_unit = fit.analyse(model, **shape)
    fitcache.write(cache_key, {"shapes": shapes, "activations": activations, "in_unit": in_unit})
    return shapes, activations, in_unit


def _fits(cells: list[Cell], predicted: dict[int, fit.StateBytes], errors: list[str]) -> None:
    """A GPU cell whose parameters, gradients, optimizer state and activation estimate exceed its GPU
    memory (cluster.gpu_mem_gib, or else what its GPU type holds) is refused, unless allow_oom=true."""
    for cell in cells:
        state = predicted.get(cell.index)
        if state is None or cell.config.allow_oom or cell.fits(state) is not False:
            continue
        errors.append(f"[{cell.name}] predicted {fit.human(state.peak)} per rank (params "
                      f"{fit.human(state.params)}, grads {fit.human(state.grads)}, optimizer "
                      f"{fit.human(state.optimizer)}, activations {_about(state.activations)}, loss gradients "
                      f"{fit.human(state.loss_grads)}) exceeds "
                      f"the {cell.cluster.gpu_mem_gib:g} GiB of each GPU (cluster.gpu_mem_gib, or the memory of its GPU "
                      f"type). Fix: {fit.DOES_NOT_FIT_FIX}")


def _declared_gpu_memory(cells: list[Cell]) -> None:
    """A declared node's GPU memory, for the fit check: cluster.gpu_mem_gib or its gpu_type's (the
    schema has refused declared GPUs that say neither)."""
    for cell in cells:
        if cell.layout.gpus_per_node:
            cell.cluster.gpu_mem_gib = declared_gpu_mem_gib(cell.cluster)


def _about(activations: int | None) -> str:
    return f"about {fit.human(activations)}" if activations is not None else "unknown: not counted"


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
        raise SweepError(f"tracking.uri={uri!r}: {problem}. Fix: start the server (mlflow server ...), fix the URI "
                         f"(http(s)://host:port of an MLflow server, sqlite:////abs/path/mlflow.db, or a database "
                         f"URI), or run without MLflow (tracking=off).")


def _writable(cfg: Config) -> None:
    """output_root (or sweep_dir) can be created and written: probed with a directory made and removed
    in its nearest existing parent (permissions alone do not tell: root may write nowhere in /proc)."""
    import tempfile

    setting, target = ("sweep_dir", Path(cfg.sweep_dir)) if cfg.sweep_dir else ("output_root", Path(cfg.output_root))
    parent = next((p for p in (target, *target.absolute().parents) if p.exists()), None)
    problem = None
    if parent is None or not parent.is_dir():
        problem = f"{parent} is not a directory"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=parent))
        except OSError as exc:
            problem = f"nothing can be created in {parent} ({exc.strerror or exc})"
    if problem:
        raise SweepError(f"{setting}={str(target)!r}: the sweep's directory cannot be created there: {problem}. "
                         f"Fix: set {setting} to a directory you can write (e.g. {setting}=$HOME/bench-outputs).")
