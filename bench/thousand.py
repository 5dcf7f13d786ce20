"""Figure 6: a 1000-cell Slurm sweep, the scale ops teams schedule, against hydra-submitit-launcher.

The grid is ``seed=range(0,250) strategy=ddp,fsdp nodes=1,2``: 1000 cells in two resource shapes.
Every job is submitted held and cancelled once measured, as in figure 4 (bench/slurm_submit.py).
Measured, each once per repeat (a 1000-job run is long enough that one stray process moves it little):

- 6a. our command with tracking=off: start -> return (every cell accepted by sbatch);
- 6b. our command with the default SQLite MLflow store: start -> return, the parent and 1000 child
  runs being created by a background ``launcher.sync`` that the sweep state tracks; and 6b' the
  time until that background work has finished (every child run exists);
- the plugin: start -> last cell accepted by sbatch (it would then block until every job ends);
- 6c. ``python -m launcher.status`` over the 1000-cell sweep (one sacct call, one squeue call);
- 6d. the same once cells have changed: 10 of the held jobs are cancelled outside the launcher
  (scancel, as an administrator would), then status; 6e. the other 990 cancelled, then status (990
  cells changed, and the sweep has ended: its report is due), and 6e' the call after it.

Needs a cluster whose MaxArraySize admits 1000 tasks (the plugin submits one array; ours would split
it): run it against a test cluster started with the default, e.g.
``SLURM_LOCAL_DIR=/tmp/slurm-bench SLURM_LOCAL_PORT_OFFSET=700 bash slurm/local-cluster.sh up``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import PYTHON, REPO, Row, Settings, ratio_of_medians
from bench.slurm_submit import Shim, default_partition, read_log, run_plugin_until_accepted, scancel, unavailable
from contract.cell_run import TEMPLATE_FILE
from launcher.cluster.slurm.resources import max_array_size

GRID = ["seed=range(0,250)", "strategy=ddp,fsdp", "nodes=1,2"]  # keys the reference app has
OURS_ONLY = ["runs=1"]  # one run per cell, as the plugin runs each point once
CELLS = 1000
TARGET_RETURN_S = 15.0
TARGET_STATUS_S = 2.0
FEW_CHANGED = 10  # 6d: cells whose jobs end between two status calls, as when a sweep is finishing
STATUS_TIMEOUT_S = 600.0


def _ours(work: Path, shim: Shim, partition: str, name: str, tracking: list[str], threads: int,
          submitted: list[str]) -> tuple[float, Path]:
    sbatch_log = work / f"{name}.sbatch.log"
    sbatch_log.unlink(missing_ok=True)
    sweep = work / "ours" / name
    cmd = [PYTHON, "-m", "launcher", "-m", "cluster=slurm", f"cluster.partition={partition}", *GRID, *OURS_ONLY, *tracking,
           f"output_root={work / 'ours'}", f"sweep_dir={sweep}", "+cluster.additional_parameters.hold=true"]
    with (work / f"{name}.log").open("w") as out:
        start = time.time()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=shim.env(sbatch_log, threads),
                              cwd=REPO, timeout=600)
        elapsed_s = time.time() - start
    calls = read_log(sbatch_log)
    submitted.extend(c[3] for c in calls)
    if proc.returncode != 0 or not calls or any(c[2] for c in calls):
        raise RuntimeError(f"our sweep failed (exit {proc.returncode}); see {work / f'{name}.log'}")
    return elapsed_s, sweep


def _runs_done_s(sweep: Path, started: float, timeout_s: float = 600) -> float:
    """Seconds from the command's start until the parent run and every cell's run template exist
    (background creation; a cell's run itself is created once its job starts: contract/cell_run.py)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(sweep.glob(f"cells/*/{TEMPLATE_FILE}"))) >= CELLS and (sweep / "mlflow.json").exists():
            return time.time() - started
        time.sleep(0.25)
    raise RuntimeError(f"the background run creation did not finish in {timeout_s} s ({sweep / 'mlflow-runs.log'})")


def _plugin(work: Path, shim: Shim, partition: str, threads: int, submitted: list[str]) -> float:
    sbatch_log = work / "plugin.sbatch.log"
    sbatch_log.unlink(missing_ok=True)
    cmd = [PYTHON, str(REPO / "bench" / "hsl_app" / "app.py"), "-m", *GRID, f"hydra.sweep.dir={work / 'plugin'}",
           f"hydra.launcher.partition={partition}", "+hydra.launcher.additional_parameters.hold=true"]
    start = run_plugin_until_accepted(cmd, work / "plugin.log", shim.env(sbatch_log, threads), deadline_s=600,
                                      stop_wait_s=20)
    calls = read_log(sbatch_log)
    submitted.extend(c[3] for c in calls)
    if not calls or any(c[2] for c in calls):
        raise RuntimeError(f"the plugin's sweep failed; see {work / 'plugin.log'}")
    return max(c[1] for c in calls) - start


def _status_s(sweep: Path, threads: int, timeout_s: float = STATUS_TIMEOUT_S) -> tuple[float, str]:
    """Seconds ``launcher.status`` took, and its first line; a call past ``timeout_s`` is stopped and
    counted as ``timeout_s`` (a lower bound), its line saying so."""
    start = time.time()
    try:
        proc = subprocess.run([PYTHON, "-m", "launcher.status", str(sweep)], capture_output=True, text=True, cwd=REPO,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return timeout_s, f"stopped after {timeout_s:.0f} s"
    return time.time() - start, proc.stdout


def _logged_status(sweep: Path, threads: int, what: str, log: Callable[[str], None]) -> float:
    took, out = _status_s(sweep, threads)
    log(f"    status, {what}: {took:.2f} s: {out.splitlines()[0] if out else '-'}")
    return took


def _cancel_outside(sweep: Path, first: int, count: int, timeout_s: float = 120) -> None:
    """scancel the jobs of the sweep's cells ``first .. first+count-1``, as an administrator would (the
    launcher is not told), and wait until the queue no longer holds them and accounting has caught up."""
    jobs = [c["job_id"] for c in json.loads((sweep / "sweep.json").read_text())["cells"][first : first + count]]
    scancel(jobs)
    arrays = ",".join(sorted({j.split("_")[0] for j in jobs}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", arrays], capture_output=True, text=True,
                                timeout=60).stdout.split()
        if not set(jobs) & set(queued):
            time.sleep(2.0)  # accounting lags the queue by a second or two
            return
        time.sleep(0.5)
    raise RuntimeError(f"scancel of {count} job(s) of {sweep} did not take effect in {timeout_s} s")


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    figure = f"6a. {CELLS}-cell Slurm sweep, tracking=off: command start -> return (every cell accepted)"
    why = unavailable()
    size = None if why else max_array_size()
    if not why and (size or 0) < CELLS:
        why = f"the cluster's MaxArraySize is {size}; the plugin submits one {CELLS}-task array"
    if why:
        log(f"  skipped: {why}")
        return [Row(figure=figure, unit="s", ours=[], reference=[], target=f"<= {TARGET_RETURN_S} s", passed=None,
                    note=f"skipped: {why}")], {"skipped": why}
    work = settings.work / "thousand"
    shutil.rmtree(work, ignore_errors=True)  # a sweep_dir that exists would be resumed, not submitted
    work.mkdir(parents=True, exist_ok=True)
    shim, partition = Shim(work), default_partition()
    submitted: list[str] = []
    off_s, with_s, runs_s, plugin_s, status_s = [], [], [], [], []
    few_s: list[float] = []
    all_s: list[float] = []
    after_s: list[float] = []
    try:
        for i in range(settings.repeats):
            elapsed, _ = _ours(work, shim, partition, f"off-{i}", ["tracking=off"], settings.threads, submitted)
            off_s.append(elapsed)
            scancel(submitted)
            log(f"    ours, tracking=off #{i + 1}: {elapsed:.1f} s")
            started = time.time()
            elapsed, sweep = _ours(work, shim, partition, f"mlflow-{i}", [], settings.threads, submitted)
            with_s.append(elapsed)
            runs_s.append(_runs_done_s(sweep, started))
            log(f"    ours, SQLite MLflow #{i + 1}: returned {elapsed:.1f} s, runs created {runs_s[-1]:.1f} s")
            took, out = _status_s(sweep, settings.threads)
            status_s.append(took)
            log(f"    status #{i + 1}: {took:.2f} s: {out.splitlines()[0] if out else '-'}")
            _cancel_outside(sweep, 0, FEW_CHANGED)
            few_s.append(_logged_status(sweep, settings.threads, f"{FEW_CHANGED} cells changed", log))
            _cancel_outside(sweep, FEW_CHANGED, CELLS - FEW_CHANGED)
            all_s.append(_logged_status(sweep, settings.threads, f"{CELLS - FEW_CHANGED} more changed", log))
            after_s.append(_logged_status(sweep, settings.threads, "the next call", log))
            scancel(submitted)
            plugin_s.append(_plugin(work, shim, partition, settings.threads, submitted))
            scancel(submitted)
            log(f"    plugin #{i + 1}: last cell accepted {plugin_s[-1]:.1f} s after start")
    finally:
        scancel(submitted)
    note = "reference: hydra-submitit-launcher 1.2.0, start -> last cell accepted (it then blocks until jobs end)"
    rows = [
        Row(figure=figure, unit="s", ours=off_s, reference=plugin_s, target=f"<= {TARGET_RETURN_S} s",
            passed=bool(off_s) and max(off_s) <= TARGET_RETURN_S, ratio=ratio_of_medians(off_s, plugin_s), note=note),
        Row(figure="6b. the same with the default SQLite MLflow (runs created in the background)", unit="s",
            ours=with_s, reference=plugin_s, target=f"<= {TARGET_RETURN_S} s",
            passed=bool(with_s) and max(with_s) <= TARGET_RETURN_S, ratio=ratio_of_medians(with_s, plugin_s),
            note=note),
        Row(figure="6b'. start -> parent and 1000 child runs all created (background launcher.sync)", unit="s",
            ours=runs_s, reference=[], target="tracked by the sweep state; status/sync finish it", passed=bool(runs_s)),
        Row(figure=f"6c. launcher.status over the {CELLS}-cell sweep", unit="s", ours=status_s, reference=[],
            target=f"<= {TARGET_STATUS_S} s", passed=bool(status_s) and max(status_s) <= TARGET_STATUS_S),
        Row(figure=f"6d. launcher.status after {FEW_CHANGED} cells changed (jobs cancelled outside the launcher)",
            unit="s", ours=few_s, reference=[], target=f"<= {TARGET_STATUS_S} s",
            passed=bool(few_s) and max(few_s) <= TARGET_STATUS_S),
        Row(figure=f"6e. launcher.status after the other {CELLS - FEW_CHANGED} cells changed (the sweep has ended)",
            unit="s", ours=all_s, reference=[], target=f"<= {TARGET_STATUS_S} s",
            passed=bool(all_s) and max(all_s) <= TARGET_STATUS_S,
            note=f"a call stopped at {STATUS_TIMEOUT_S:.0f} s counts as {STATUS_TIMEOUT_S:.0f} s"),
        Row(figure="6e'. the next launcher.status call", unit="s", ours=after_s, reference=[],
            target=f"<= {TARGET_STATUS_S} s", passed=bool(after_s) and max(after_s) <= TARGET_STATUS_S),
    ]
    return rows, {"partition": partition, "max_array_size": size, "grid": GRID}


if __name__ == "__main__":
    import sys

    from bench.common import render_table

    rows, details = run(Settings(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 1), print)
    print(render_table(rows))
    print(json.dumps(details))
