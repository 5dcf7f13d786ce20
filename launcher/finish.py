"""A sweep's finish, reached by every path: the launcher with wait=true (the sweep's end),
``launcher.status`` with or without --wait, ``launcher.report <sweep_dir>`` and ``launcher.sync``.

Each cell reconciled with its backend, the finished cells' interference flagged, the report written
(launcher/report/markdown.py writes it, with the records that span sweeps kept here; this decides when), and the MLflow side settled: every run the
cells have reached exists and agrees with its cell, and the parent run is closed with the report.
The commands call it, so none of them imports another for it.

``launcher.status`` is what people run most, and MLflow's client takes seconds to import: status
settles in the background (``python -m launcher.finish <sweep_dir>``, detached, its output in
SETTLE_LOG) and prints its table without importing MLflow; a large sweep's report is written there
too (REPORT_INLINE_CELLS). The other paths settle and write inline. Nothing
is lost: a run counts as settled only once it agrees with its cell (state.SETTLED_FILE), and the
next status or sync settles whatever is not. One background settler works per sweep and at most one
waits; a status that finds one waiting starts none, since the waiting one reads the sweep after this
status saved it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from contract import records
from launcher import decide
from launcher.cluster import colocation
from launcher.forecast import fabric, inputs, timelimit
from launcher.plan.cell import Cell, CellStatus
from launcher.report import health, noisefloor, plots, searched
from launcher.report.collect import collect, looks_of
from launcher.report.markdown import CELLS_FILE, PLOTS_DIR, REPORT_FILE, Report, write
from launcher.report.noisefloor import floor_key
from launcher.report.rows import md_cell
from launcher.state import SweepState
from launcher.track import reconcile, runs, tracking

SETTLE_LOG = "mlflow-settle.log"
SETTLE_LOCK = "mlflow-settle.lock"  # held by whoever writes to the sweep's runs, for one batch
QUEUE_LOCK = "mlflow-settle-queue.lock"  # held by the background settler waiting for its turn
TURN_LOCK = "mlflow-settle-turn.lock"  # held by the background settler at work
BATCH = 50  # cells per batch in the background: a foreground settle waits at most one batch
# Above this many cells status leaves a due report to the background too (1000 cells: ~1.5 s and more).
REPORT_INLINE_CELLS = 200


def finalize(state: SweepState, force: bool = True, background: bool = False) -> str | None:
    """The one finishing step: each cell reconciled with its backend, the finished cells'
    interference flagged, report.md with its findings written, and the MLflow runs settled
    (statuses, failure and cancel tags, runs left RUNNING by processes that are gone closed, runs the
    store missed created) with the parent run closed (FAILED if any cell did not finish, KILLED if
    those were all cancelled). The report is written when ``force``, or when every cell has ended and
    the report does not show these statuses yet. ``background``: the MLflow part runs in a detached
    process (launcher.status). Returns the ranking table and the report's path when it wrote one."""
    before = _kept(state)
    _reconcile(state)
    if not background:
        _settle_runs(state)  # before the report: its cells.csv names every cell's run
    inline = force or not background or len(state.cells) <= REPORT_INLINE_CELLS
    written = _report(state, force) if inline else None
    if _kept(state) != before:
        state.save()  # once: a thousand cells take a second to write
    if not background:
        _close_if_due(state, written)
    elif mlflow_due(state) or report_due(state):
        settle_in_background(state)
        if report_due(state):
            return f"the sweep has ended: its report is being written in the background to {state.path / REPORT_FILE}"
    return _said(state, written) if written else None


def refresh(state: SweepState, settle: bool = True) -> reconcile.Refreshed:
    """Each cell's state from its backend and, with ``settle``, the runs of the cells that changed
    settled inline. A plain ``launcher.status`` leaves them to :func:`finalize`'s detached
    ``launcher.finish``: importing MLflow alone takes about 2 s, and a thousand changed cells a minute."""
    refreshed = reconcile.refresh(state)
    if refreshed.changed and settle:
        settle_cells(state, refreshed.changed)
    return refreshed


def wait(state: SweepState, poll_s: float = 2.0, timeout_s: float | None = None, stream=sys.stdout) -> bool:
    """Block until every cell is finished; returns False on timeout. Always ends: a job that leaves
    both the queue and accounting makes its cell lost (refresh), not pending for good."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    while True:
        refresh(state)
        line = state.progress()
        if line != last:
            print(line, file=stream, flush=True)
            last = line
        if all(c.status.terminal for c in state.cells) and not decide.advance(state, stream):
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


def _reconcile(state: SweepState) -> None:
    """Each cell's state from its backend, then the interference of the cells that finished (before
    the rows: the findings leave flagged cells out); the caller saves."""
    times = reconcile.refresh(state, save=False).times
    colocation.flag(state, times)
    timelimit.note_used(state, times)


def _kept(state: SweepState) -> str:
    """What finalize may change in the document: the cells' outcome and runs, the report's outcome."""
    return f"{state.outcome()}{[(c.run_id, c.error, c.restarts) for c in state.cells]}{state.reported}"


def report_due(state: SweepState) -> bool:
    """Every cell has ended and report.md does not show them yet (written here or in the background)."""
    return (state.ended()
            and state.outcome() not in (state.reported, state.settled().get("reported")))


def _report(state: SweepState, force: bool) -> Report | None:
    """report.md written when ``force``, or when it is due."""
    if not (force or report_due(state)):
        return None
    written = write_sweep_report(state)
    if state.ended():
        state.reported = state.outcome()
    return written


def _said(state: SweepState, written: Report) -> str:
    """What the terminal shows of a report just written: the tables, the claims, where it is."""
    measured = any(c.status is CellStatus.done for c in state.cells)
    claims = _claims(written.findings) if measured else "nothing was measured: no cell finished"
    return (f"{written.tables}\n\nFindings (the full section is in report.md):\n{claims}\n\nreport: {written.path}"
            + (f"\n\nThe answer, one line per question:\n{written.answer_bullets}" if written.answers else ""))


def _claims(findings: str) -> str:
    """The findings' statements (bullets and warnings) under their headings, for the terminal."""
    out: list[str] = []
    heading = None
    for line in findings.splitlines():
        if line.startswith("### "):
            heading = line[4:]
        elif line.startswith(("- ", "⚠")):
            if heading:
                out.append(f"{heading}:")
                heading = None
            out.append(line.removesuffix(":"))  # its sub-points (why, next) are report.md's
    return "\n".join(out) or "no measurable difference to report"


# ---- the MLflow side: inline, or in the background for launcher.status -------------------------

def mlflow_due(state: SweepState) -> bool:
    """Whether MLflow lacks part of the sweep, read from the sweep directory alone (no MLflow import):
    a run that does not show its cell yet, a run or the parent run not created, the parent not closed."""
    return bool(state.tracking_uri) and bool(state.unsettled() or runs.missing_runs(state) or _close_due(state))


def settle_cells(state: SweepState, cells: Sequence[Cell]) -> None:
    """These cells' runs brought up to date now (created where their job has started or ended)."""
    if state.tracking_uri and cells:
        with _held(state.path / SETTLE_LOCK):
            state.record_settled([c for c in cells if runs.finish_cell(state, c)])


def _settle_runs(state: SweepState) -> None:
    """Inline: every run the cells have reached exists and agrees with its cell."""
    if not state.tracking_uri:
        return
    try:
        with _held(state.path / SETTLE_LOCK):
            runs.ensure_runs(state)
            state.record_settled([c for c in state.unsettled() if runs.finish_cell(state, c)])
            runs.settle(state)  # one paged search: runs changed behind the sweep's back agree again
    except Exception as exc:  # the report is on disk; a tracking outage must not hide it
        print(f"[mlflow] could not settle the runs in {state.tracking_uri}: {exc}", file=sys.stderr)


def _closable(state: SweepState) -> bool:
    return bool(state.parent_run_id) and state.ended()


def _close_due(state: SweepState) -> bool:
    """The sweep has ended and its parent run does not show this outcome, or this report, yet."""
    path = state.path / REPORT_FILE
    written_ns = path.stat().st_mtime_ns if path.exists() else None
    return _closable(state) and (state.closed != state.outcome()
                                 or state.settled().get("report_mtime_ns") != written_ns)


def _close_if_due(state: SweepState, written: Report | None) -> None:
    """The parent run closed with the report (the one just written, or report.md as it was written:
    a synced sweep's noise floor and host are those of where it ran)."""
    if not (state.tracking_uri and _closable(state) and (written is not None or _close_due(state))):
        return
    _close_parent(state, written or written_report(state), state.outcome())


def _close_parent(state: SweepState, written: Report, outcome: str) -> None:
    """The parent run's description (its page in the MLflow UI: links to the report and the compare
    page, the ranking table, the findings), the fabric's figures and files, the report attached, and its end: KILLED when the cells
    that did not finish were all cancelled (an interrupted sweep), as their runs."""
    uri, parent = state.tracking_uri, state.parent_run_id
    if not (uri and parent):
        return
    ended = {c.status for c in state.cells} - {CellStatus.done}
    parent_status = "FINISHED" if not ended else "KILLED" if ended == {CellStatus.cancelled} else "FAILED"
    try:
        links = tracking.parent_links(str(state.experiment_id), parent, [c.run_id for c in state.cells if c.run_id])
        # The recommendation first: a long sweep's findings are cut at MLflow's tag size, at their end.
        found = written.findings
        at = found.find("### Recommendation")
        found = f"{found[at:]}\n\n{found[:at]}" if at > 0 else found
        answer = f"## The answer\n\n{written.answer_bullets}\n\n" if written.answers else ""
        tracking.describe_parent(uri, parent, f"{links}\n\n{answer}"
                                 + f"## Results\n\n{written.tables}\n\n## Findings\n\n{found}",
                                 [written.cells_csv] if written.cells_csv else [])
        tracking.tag_verdicts(uri, parent, written.answers)
        tracking.log_figures(uri, {parent: written.figures, **written.cell_figures})
        attach_anatomy(state)
        probed = fabric.read_sweep(state.path)
        tracking.log_by_step(uri, parent, fabric.parent_figures(probed))
        for one in probed:
            tracking.attach(uri, parent, [f for f in (one.folder / fabric.PROBE_FILE, one.folder / fabric.RESULT_FILE)
                                          if f.exists()], f"{fabric.PROBE_DIR}/{one.folder.name}")
        tracking.close_parent(uri, parent, written.path, written.plots, parent_status, runs.sweep_end_s(state))
        state.record_settled(closed=outcome, report_mtime_ns=written.path.stat().st_mtime_ns)
    except Exception as exc:  # the report is on disk; a tracking outage must not hide it
        print(f"[mlflow] could not attach the report to run {parent}: {exc}", file=sys.stderr)


def attach_anatomy(state: SweepState) -> None:
    """Each finished cell's step anatomy (one stacked bar, launcher/report/plots.py) as
    ``anatomy.png`` in its directory and on its MLflow run."""
    rows = {row["cell"]: row for row in collect(state)}
    for cell in state.cells:
        row = rows.get(cell.name)
        if cell.run_id and row is not None:
            path = plots.anatomy([row], state.cell_dir(cell) / "anatomy.png")
            if path is not None:
                tracking.attach(str(state.tracking_uri), cell.run_id, [path])


def settle_in_background(state: SweepState) -> int | None:
    """``python -m launcher.finish <sweep_dir>``, detached from this command; its pid, or None where a
    settler is waiting for its turn already (it reads the sweep after this process saved it)."""
    if not _free(state.path / QUEUE_LOCK):
        return None
    with open(state.path / SETTLE_LOG, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.finish", state.sweep_dir], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def settle_from_background(sweep_dir: Path) -> None:
    """The background settler's work: the runs created, then the cells' runs settled batch by batch,
    each batch on the sweep as it is then (a status may have saved it since the last one), then one
    pass over every run and the parent run closed once the sweep has ended."""
    with _turn(sweep_dir) as mine:
        if not mine:
            return
        state, created = SweepState.load(sweep_dir), False
        if state.tracking_uri:
            try:
                created = runs.ensure_runs(state) > 0
                state = _settle_batches(sweep_dir)
            except Exception as exc:  # the store fails: the next status or sync tries again
                print(f"[mlflow] could not settle the runs of {sweep_dir}: {type(exc).__name__}: {exc}", flush=True)
        # A report status left to this process, or one written before runs were created here (its
        # cells.csv names every cell's run).
        written = write_sweep_report(state) if report_due(state) or (created and _closable(state)) else None
        if written is not None and state.ended():
            state.record_settled(reported=state.outcome())
        _close_if_due(state, written)


def _settle_batches(sweep_dir: Path) -> SweepState:
    """The unsettled cells' runs in batches, then every run once more in one pass; the sweep as the
    last batch read it."""
    failed: set[int] = set()  # cells whose run failed to settle in this pass: the next status retries them
    while True:
        with _held(sweep_dir / SETTLE_LOCK):
            state = SweepState.load(sweep_dir)
            batch = [c for c in state.unsettled() if c.index not in failed][:BATCH]
            done = [c for c in batch if runs.finish_cell(state, c)]
            state.record_settled(done)
            failed |= {c.index for c in batch} - {c.index for c in done}
            if not batch:
                runs.settle(state)
                return state


def wait_for_settled(sweep_dir: Path, timeout_s: float = 120.0) -> bool:
    """Block until no background settler works or waits on the sweep, MLflow holds all of it and its
    report is written;
    False after ``timeout_s`` (the store fails, say). For scripts and tests that read MLflow after
    ``launcher.status``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        idle = all(_free(Path(sweep_dir) / name) for name in (QUEUE_LOCK, TURN_LOCK))
        state = SweepState.load(sweep_dir)
        if idle and not (mlflow_due(state) or report_due(state)):
            return True
        time.sleep(0.2)
    return False


# ---- the sweep's report and the records that span sweeps -------------------------------------

def write_sweep_report(state: SweepState) -> Report:
    """The sweep's report; its repeated runs refresh the cluster's noise floor, which in turn is the
    noise of any configuration here that ran once."""
    rows = collect(state)
    source = {"cluster": state.cluster, "command": " ".join(state.argv), "sweep dir": state.sweep_dir}
    if state.tracking_uri:
        source.update({"MLflow": state.tracking_uri, "parent run": state.parent_run_id or "-"})
    key = floor_key(state)
    if all(c.status.terminal for c in state.cells):
        noisefloor.record(state.path.parent, key, rows, state.name)
    floor = noisefloor.load(state.path.parent, key)
    source["noise floor"] = (f"{floor.where} ({noisefloor.FLOOR_FILE} beside the sweep directory)" if floor
                             else "none measured on this cluster yet")
    probed = fabric.read_sweep(state.path)
    for one in probed:  # a Slurm sweep's probe ended after the launcher returned: kept here
        fabric.keep(state.path.parent, one, state.name)
    checked = _forecasts_checked(state, rows, key)
    written = write(rows, state.path, f"Benchmark report: {state.name}", source, floor,
                    [*searched.section(state), *timelimit.section(state), *health.section(state.path),
                     *fabric.section(probed), *checked.section], looks_of(state))
    written.figures, written.cell_figures = checked.figures, checked.cell_figures
    written.plots += health.sweep_plots(state.path)  # attached with the others to the parent run
    return written


def _forecasts_checked(state: SweepState, rows: list[dict[str, Any]], key: str) -> inputs.SweepCheck:
    """The forecasts checked (kept in the cluster's record once every cell has ended); a problem is
    said in the section, never raised: it must not cost the measured report."""
    try:
        return inputs.check(state, rows, key, keep=all(c.status.terminal for c in state.cells))
    except Exception as exc:
        print(f"report: forecasts not checked: {type(exc).__name__}: {exc}", file=sys.stderr)
        return inputs.SweepCheck(["## Forecasts checked", "", f"Not checked: {md_cell(type(exc).__name__)}: "
                                     f"{md_cell(exc)}", ""], {}, {})


def written_report(state: SweepState) -> Report:
    """The sweep's report as it was written, to close a parent run with it unchanged: it was written
    where the sweep ran (a synced sweep's noise floor and host are that machine's, not this one's).
    Written now only where it is gone."""
    out_dir = state.path
    if not (out_dir / REPORT_FILE).exists():
        return write_sweep_report(state)
    text = (out_dir / REPORT_FILE).read_text()
    cells_csv = out_dir / CELLS_FILE
    return Report(out_dir / REPORT_FILE, plots=sorted((out_dir / PLOTS_DIR).glob("*.png")),
                  tables=_section(text, "Results"), findings=_section(text, "Findings"),
                  cells_csv=cells_csv if cells_csv.exists() else None,
                  answers=[line[2:] for line in _section(text, "The answer").splitlines() if line.startswith("- ")])


def _section(markdown: str, heading: str) -> str:
    """The text under ``## heading``, up to the next heading of that level."""
    lines = markdown.splitlines()
    if f"## {heading}" not in lines:
        return ""
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end]).strip()


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    # A turn at settling, not a record write: it waits for the one at work (contract/records.py).
    with records.holding(path, wait_s=None):
        yield


@contextlib.contextmanager
def _turn(sweep_dir: Path) -> Iterator[bool]:
    """A background settler's turn: False (leave) where another one waits already; else wait for the
    one at work, if any, then hand the waiting place on before working."""
    with contextlib.ExitStack() as turn:
        with records.holding(sweep_dir / QUEUE_LOCK, wait_s=0) as queued:
            if queued:
                turn.enter_context(records.holding(sweep_dir / TURN_LOCK, wait_s=None))
        yield queued  # the queue is free from here: a new settler may wait, it reads what this one may miss


def _free(path: Path) -> bool:
    with records.holding(path, wait_s=0) as free:
        return free


if __name__ == "__main__":
    os.nice(10)  # background work: the status calls and benchmarks of this machine come first
    settle_from_background(Path(sys.argv[1]))
