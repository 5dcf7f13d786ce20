"""``python -m launcher.status <sweep_dir>``: progress, wait, cancel, resubmit failed cells.

Works from any later shell: everything it needs is in the sweep directory (sweep.json, each
cell's spec.pkl, result.json and error files) and in Slurm's accounting (sacct).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from launcher.state import CellState, SweepState

TERMINAL = ("done", "failed", "cancelled")


# A rank that fails because a peer vanished reports a communication error; the peer is the cause.
_COMM_ERROR = re.compile(r"DistBackendError|Connection (reset|closed|refused)|Gloo|NCCL|timed out|Timeout|"
                         r"Broken pipe|recvBytes|Socket", re.IGNORECASE)


def first_failure(cell_dir: Path) -> Optional[str]:
    """Which rank failed first, on which node, and why, from what the ranks left behind.

    Priority: a rank the stall watchdog ended; then a rank's own error (an exception that is not a
    communication error); then a rank that died without a word (its heartbeat says it was running:
    SIGKILL, the OOM killer, a segfault); then communication errors, which are consequences.
    """
    beats = {}
    for path in (cell_dir / "ranks").glob("rank*.json"):
        try:
            rec = json.loads(path.read_text())
            beats[rec["rank"]] = rec
        except (OSError, ValueError, KeyError):
            continue
    stalled = sorted((cell_dir / "ranks").glob("stalled-rank*.txt"), key=lambda p: p.stat().st_mtime)
    if stalled:
        return stalled[0].read_text().splitlines()[0]
    errors = sorted(cell_dir.glob("error-rank*.txt"), key=lambda p: p.stat().st_mtime)
    first_lines = [e.read_text().splitlines()[0] for e in errors]
    own = [line for line in first_lines if not _COMM_ERROR.search(line)]
    if own:
        return own[0]
    reported = {int(re.search(r"rank(\d+)", e.name).group(1)) for e in errors}
    silent = sorted((rec for r, rec in beats.items() if rec.get("state") in ("starting", "running") and r not in reported),
                    key=lambda rec: rec.get("time", 0))
    if silent:
        rec = silent[0]
        where = f"at step {rec['step']}" if rec.get("step") is not None else "before its first step"
        tail = f"; then {first_lines[0]}" if first_lines else ""
        return (f"rank {rec['rank']} on {rec['host']} died {where} without reporting an error (killed by a signal, "
                f"e.g. SIGKILL or the out-of-memory killer){tail}")
    return first_lines[0] if first_lines else None


def _local_alive(job_id: Optional[str]) -> bool:
    if not job_id:
        return False
    try:
        os.kill(int(job_id), 0)
        return True
    except (OSError, ValueError):
        return False


def finish_tracking(state: SweepState, cell: CellState) -> None:
    """Replay what the worker could not log, then make the run's status agree with the job's."""
    if not (state.tracking_uri and cell.run_id):
        return
    from launcher.sync import sync_cell
    from launcher.tracking import reconcile

    sync_cell(state, cell)
    try:
        from launcher.tracking import attach_cell_artifacts

        attach_cell_artifacts(state.tracking_uri, cell.run_id, state.cell_dir(cell), state.path / "submitit",
                              cell.job_id)
        reconcile(state.tracking_uri, cell.run_id, cell.status, cell.error)
    except Exception as exc:  # a tracking outage must not break status; the next refresh retries
        print(f"[mlflow] could not update run {cell.run_id}: {exc}", file=sys.stderr)


def refresh(state: SweepState) -> None:
    """Bring every cell's status up to date (one sacct call on Slurm); save if anything changed."""
    pending = [c for c in state.cells if c.status not in TERMINAL and c.job_id]
    slurm_states: Dict[str, str] = {}
    if state.cluster == "slurm" and pending:
        from launcher.slurm import job_states

        slurm_states = job_states([c.job_id for c in pending])
    changed = False
    for cell in pending:
        before = cell.status
        has_result = (state.cell_dir(cell) / "result.json").exists()
        if state.cluster == "slurm":
            job = slurm_states.get(cell.job_id, "pending")  # not yet in accounting: just submitted
            if job == "completed":
                cell.status = "done" if has_result else "failed"
                cell.error = None if has_result else (first_failure(state.cell_dir(cell)) or "job ended without a result")
            elif job in ("failed", "cancelled"):
                cell.status = job
                cell.error = first_failure(state.cell_dir(cell)) or f"Slurm job {cell.job_id} {job}"
            else:
                cell.status = job
        else:
            if has_result:
                cell.status, cell.error = "done", None
            elif not _local_alive(cell.job_id):
                cell.status, cell.error = "failed", first_failure(state.cell_dir(cell)) or "job ended without a result"
            else:
                cell.status = "running"
        if cell.status != before:
            changed = True
            if cell.status in TERMINAL:
                finish_tracking(state, cell)
    if changed:
        state.save()


def render(state: SweepState, width: int = 30) -> str:
    counts: Dict[str, int] = {}
    for c in state.cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    finished = sum(counts.get(s, 0) for s in TERMINAL)
    total = len(state.cells)
    filled = int(width * finished / total) if total else width
    bar = "#" * filled + "." * (width - filled)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    lines = [f"{state.name}: [{bar}] {finished}/{total} finished ({summary})"]
    for c in state.cells:
        err = f"  {c.error}" if c.error and c.status in ("failed", "cancelled") else ""
        lines.append(f"  {c.job_id or '-':>14}  {c.status:<9} {c.name}{err}")
    return "\n".join(lines)


def wait(state: SweepState, poll_s: float = 2.0, timeout_s: Optional[float] = None, stream=sys.stdout) -> bool:
    """Block until every cell is finished; returns False on timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    while True:
        refresh(state)
        line = render(state).splitlines()[0]
        if line != last:
            print(line, file=stream, flush=True)
            last = line
        if all(c.status in TERMINAL for c in state.cells):
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


def cancel(state: SweepState) -> List[str]:
    """Cancel every unfinished cell; their status becomes 'cancelled' once Slurm confirms it."""
    refresh(state)
    active = [c for c in state.cells if c.status not in TERMINAL and c.job_id]
    if state.cluster == "slurm":
        from launcher.slurm import cancel as scancel

        scancel([c.job_id for c in active])
    else:
        import signal

        for c in active:
            try:
                os.kill(int(c.job_id), signal.SIGTERM)  # the local controller forwards it to its ranks
            except (OSError, ValueError):
                pass
    return [c.job_id for c in active]


def resubmit_failed(state: SweepState) -> List[CellState]:
    """Submit again only the failed and cancelled cells, same specs, same MLflow runs."""
    refresh(state)
    again = [c for c in state.cells if c.status in ("failed", "cancelled")]
    if not again:
        return []
    from launcher import submit

    cluster = pickle.loads((state.path / "cluster.pkl").read_bytes())
    groups: Dict[tuple, List[CellState]] = {}
    specs = {}
    for c in again:
        spec = state.load_spec(c)
        specs[c.index] = spec
        for stale in state.cell_dir(c).glob("error-rank*.txt"):
            stale.unlink()
        groups.setdefault(tuple(vars(spec.layout).values()), []).append(c)
    if state.cluster == "slurm":
        ordered = list(groups.values())
        jobs = submit.submit_arrays(state.path / "submitit", cluster,
                                    [(specs[g[0].index].layout, [specs[c.index] for c in g]) for g in ordered],
                                    job_name=state.name)
        for c, job in zip([c for g in ordered for c in g], jobs, strict=True):
            c.job_id, c.status, c.error = job.job_id, "submitted", None
            c.resubmits += 1
    else:
        from jobs.worker import Worker

        for c in again:
            executor = submit.local_executor(state.path / "submitit", specs[c.index].layout, cluster.timeout_min)
            job = executor.submit(Worker(), specs[c.index])
            c.job_id, c.status, c.error = job.job_id, "submitted", None
            c.resubmits += 1
    if state.tracking_uri:
        from launcher.tracking import reopen

        for c in again:
            if c.run_id:
                reopen(state.tracking_uri, c.run_id)
    state.save()
    return again


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--wait", action="store_true", help="block until every cell has finished, then report")
    parser.add_argument("--timeout-s", type=float, default=None, help="give up waiting after this many seconds")
    parser.add_argument("--cancel", action="store_true", help="cancel every unfinished cell")
    parser.add_argument("--resubmit-failed", action="store_true", help="submit failed/cancelled cells again")
    parser.add_argument("--report", action="store_true", help="print the comparison table")
    args = parser.parse_args(argv)
    try:
        state = SweepState.load(args.sweep_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.cancel:
        ids = cancel(state)
        print(f"cancelled {len(ids)} job(s): {' '.join(ids) or '-'}")
    if args.resubmit_failed:
        cells = resubmit_failed(state)
        print(f"resubmitted {len(cells)} cell(s): " + ", ".join(f"{c.name} -> {c.job_id}" for c in cells))
    if args.wait:
        if not wait(state, timeout_s=args.timeout_s):
            print("timed out waiting", file=sys.stderr)
            return 3
    refresh(state)
    print(render(state))
    if args.report or args.wait:
        from launcher.sweep import finalize

        print(finalize(state))
    return 0 if all(c.status == "done" for c in state.cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
