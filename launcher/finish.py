"""A sweep's finish, reached by every path: the launcher with wait=true (the sweep's end),
``launcher.status`` with or without --wait, ``launcher.report <sweep_dir>`` and ``launcher.sync``.

Each cell reconciled with its backend, the finished cells' interference flagged, the MLflow runs
settled, the report written (launcher/report/report.py writes it; this decides when) and the
parent run closed with it. The commands call it, so none of them imports another for it.
"""

from __future__ import annotations

import sys

from launcher.cluster import colocation
from launcher.plan.cell import CellStatus
from launcher.report import report
from launcher.state import SweepState
from launcher.track import reconcile, runs, tracking


def finalize(state: SweepState, force: bool = True) -> str | None:
    """The one finishing step: each cell reconciled with Slurm (launcher/track/reconcile.py), the
    finished cells' interference flagged, the MLflow runs settled (statuses, failure and cancel tags,
    runs left RUNNING by processes that are gone closed, runs the store missed created), then
    report.md with its findings written and the parent run closed (FAILED if any cell did not finish,
    KILLED if those were all cancelled). The report is written when ``force``, or when every cell
    has ended and the report does not show these statuses yet; a parent run that missed the report
    (its store failed, or the sweep ran with tracking=off and was synced since) is closed with the
    report as it was written. Returns the ranking table and the report's path when it wrote one."""
    changed = _reconcile(state)
    # runs=auto: the sweep has ended only once no further round comes (launcher/decide.py).
    finished = all(c.status.terminal for c in state.cells) and (state.design is None or bool(state.design.stopped))
    outcome = state.outcome()
    write_now = force or (finished and state.reported != outcome)
    close_now = finished and bool(state.tracking_uri) and (write_now or state.closed != outcome)
    state.save()
    if state.tracking_uri and (changed or write_now or close_now):
        _settle_runs(state)
    elif runs.missing_runs(state):  # a run the store missed; none waits on a background creator
        _settle_runs(state, wait=False)
    if not (write_now or close_now):
        return None
    written = report.write_sweep_report(state) if write_now else report.written_report(state)
    if close_now:
        _close_parent(state, written, outcome)
    if finished:
        state.reported = outcome
    state.save()
    return _said(state, written) if write_now else None


def _reconcile(state: SweepState) -> bool:
    """Each cell's state from its backend, then the interference of the cells that finished; whether
    either changed the sweep (then its runs must be settled again)."""
    refreshed = reconcile.refresh(state)
    before = [c.interference for c in state.cells]
    colocation.flag(state, refreshed.times)  # before the rows: the findings leave flagged cells out
    return bool(refreshed.changed) or before != [c.interference for c in state.cells]


def _said(state: SweepState, written: report.Report) -> str:
    """What the terminal shows of a report just written: the tables, the claims, where it is."""
    measured = any(c.status is CellStatus.done for c in state.cells)
    claims = _claims(written.findings) if measured else "nothing was measured: no cell finished"
    return f"{written.tables}\n\nFindings (the full section is in report.md):\n{claims}\n\nreport: {written.path}"


def _close_parent(state: SweepState, written: report.Report, outcome: str) -> None:
    """The parent run's description (its page in the MLflow UI: links to the report and the compare
    page, the ranking table, the findings), the report attached, and its end: KILLED when the cells
    that did not finish were all cancelled (an interrupted sweep), as their runs."""
    uri, parent = state.tracking_uri, state.parent_run_id
    if not (uri and parent):
        return
    ended = {c.status for c in state.cells} - {CellStatus.done}
    parent_status = "FINISHED" if not ended else "KILLED" if ended == {CellStatus.cancelled} else "FAILED"
    try:
        links = tracking.parent_links(str(state.experiment_id), parent, [c.run_id for c in state.cells if c.run_id])
        tracking.describe_parent(uri, parent,
                                 f"{links}\n\n## Results\n\n{written.tables}\n\n## Findings\n\n{written.findings}",
                                 [written.cells_csv] if written.cells_csv else [])
        tracking.close_parent(uri, parent, written.path, written.plots, parent_status, runs.sweep_end_s(state))
        state.closed = outcome
    except Exception as exc:  # the report is on disk; a tracking outage must not hide it
        print(f"[mlflow] could not attach the report to run {parent}: {exc}", file=sys.stderr)


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
            out.append(line)
    return "\n".join(out) or "no measurable difference to report"


def _settle_runs(state: SweepState, wait: bool = True) -> None:
    """Every run the sweep's cells have reached exists (a large sweep's are created in the background;
    ``wait``: for that creator), and each agrees with its cell."""
    try:
        runs.complete_runs(state, wait)
        runs.settle(state)
    except Exception as exc:  # the report is on disk; a tracking outage must not hide it
        print(f"[mlflow] could not settle the runs in {state.tracking_uri}: {exc}", file=sys.stderr)


