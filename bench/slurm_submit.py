"""Figure 4: submitting a 16-cell sweep to Slurm, against hydra-submitit-launcher 1.2.0.

Both commands sweep strategy x precision x nodes x seed (2 x 2 x 2 x 2) against the same cluster:
ours with ``python -m launcher -m cluster=slurm ...``, the plugin with the minimal Hydra app in
bench/hsl_app. A shim (sbatch_shim.sh) stands first on PATH for both and logs when each sbatch
call returned, i.e. when Slurm accepted the jobs, and how many calls there were.

Every job is submitted held (``--hold``, through each tool's own additional-parameters setting),
so no benchmark job ever runs and loads the machine while the other side is measured; all of
them are cancelled (scancel, by the ids the shim logged) as soon as a run is measured. Held jobs
never end, which also shows the difference in behaviour: our command returns after submitting,
the plugin blocks until every job has ended and is stopped by this script once its sbatch call
has returned.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import PYTHON, REPO, Row, Settings, bench_env, ratio_of_medians, wait_for_quiet

TARGET = 0.6
# The grid both sides sweep, in keys the reference app has (bench/hsl_app/conf/config.yaml), and
# what ours adds: one run per cell, as the plugin runs each point once (our default is 3).
GRID = ["strategy=ddp,fsdp", "precision=fp32,bf16", "nodes=1,2", "seed=0,1"]
OURS_ONLY = ["runs=1", "fabric.probe=off"]  # the probe is a job of its own (bench/fabric.py states its cost)
CELLS = 16
RESOURCE_SHAPES = 2  # nodes=1 and nodes=2; everything else runs on the same allocation shape


def unavailable() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        # Without SLURM_CONF every Slurm command falls back to a DNS SRV lookup.
        return "SLURM_CONF is not set (eval \"$(bash slurm/local-cluster.sh up | tail -1)\")"
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return "no Slurm client commands on PATH"
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return "hydra-submitit-launcher is not installed (pip install -e '.[bench]')"
    if subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode != 0:
        return "sinfo fails: the cluster does not answer"
    return None


def default_partition() -> str:
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, check=True).stdout.split()
    return next((p.rstrip("*") for p in out if p.endswith("*")), out[0] if out else "debug")


def read_log(path: Path) -> list[tuple[float, float, int, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        start, end, rc, job = line.split(" ", 3)
        rows.append((float(start), float(end), int(rc), job.strip()))
    return rows


def scancel(job_ids: list[str]) -> None:
    ids = [j for j in job_ids if j and j.replace("_", "").isdigit()]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


class Shim:
    def __init__(self, work: Path) -> None:
        real = shutil.which("sbatch")
        self.dir = work / "shim"
        self.dir.mkdir(parents=True, exist_ok=True)
        shim = self.dir / "sbatch"
        shutil.copyfile(REPO / "bench" / "sbatch_shim.sh", shim)
        shim.chmod(0o755)
        self.real = real

    def env(self, log: Path, threads: int) -> dict[str, str]:
        return bench_env(threads, {"PATH": f"{self.dir}{os.pathsep}{os.environ['PATH']}",
                                   "BENCH_REAL_SBATCH": self.real, "BENCH_SBATCH_LOG": str(log)})


def run_plugin_until_accepted(cmd: list[str], log_path: Path, env: dict[str, str], deadline_s: float,
                              stop_wait_s: float) -> float:
    """Start hydra-submitit-launcher's sweep; return the wall time at its start. It submits one job
    array, then waits for its jobs, which are held: it is stopped once sbatch has answered (the shim's
    log has a line) and nothing else is pending from it."""
    sbatch_log = Path(env["BENCH_SBATCH_LOG"])
    with log_path.open("w") as out:
        start = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            deadline = time.monotonic() + deadline_s
            while not read_log(sbatch_log) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(1.0)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=stop_wait_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return start


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    why = unavailable()
    figure = f"4. {CELLS}-cell Slurm sweep: command start -> last cell accepted by sbatch"
    if why:
        log(f"  skipped: {why}")
        return [Row(figure=figure, unit="s", ours=[], reference=[], target=f"ratio <= {TARGET}", passed=None,
                    note=f"skipped: {why}")], {"skipped": why}
    work = settings.work / "slurm"
    work.mkdir(parents=True, exist_ok=True)
    shim = Shim(work)
    partition = default_partition()
    ours_s: list[float] = []
    ref_s: list[float] = []
    ours_calls: list[float] = []
    ref_calls: list[float] = []
    ours_return_s: list[float] = []
    submitted: list[str] = []
    busy: list[float] = []

    # The launcher's fit cache (launcher/plan/fitcache.py) starts empty: the untimed first run analyses
    # the model (torch imported) and its time is row 4d; the timed runs read the cache, as a repeated
    # grid does.
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    # A sweep directory left by an earlier run would be resumed (another code path): start clean.
    for old in [work / "ours", *(p for p in work.glob("plugin-*") if p.is_dir())]:
        shutil.rmtree(old, ignore_errors=True)

    def run_ours(i: int) -> None:
        sbatch_log = work / f"ours-{i}.sbatch.log"
        sbatch_log.unlink(missing_ok=True)
        cmd = [PYTHON, "-m", "launcher", "-m", "cluster=slurm", f"cluster.partition={partition}", *GRID, *OURS_ONLY,
               f"output_root={work / 'ours'}", f"sweep_dir={work / 'ours' / f'sweep-{i}'}",
               "+cluster.additional_parameters.hold=true"]
        with (work / f"ours-{i}.log").open("w") as out:
            start = time.time()
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                  env={**shim.env(sbatch_log, settings.threads), "XDG_CACHE_HOME": str(cache)},
                                  cwd=REPO, timeout=300)
            end = time.time()
        calls = read_log(sbatch_log)
        submitted.extend(c[3] for c in calls)
        scancel([c[3] for c in calls])
        if proc.returncode != 0 or not calls or any(c[2] for c in calls):
            raise RuntimeError(f"our sweep failed (exit {proc.returncode}); see {work / f'ours-{i}.log'}")
        ours_s.append(max(c[1] for c in calls) - start)
        ours_calls.append(len(calls))
        ours_return_s.append(end - start)

    def run_plugin(i: int) -> None:
        sbatch_log = work / f"plugin-{i}.sbatch.log"
        sbatch_log.unlink(missing_ok=True)
        cmd = [PYTHON, str(REPO / "bench" / "hsl_app" / "app.py"), "-m", *GRID,
               f"hydra.sweep.dir={work / f'plugin-{i}'}", f"hydra.launcher.partition={partition}",
               "+hydra.launcher.additional_parameters.hold=true"]
        start = run_plugin_until_accepted(cmd, work / f"plugin-{i}.log", shim.env(sbatch_log, settings.threads),
                                          deadline_s=120, stop_wait_s=10)
        calls = read_log(sbatch_log)
        submitted.extend(c[3] for c in calls)
        scancel([c[3] for c in calls])
        if not calls or any(c[2] for c in calls):
            raise RuntimeError(f"the plugin's sweep failed; see {work / f'plugin-{i}.log'}")
        ref_s.append(max(c[1] for c in calls) - start)
        ref_calls.append(len(calls))

    try:
        log("  warm-up: one untimed run of each (MLflow store created, file caches warm)")
        run_ours(-1)
        cold_s = list(ours_s)
        run_plugin(-1)
        for values in (ours_s, ref_s, ours_calls, ref_calls, ours_return_s):
            values.clear()
        # Runs are short (seconds) and one stray process moves them by a second: twice the repeats.
        repeats = 2 * settings.repeats
        log(f"  {repeats} x (launcher, plugin), ABBA order; partition {partition}")
        for i in range(repeats):
            order = ((run_ours, ours_s, "launcher"), (run_plugin, ref_s, "plugin"))
            for fn, values, name in (order if i % 2 == 0 else order[::-1]):
                busy.append(wait_for_quiet(settings.quiet_wait_s, log))
                fn(i)
                log(f"    {name} #{i + 1}: last cell accepted {values[-1]:.3f} s after start")
    finally:
        scancel(submitted)  # whatever happened, leave no benchmark job in the queue

    ratio = ratio_of_medians(ours_s, ref_s)
    rows = [
        Row(figure=figure, unit="s", ours=ours_s, reference=ref_s, target=f"ratio <= {TARGET}",
            passed=None if ratio is None else ratio <= TARGET, ratio=ratio,
            note="reference: hydra-submitit-launcher 1.2.0 (bench/hsl_app)"),
        Row(figure=f"4b. sbatch calls for the {CELLS} cells ({RESOURCE_SHAPES} resource shapes)", unit="calls",
            ours=ours_calls, reference=ref_calls, target=f"ours <= {RESOURCE_SHAPES}",
            passed=bool(ours_calls) and max(ours_calls) <= RESOURCE_SHAPES,
            note="the plugin makes 1: one allocation shape for every cell, nodes=2 cells included"),
        Row(figure="4c. our command returns (jobs held, never end; MLflow runs created after sbatch)", unit="s",
            ours=ours_return_s, reference=[], target="returns without waiting for jobs",
            passed=bool(ours_return_s), note="the plugin blocks until every job ends"),
        Row(figure="4d. our first launch of a model not analysed before (empty fit cache: torch imported, the "
                   "model built on the meta device and run on fake tensors before the first sbatch)", unit="s", ours=cold_s,
            reference=[], target="(info)", passed=None, note="the untimed warm-up run"),
    ]
    details = {"partition": partition, "ours_return_s_median": statistics.median(ours_return_s),
               "busy_cores_at_start": busy}
    return rows, details


if __name__ == "__main__":
    import sys

    from bench.common import render_table

    rows, _ = run(Settings(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 1), print)
    print(render_table(rows))
