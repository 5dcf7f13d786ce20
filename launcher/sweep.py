"""Run a planned sweep: tracking runs, submission, (optionally) waiting, results.

Local cells run one after another: they share this machine's cores, and two benchmarks running
at once would measure each other. Slurm cells are submitted as job arrays, one per resource
shape, and the command returns unless ``wait=true``.
"""

from __future__ import annotations

import pickle
import sys
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

from launcher import submit
from launcher.plan import Cell, SweepError, run_spec
from launcher.state import STATE_FILE, CellState, SweepState

TERMINAL = ("done", "failed", "cancelled")


def prepare(cells: List[Cell], argv: List[str], runs: bool = True) -> SweepState:
    """Create the sweep directory, the on-disk state and, unless ``runs=False`` (then
    :func:`create_runs` comes after submission), the MLflow parent/child runs."""
    cfg = cells[0].config  # sweep-level settings are uniform (plan._check_uniform)
    root = Path(cfg.output_root)
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    sweep_dir = Path(cfg.sweep_dir) if cfg.sweep_dir else root / stamp
    if (sweep_dir / STATE_FILE).exists():
        return resume(sweep_dir, cells)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    state = SweepState(name=f"sweep-{stamp}", sweep_dir=str(sweep_dir.resolve()), cluster=cfg.cluster.name.value,
                       argv=argv)
    if cfg.tracking.enabled:
        from launcher import tracking

        root.mkdir(parents=True, exist_ok=True)
        state.tracking_uri = cfg.tracking.uri or tracking.default_uri(root)
    for cell in cells:
        state.cells.append(CellState(
            index=cell.index, name=cell.name, dirname=cell.dirname, overrides=cell.overrides, nodes=cell.layout.nodes,
            world_size=cell.layout.world_size, strategy=cell.config.strategy.label,
            precision=cell.config.precision.name.value, model=cell.config.model.name))
    if runs:
        create_runs(state, cells)
    # Local cells log no MLflow from their ranks: the launcher waits for each cell anyway and logs
    # its metrics.jsonl into its run as it ends (finish_run), one SQLite writer, no MLflow import on
    # rank 0. Slurm ranks log themselves; without a run yet, rank 0 reads the run id at the end of
    # the job from the cell's run-id file (jobs.sinks.RUN_ID_FILE), which create_runs writes.
    worker_uri = None if state.cluster == "local" else state.tracking_uri
    for cs, cell in zip(state.cells, cells, strict=True):
        state.save_spec(cs, run_spec(cell, sweep_dir, worker_uri, cs.run_id))
        write_resolved_config(state.cell_dir(cs) / "config.yaml", cell)
    # Resubmission later needs the cluster settings, not only the cells' specs.
    (sweep_dir / "cluster.pkl").write_bytes(pickle.dumps(cfg.cluster))
    state.save()
    return state


def resume(sweep_dir: Path, cells: List[Cell]) -> SweepState:
    """The same command on an existing sweep directory: cells already done are kept, the others run
    again (from their checkpoints where they have one), logging into their existing MLflow runs."""
    state = SweepState.load(sweep_dir)
    if [c.name for c in state.cells] != [c.name for c in cells]:
        raise SweepError(f"sweep_dir={str(sweep_dir)!r} holds another sweep ({len(state.cells)} cells: "
                         f"{', '.join(c.name for c in state.cells[:4])}...). Fix: repeat that sweep's grid to resume "
                         f"it, or give a new sweep_dir.")
    again = [cs for cs in state.cells if cs.status != "done"]
    for cs in again:
        cs.status, cs.job_id, cs.error = "planned", None, None
    if state.tracking_uri:
        from launcher.tracking import reopen

        for cs in again:
            if cs.run_id:
                reopen(state.tracking_uri, cs.run_id)
    state.save()
    print(f"resuming {state.name}: {len(state.cells) - len(again)} cell(s) done, {len(again)} to run", flush=True)
    return state


def create_runs(state: SweepState, cells: List[Cell]) -> None:
    """The sweep's MLflow parent run and one child run per cell; each cell's run id also goes to
    its directory, where the cell's rank 0 reads it when it logs, at the end of its job.

    Importing MLflow and opening its store take ~2 s, and no job needs its run before it ends: a
    Slurm sweep creates the runs once sbatch has accepted every job, a local sweep once its first
    cell has ended (while nothing runs, so the work never lands in a measurement).
    """
    if not state.tracking_uri or state.parent_run_id:
        return  # no tracking, or the runs exist already (a resumed sweep)
    from dataclasses import asdict

    from jobs.sinks import RUN_ID_FILE
    from launcher import tracking

    cfg = cells[0].config
    tracker = tracking.SweepTracker(state.tracking_uri, cfg.tracking.experiment)
    state.experiment_id = tracker.experiment_id
    code = tracking.code_provenance()
    state.parent_run_id = tracker.parent(state.name, {"sweep_dir": state.sweep_dir, "argv": " ".join(state.argv),
                                                      "cluster": state.cluster, "cells": str(len(cells)), **code})
    for cs, cell in zip(state.cells, cells, strict=True):
        tags = {"strategy": cs.strategy, "precision": cs.precision, "nodes": str(cs.nodes),
                "world_size": str(cs.world_size), "model": cs.model, "cell": cell.name, **code}
        if cs.job_id and state.cluster == "slurm":
            tags["slurm_job_id"] = cs.job_id
        params = tracking.flatten(_plain(asdict(cell.config)))
        cs.run_id = tracker.child(state.parent_run_id, cell.name, params, tags)
        state.cell_dir(cs).mkdir(parents=True, exist_ok=True)
        (state.cell_dir(cs) / RUN_ID_FILE).write_text(cs.run_id + "\n")
    state.save()


def write_resolved_config(path: Path, cell: Cell) -> None:
    """The cell's whole resolved config as YAML (secrets in URIs masked): what this cell ran with."""
    from dataclasses import asdict

    import yaml

    from launcher.safety import secrets_masked

    # The text OmegaConf.to_yaml(OmegaConf.structured(config)) gives, at a 20th of the cost: that
    # took ~20 ms per cell, before sbatch (a 16-cell sweep: 0.3 s of its ~0.8 s to submission).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(_plain(asdict(cell.config)), Dumper=dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)
    path.write_text(f"# {cell.name}\n# overrides: {' '.join(cell.overrides)}\n" + secrets_masked(text))


def _plain(tree):
    import enum

    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain(v) for v in tree]
    return tree.value if isinstance(tree, enum.Enum) else tree


def _error_of(state: SweepState, cell: CellState, exc: Optional[BaseException]) -> str:
    """The rank that failed first, from the files the ranks left; else submitit's last line."""
    from launcher.status import first_failure

    found = first_failure(state.cell_dir(cell))
    if found:
        return found
    text = str(exc or "failed").strip().splitlines()
    return text[-1] if text else "failed"


def run_local(state: SweepState, cells: List[Cell]) -> None:
    folder = state.path / "submitit"
    runs_tried = False
    for cs, cell in zip(state.cells, cells, strict=True):
        if cs.status == "done":
            continue
        spec = state.load_spec(cs)
        executor = submit.local_executor(folder, cell.layout, cell.config.cluster.timeout_min)
        from jobs.worker import Worker

        job = executor.submit(Worker(), spec)
        cs.job_id, cs.status = job.job_id, "submitted"
        state.save()
        print(f"[{cs.index + 1}/{len(state.cells)}] {cs.name}: job {job.job_id}, {cs.world_size} ranks, "
              f"{state.cell_dir(cs)}", flush=True)
        try:
            job.results()
            cs.status, cs.error = "done", None
        except Exception as exc:  # a failed cell is recorded; the sweep goes on
            cs.status, cs.error = "failed", _error_of(state, cs, exc)
            print(f"    failed: {cs.error}", file=sys.stderr, flush=True)
        if state.tracking_uri and not state.parent_run_id and not runs_tried:
            runs_tried = True
            try:
                create_runs(state, cells)
            except Exception as exc:  # tracking is best-effort here too: every cell still writes its JSONL
                print(f"[mlflow] could not create the runs in {state.tracking_uri}: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
        finish_run(state, cs)
        state.save()


def finish_run(state: SweepState, cs: CellState) -> None:
    from launcher.status import finish_tracking

    finish_tracking(state, cs)


def submit_slurm(state: SweepState, cells: List[Cell]) -> None:
    groups: Dict[tuple, List[Cell]] = {}
    for cell in cells:
        if state.cells[cell.index].status != "done":  # a resumed sweep skips what finished
            groups.setdefault(cell.shape(), []).append(cell)
    cluster = cells[0].config.cluster
    ordered = list(groups.values())
    jobs = submit.submit_arrays(
        state.path / "submitit", cluster,
        [(g[0].layout, [state.load_spec(state.cells[c.index]) for c in g]) for g in ordered],
        job_name=state.name,
    )
    for cell, job in zip([c for g in ordered for c in g], jobs, strict=True):
        cs = state.cells[cell.index]
        cs.job_id, cs.status = job.job_id, "submitted"
    state.save()
    print(f"{len(jobs)} cells in {len(ordered)} sbatch call(s).", flush=True)


def print_jobs(state: SweepState) -> None:
    """One line per submitted cell: job id, grid point, directory, MLflow run id."""
    for cs in state.cells:
        print(f"{cs.job_id}\t{cs.name}\t{state.cell_dir(cs)}\trun {cs.run_id or '-'}", flush=True)


def finalize(state: SweepState) -> str:
    """Write report.md and its plots, attach them to the sweep's MLflow parent run and end that run
    (FAILED if any cell did not finish). Returns the ranking table and the report's path."""
    from launcher import report

    written = report.write_sweep_report(state)
    if state.tracking_uri and state.parent_run_id:
        from launcher.tracking import close_parent

        failed = any(c.status != "done" for c in state.cells)
        try:
            close_parent(state.tracking_uri, state.parent_run_id, written.path, written.plots,
                         "FAILED" if failed else "FINISHED")
        except Exception as exc:  # the report is on disk; a tracking outage must not hide it
            print(f"[mlflow] could not attach the report to run {state.parent_run_id}: {exc}", file=sys.stderr)
    return f"{written.tables}\n\nreport: {written.path}"


def wait_slurm(state: SweepState) -> None:
    from launcher.status import wait

    wait(state)
