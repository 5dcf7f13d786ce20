"""Run a planned sweep: its directory and document, submission, MLflow runs, waiting, the report.

    prepare (new sweep, or resume of an existing sweep_dir) -> Backend.submit (the one path)
      -> create_runs -> [finish.wait] -> finish.finalize

What it says of the cluster, it says in the backend's words (Backend.words).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from contract import records
from contract.codec import to_plain
from contract.metrics import STEP_TIME_MS_P50, THROUGHPUT_SAMPLES_PER_S
from launcher import decide, finish, healthprobe, probe
from launcher.cluster.backends import backend_for
from launcher.cluster.failures import SUBMIT_REFUSED
from launcher.cluster.interrupt import NOT_STARTED, Interrupts, stop_waiting
from launcher.forecast import cellsearch
from launcher.masking import mask
from launcher.plan import fit
from launcher.plan.cell import RUN_AGAIN, Cell, CellStatus
from launcher.plan.grid import SweepError
from launcher.plan.planner import run_spec
from launcher.report import health
from launcher.state import STATE_FILE, StateError, SweepState, this_process
from launcher.track import reconcile, runs, tracking


def run(cells: list[Cell], argv: list[str], predicted: dict[int, fit.StateBytes] | None = None,
        allow_concurrent: bool = False) -> int:
    """The whole life of a sweep from the command line; returns the exit code."""
    refuse_declared(cells)
    cellsearch.refuse_background(cells)
    if not allow_concurrent:
        check_not_running(cells, argv)
    health_notes = healthprobe.before_cells(cells)  # health=auto: slow nodes kept out of every cell
    cfg = cells[0].config
    # A folder of its own: two sweeps started in the same second take two (contract/records.py).
    sweep_dir = Path(cfg.sweep_dir) if cfg.sweep_dir else records.new_folder(Path(cfg.output_root))
    with driving(sweep_dir):
        state = prepare(cells, argv, predicted or {}, sweep_dir)
        return _drive(state, cells, health_notes)


def _drive(state: SweepState, cells: list[Cell], health_notes) -> int:
    """The sweep's cells submitted (round after round in the foreground), then its finish."""
    if health_notes is not None:
        health.keep_in_sweep(state.path, health_notes)
    todo = [c for c in state.cells if c.status in (CellStatus.planned, *RUN_AGAIN)]
    print(f"sweep {state.name}: {len(todo)} of {len(cells)} cell(s) to run -> {state.sweep_dir}", flush=True)
    probes = probe.before_cells(state, todo, cells[0].config)  # the cells start after them
    backend = backend_for(state.cluster)
    if backend.runs_cells_in_foreground:
        # Handlers for the whole life in the foreground, MLflow's closing included: a second Ctrl-C
        # always ends at once.
        with Interrupts() as interrupts:
            while todo:  # runs=auto: each round's cells, then the next round where comparisons are open
                backend.submit(state, todo, after_each_cell=lambda cell: _cell_ended(state, cell),
                               interrupts=interrupts)
                if interrupts.requested:
                    return _interrupted(state, interrupts)
                todo = cellsearch.next_round(state) or decide.next_round(state)
                _said_round(state, todo)
    else:
        backend.submit(state, todo, after=probes)
        _create_runs(state)
        print_jobs(state)
        if any(c.failure_class == SUBMIT_REFUSED for c in todo):
            print(f"error: {backend.words.submitter} refused some cells; they are failed with its reason (python -m "
                  f"launcher.status {state.sweep_dir}).", file=sys.stderr, flush=True)
            if not any(c.job_id for c in todo):
                finish.finalize(state)  # nothing runs: the sweep is finished as it stands
                return 1
        print(f"Follow with: python -m launcher.status {state.sweep_dir}", flush=True)
        if not cells[0].config.wait:
            _print_mlflow(state)
            return 0
        try:
            with stop_waiting():
                finish.wait(state)
        except KeyboardInterrupt:
            return _stopped_waiting(state)
    print(finish.finalize(state))
    if state.design is not None:
        print(decide.summary(state), flush=True)
    if state.search is not None:
        print(cellsearch.summary(state), flush=True)
    _print_mlflow(state)
    _print_missing_runs(state)
    return 0 if all(c.status is CellStatus.done for c in state.cells) else 1


def refuse_declared(cells: list[Cell]) -> None:
    """Declared nodes were never asked whether they exist: such a grid is planned, not submitted."""
    if cells and cells[0].cluster.declared:
        raise SweepError("cluster.declared=true: these nodes are described, not asked about (no sinfo, no "
                         "nvidia-smi), so the grid can be planned with --plan but not submitted. Fix: add --plan to "
                         "see the plan, or drop cluster.declared to check the grid against the live cluster and "
                         "run it.")


DRIVER_LOCK = ".driver.lock"


@contextlib.contextmanager
def driving(sweep_dir: Path) -> Iterator[None]:
    """This launcher as the sweep's one driver while the block runs. A second launcher on the same
    sweep directory, whatever output_root or sweep_dir led it there, is refused naming the live one,
    so no cell runs twice into one folder. The lock is the kernel's (flock on the directory's lock
    file): it is freed when its process ends, however it ends, so a crashed launcher blocks nobody."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise SweepError(f"sweep_dir={str(sweep_dir)!r} is a file, not a directory. Fix: give a new sweep_dir, or "
                         f"the directory a sweep printed.")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = sweep_dir / DRIVER_LOCK
    with records.holding(lock, wait_s=0) as mine:
        if not mine:
            holder = lock.read_text().strip() if lock.exists() else ""
            host, _, pid = holder.rpartition(":")
            raise SweepError(
                f"sweep_dir={str(sweep_dir)!r} is being driven by another launcher, pid {pid or '?'} on host "
                f"{host or '?'}, still running. Fix: follow it with python -m launcher.status {sweep_dir}; once it "
                f"has ended, the same command resumes what it left; to take over now, stop it first (Ctrl-C in its "
                f"terminal, or kill {pid or 'its pid'} on {host or 'its host'}).")
        yield


def prepare(cells: list[Cell], argv: list[str], predicted: dict[int, fit.StateBytes] | None = None,
            sweep_dir: Path | None = None) -> SweepState:
    """The sweep directory with its document, every cell's spec.json and config.yaml; or, when
    sweep_dir already holds this sweep, that sweep with its unfinished cells planned again.
    ``sweep_dir``: where (run() has taken it as the sweep's driver); else the config's, or a new one."""
    cfg = cells[0].config  # sweep-level settings are uniform (plan._check_uniform)
    if sweep_dir is None:
        sweep_dir = Path(cfg.sweep_dir) if cfg.sweep_dir else records.new_folder(Path(cfg.output_root))
    if (sweep_dir / STATE_FILE).exists():
        return resume(sweep_dir, cells)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    stamp = sweep_dir.name if not cfg.sweep_dir else datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    state = SweepState(name=f"sweep-{stamp}", sweep_dir=str(sweep_dir.resolve()), cluster=cfg.cluster.name,
                       argv=argv, experiment=cfg.tracking.experiment if cfg.tracking.enabled else None,
                       submitter=this_process(), code=tracking.code_provenance())
    if cfg.tracking.enabled:
        state.tracking_uri = tracking.absolute_uri(cfg.tracking.uri) if cfg.tracking.uri else \
            tracking.default_uri(Path(cfg.output_root))
    state.cells = list(cells)
    state.design = decide.design_for(cfg)
    for cell in state.cells:
        state_bytes = (predicted or {}).get(cell.index)
        if state_bytes is not None:
            cell.predicted_state_bytes = state_bytes.total
            cell.predicted_activation_bytes = state_bytes.activations
            cell.predicted_comm_bytes = dict(state_bytes.comm_bytes_per_step)
    # Cells run in the foreground log no MLflow from their ranks: the launcher waits for each cell
    # anyway and logs its metrics.jsonl into its run as it ends (one SQLite writer, no MLflow import
    # on rank 0). Ranks of cells run in the background log themselves, to the run id create_runs
    # writes into the cell's directory.
    worker_uri = backend_for(state.cluster).worker_tracking_uri(state)
    for cell in state.cells:
        state.save_spec(cell, run_spec(cell, sweep_dir, worker_uri, None))
        write_resolved_config(state.cell_dir(cell) / "config.yaml", cell)
    cellsearch.begin(state)  # cells=auto: the pilot's cells run first, the others wait
    decide.first_round(state)
    state.save()
    return state


def resume(sweep_dir: Path, cells: list[Cell]) -> SweepState:
    """The same command on an existing sweep directory: cells already done are kept, the others run
    again (from their checkpoints where they have one), logging into their existing MLflow runs."""
    try:
        state = SweepState.load(sweep_dir)
    except StateError as exc:
        raise SweepError(str(exc)) from exc
    # A runs=auto sweep has added rounds after the cells the command plans: those are compared.
    if ([c.name for c in state.cells[:len(cells)]] if state.search is None else cellsearch.grid_names(state)) != \
            ([c.name for c in cells] if state.search is None else sorted(c.name for c in cells)):
        raise SweepError(f"sweep_dir={str(sweep_dir)!r} holds another sweep ({len(state.cells)} cells: "
                         f"{', '.join(c.name for c in state.cells[:4])}...). Fix: repeat that sweep's grid to resume "
                         f"it, or give a new sweep_dir.")
    reconcile.refresh(state)  # the cluster's view first: a cell it still runs, or has requeued, is not run twice
    if state.design is not None and (state.design.stopped or "").startswith("interrupted"):
        state.design.stopped = None  # runs=auto: resumed, its rounds go on
    state.submitter, state.code = this_process(), tracking.code_provenance()
    again = [cs for cs in state.cells if cs.status in (CellStatus.planned, *RUN_AGAIN)]
    by_name = {cell.name: cell for cell in cells}
    worker_uri = backend_for(state.cluster).worker_tracking_uri(state)
    for cs in again:
        planned = by_name[cs.name]
        cs.status, cs.job_id, cs.error, cs.failure_class = CellStatus.planned, None, None, None
        # The command's settings now (a cluster.* setting fixed after the cluster refused it, say).
        cs.cluster, cs.layout, cs.resolved = planned.cluster, planned.layout, planned.resolved
        state.save_spec(cs, run_spec(cs, sweep_dir, worker_uri, None))
        write_resolved_config(state.cell_dir(cs) / "config.yaml", cs)
        if state.tracking_uri and cs.run_id:
            tracking.reopen(state.tracking_uri, cs.run_id)
    state.save()
    queued = [cs for cs in state.cells if cs.status in (CellStatus.pending, CellStatus.running)]
    print(f"resuming {state.name}: {sum(cs.status is CellStatus.done for cs in state.cells)} cell(s) done, "
          f"{len(queued)} still queued or running {backend_for(state.cluster).words.where} (left alone), {len(again)} "
          f"to run", flush=True)
    return state


def check_not_running(cells: list[Cell], argv: list[str]) -> None:
    """Refuse to start a sweep whose command is the same as that of a sweep still running in the same
    output_root (two copies would measure each other and double the work); --allow-concurrent
    starts it anyway."""
    cfg = cells[0].config
    if cfg.sweep_dir:
        return  # an explicit sweep_dir resumes that sweep (its queued cells are left alone)
    command = _command(argv)
    for path in sorted(Path(cfg.output_root).glob(f"*/{STATE_FILE}"), reverse=True)[:RUNNING_CHECK_LAST]:
        try:
            other = SweepState.load(path.parent)
        except (StateError, OSError, ValueError):
            continue
        if _command(other.argv) != command or all(c.status.terminal for c in other.cells):
            continue
        reconcile.refresh(other)
        active = [c for c in other.cells if not c.status.terminal]
        if active:
            raise SweepError(
                f"the same sweep is already running: {other.sweep_dir} ({len(active)} of {len(other.cells)} cell(s) "
                f"planned, pending or running), started by the same command. Fix: follow it with python -m "
                f"launcher.status {other.sweep_dir} (or --cancel it); resume it with sweep_dir={other.sweep_dir}; or "
                f"add --allow-concurrent to start a second copy anyway.")


# How many of the newest sweeps in output_root check_not_running reads.
RUNNING_CHECK_LAST = 20


def _command(argv: list[str]) -> list[str]:
    return [a for a in argv if a != "--allow-concurrent"]


def _create_runs(state: SweepState) -> None:
    """The sweep's parent run and its cells' run templates, inline or, for a large sweep whose backend
    says so (Backend.creates_runs_in_background), in the background; a cell's run is created once its
    job has started, by its rank 0 at the job's end or by status and sync, whichever comes first
    (contract/cell_run.py)."""
    if not state.tracking_uri:
        return
    first = not state.parent_run_id
    if first and backend_for(state.cluster).creates_runs_in_background(len(state.cells)):
        pid = runs.start_in_background(state)
        print(f"MLflow: creating {len(state.cells)} cell run(s) in the background (pid {pid}, log "
              f"{state.path / runs.BACKGROUND_LOG}); launcher.status and launcher.sync finish it if it stops.",
              flush=True)
        return
    try:
        runs.ensure_runs(state)
        state.save()
        opened = sum(1 for c in state.cells if c.run_id)
        if first:
                print(f"MLflow: parent run {state.parent_run_id} in {state.tracking_uri}; each cell's run is created "
                  f"with its job's start time ({opened} of {len(state.cells)} so far)", flush=True)
    except Exception as exc:  # the jobs run anyway; their JSONL records hold everything
        print(f"[mlflow] could not create the runs in {state.tracking_uri}: {type(exc).__name__}: {exc}. "
              f"Each cell's metrics.jsonl has its results; launcher.sync creates the runs later.",
              file=sys.stderr, flush=True)


def _cell_ended(state: SweepState, cell: Cell) -> None:
    """After each cell run in the foreground: its one-line result, then its MLflow run created (at its
    job's start) and brought up to date, while nothing runs, so the work never lands in a measurement."""
    if not (cell.error or "").startswith(NOT_STARTED):  # cells an interrupt never started: no line
        print(f"    {progress_line(state, cell)}", file=sys.stderr if cell.status is CellStatus.failed else sys.stdout,
              flush=True)
    _create_runs(state)
    finish.settle_cells(state, [cell])
    state.save()


def _interrupted(state: SweepState, interrupts: Interrupts) -> int:
    """A sweep run in the foreground stopped by a signal: its cells are cancelled (by the backend) and
    their runs KILLED (finish.settle_cells); the parent run ends KILLED too, each with the reason as a tag."""
    reason = f"interrupted by {interrupts.reason}"
    if state.design is not None and not state.design.stopped:
        state.design.stopped = reason  # runs=auto: no further round either
        state.save()
    if state.tracking_uri and state.parent_run_id:
        try:
            tracking.tag_runs(state.tracking_uri, {c.run_id: {STOP_REASON_TAG: reason} for c in state.cells
                                                   if c.run_id and c.status is CellStatus.cancelled})
            tracking.end_parent(state.tracking_uri, state.parent_run_id, "KILLED", {STOP_REASON_TAG: reason})
        except Exception as exc:  # the sweep document holds the truth; the next status settles MLflow
            print(f"[mlflow] could not mark the runs KILLED in {state.tracking_uri}: {exc}", file=sys.stderr)
    _print_mlflow(state)
    return interrupts.exit_code


# The MLflow tag that says why a run was KILLED.
STOP_REASON_TAG = "stop_reason"


def _stopped_waiting(state: SweepState) -> int:
    """Ctrl-C while waiting for the cluster: the jobs are the cluster's now; say so, and how to act on them."""
    active = [c for c in state.cells if not c.status.terminal]
    print(f"\nstopped waiting; the {len(active)} unfinished cell(s) go on {backend_for(state.cluster).words.where} (jobs "
          f"{' '.join(sorted({(c.job_id or '-').split('_')[0] for c in active})[:10]) or '-'}).\n"
          f"Follow them: python -m launcher.status {state.sweep_dir} --wait\n"
          f"Cancel them: python -m launcher.status {state.sweep_dir} --cancel", file=sys.stderr, flush=True)
    return 130


def _said_round(state: SweepState, added: list[Cell]) -> None:
    """One line per round of a runs=auto sweep: what it adds and for which open comparisons."""
    design = state.design
    if design is None or not design.rounds:
        return
    if added:
        last = design.rounds[-1]
        print(f"runs=auto: round {last.number} adds {len(added)} run(s) (to {last.runs} per configuration) for "
              f"{len(last.open)} open comparison(s): {'; '.join(last.open[:4])}", flush=True)
    elif design.stopped:
        print(f"runs=auto: no further round: {design.stopped}", flush=True)


def progress_line(state: SweepState, cell: Cell) -> str:
    """``done: 98.2 samples/s, step p50 81.3 ms`` or ``failed: <first failure>``."""
    if cell.status is not CellStatus.done:
        return f"{cell.status.value}: {cell.error or '-'}"
    try:
        result = state.read_result(cell)
    except StateError as exc:  # named: the report refuses it the same way
        return f"done (its result.json is damaged: {exc})"
    if not result:
        return "done (no result.json)"
    summary = result.get("summary", {})
    rate, step = summary.get(THROUGHPUT_SAMPLES_PER_S), summary.get(STEP_TIME_MS_P50)
    parts = [f"{rate:.1f} samples/s" if isinstance(rate, (int, float)) else None,
             f"step p50 {step:.1f} ms" if isinstance(step, (int, float)) else None]
    return "done: " + ", ".join(p for p in parts if p)


def print_jobs(state: SweepState, limit: int = 20) -> None:
    """One line per submitted cell (the first ``limit``): job id, grid point, directory, MLflow run."""
    for cs in state.cells[:limit]:
        print(f"{cs.job_id}\t{cs.name}\t{state.cell_dir(cs)}\trun {cs.run_id or '-'}", flush=True)
    if len(state.cells) > limit:
        print(f"... and {len(state.cells) - limit} more (python -m launcher.status {state.sweep_dir} --all)")


def _print_mlflow(state: SweepState) -> None:
    if not (state.tracking_uri and state.parent_run_id):
        return
    where = mask("", tracking.ui_url(state.tracking_uri, tracking.experiment_route(str(state.experiment_id))))
    start = "" if state.tracking_uri.startswith(("http://", "https://")) else \
        f"mlflow ui --backend-store-uri {mask('', state.tracking_uri)}, then open "
    print(f"MLflow: {state.tracking_uri} (experiment {state.experiment}, parent run {state.parent_run_id})\n"
          f"Open the UI: {start}{where}", flush=True)


def _print_missing_runs(state: SweepState) -> None:
    """What the store missed (it failed while the sweep ran), and the command that completes it."""
    missing = runs.missing_runs(state)
    if missing:
        print(f"MLflow lacks part of this sweep ({'; '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}): its "
              f"store failed while it ran. The records are in the sweep directory; complete the runs, at their jobs' "
              f"own times: python -m launcher.sync {state.sweep_dir}", file=sys.stderr, flush=True)


def write_resolved_config(path: Path, cell: Cell) -> None:
    """The cell's whole resolved config as YAML (secrets in URIs masked): what this cell ran with."""
    import yaml

    # The text OmegaConf.to_yaml(OmegaConf.structured(config)) gives, at a 20th of the cost: that
    # took ~20 ms per cell, before sbatch (a 16-cell sweep: 0.3 s of its ~0.8 s to submission).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(to_plain(cell.config), Dumper=dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {cell.name}\n# overrides: {' '.join(cell.overrides)}\n" + mask("", text))
