"""Interrupting a local sweep, with real processes and real signals: Ctrl-C (SIGINT to the launcher's
process group, as a terminal sends it), SIGTERM or SIGHUP to the launcher alone (a CI timeout, a
wrapper script, a closed terminal). The running cell stops at a step boundary with its checkpoint,
no further cell starts, no process is left behind, the cells are cancelled, never done, and no
MLflow run stays RUNNING (read back from a real SQLite store)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launcher import finish
from tests.conftest import FAST
from tests.stores import existing_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# Two ranks (two emulated nodes); a short first cell that completes, then long ones that do not.
SWEEP = [*FAST, "nodes=2"]


def as_a_terminal_starts_it() -> None:
    """The child's SIGINT as in a terminal's foreground job: a suite started in the background by a
    shell without job control ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """The launcher as a terminal starts it: in a process group of its own, whose leader it is."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLFLOW_DISABLE_TELEMETRY="true")
    existing_store(tmp_path / "out")
    cmd = [sys.executable, "-m", "launcher", "-m", *SWEEP, f"output_root={tmp_path / 'out'}", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            process_group=0, preexec_fn=as_a_terminal_starts_it)


def sweep_dir(tmp_path: Path) -> Path:
    found = list((tmp_path / "out").glob("*/sweep.json"))
    return found[0].parent if found else tmp_path / "none"


def wait_for_step(tmp_path: Path, cell_prefix: str, step: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until rank 0 of the cell reports ``step`` in its heartbeat (the ranks are in the step loop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        for beat in (tmp_path / "out").glob(f"*/cells/{cell_prefix}*/ranks/rank0.json"):
            try:
                if (json.loads(beat.read_text()).get("step") or -1) >= step:
                    return
            except ValueError:
                pass  # written as we read it
        time.sleep(0.1)
    raise AssertionError(f"cell {cell_prefix} never reached step {step}")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cell_processes(sweep: Path) -> list[int]:
    """Every process a cell had: each local job's controller (its job id) and every rank (heartbeats)."""
    doc = json.loads((sweep / "sweep.json").read_text())
    pids = [int(c["job_id"]) for c in doc["cells"] if c.get("job_id")]
    for beat in sweep.glob("cells/*/ranks/rank*.json"):
        pids.append(json.loads(beat.read_text())["pid"])
    return pids


def assert_nothing_left(sweep: Path) -> None:
    pids = cell_processes(sweep)
    assert pids, "no process was recorded"
    deadline = time.monotonic() + 5  # the kernel reaps within moments
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []


def mlflow_runs(tmp_path: Path) -> dict[str, tuple[str, dict]]:
    """{run name: (status, tags)} of every run in the sweep's SQLite store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {r.info.run_name: (r.info.status, r.data.tags) for r in runs}


def cells(sweep: Path) -> list[dict]:
    return json.loads((sweep / "sweep.json").read_text())["cells"]


def test_ctrl_c_stops_the_running_cell_at_a_step_boundary_and_starts_no_other(tmp_path):
    proc = start(tmp_path, "steps=12,4000,4001")
    wait_for_step(tmp_path, "01-", 2, proc)  # the first cell is done, the second is training
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
    out, _ = proc.communicate(timeout=90)
    stopped_s = time.monotonic() - signalled
    sweep = sweep_dir(tmp_path)

    assert proc.returncode == 130, out
    assert stopped_s < 30, out  # the ranks agree within ~2 s; MLflow's closing takes the rest
    assert "Traceback" not in out
    assert f"Resume with: python -m launcher.status {sweep} --resubmit-failed" in out
    assert_nothing_left(sweep)

    first, second, third = cells(sweep)
    assert first["status"] == "done"
    assert second["status"] == "cancelled" and "interrupted by SIGINT (Ctrl-C) at step" in second["error"]
    assert "checkpoint saved" in second["error"], second["error"]
    assert third["status"] == "cancelled" and third["error"].startswith("not started") and not third["job_id"]
    stopped = sweep / "cells" / second["dirname"]
    assert (stopped / "checkpoint" / "latest").exists()  # the same stop agreement as a preemption
    assert not (stopped / "result.json").exists()  # stopped before its window completed: no throughput
    assert "cancelled: interrupted by SIGINT" in out and "done: " in out.split("[2/3]")[0]
    assert "[3/3]" not in out  # no further cell was submitted

    runs = mlflow_runs(tmp_path)
    assert "RUNNING" not in {status for status, _ in runs.values()}, runs
    assert runs["steps=12"][0] == "FINISHED"
    for name in ("steps=4000", "steps=4001"):
        assert runs[name][0] == "KILLED" and runs[name][1]["stop_reason"] == "interrupted by SIGINT (Ctrl-C)"
    parent = next(v for k, v in runs.items() if k.startswith("sweep-"))
    assert parent[0] == "KILLED" and parent[1]["stop_reason"] == "interrupted by SIGINT (Ctrl-C)"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_launcher_alone_stops_its_ranks_too(tmp_path, capsys, signum):
    # Only the launcher is signalled (a wrapper's kill, a closed terminal): its ranks must not be orphaned.
    proc = start(tmp_path, "steps=4000,4001")
    wait_for_step(tmp_path, "00-", 2, proc)
    os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=90)
    sweep = sweep_dir(tmp_path)
    name = signal.Signals(signum).name

    assert proc.returncode == 128 + signum, out
    assert_nothing_left(sweep)
    first, second = cells(sweep)
    assert first["status"] == "cancelled" and f"interrupted by {name}" in first["error"]
    assert second["status"] == "cancelled" and not second["job_id"]
    runs = mlflow_runs(tmp_path)
    assert {status for status, _ in runs.values()} == {"KILLED"}, runs
    assert "Traceback" not in out
    # status afterwards: every cell cancelled, and nothing claimed of what was never measured.
    from launcher.commands import status

    status.main([str(sweep)])
    said = capsys.readouterr().out
    assert "(2 cancelled)" in said and "nothing was measured: no cell finished" in said, said


def test_resubmit_failed_resumes_an_interrupted_cell_from_its_checkpoint(tmp_path):
    proc = start(tmp_path, "steps=300")
    wait_for_step(tmp_path, "00-", 2, proc)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signal.SIGTERM, out
    sweep = sweep_dir(tmp_path)
    (cell,) = cells(sweep)
    assert cell["status"] == "cancelled" and "checkpoint saved" in cell["error"], cell
    pointer = sweep / "cells" / cell["dirname"] / "checkpoint" / "latest"
    saved_step = int(pointer.read_text().strip().split("-")[-1])

    env = dict(os.environ, PYTHONPATH=str(ROOT), MLFLOW_DISABLE_TELEMETRY="true")
    again = subprocess.run([sys.executable, "-m", "launcher.status", str(sweep), "--resubmit-failed"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert "Traceback" not in again.stdout + again.stderr, again.stderr
    assert finish.wait_for_settled(sweep)  # status settles MLflow in a detached process
    (cell,) = cells(sweep)
    assert cell["status"] == "done", again.stdout + again.stderr
    tags = json.loads((sweep / "cells" / cell["dirname"] / "result.json").read_text())["tags"]
    assert tags["restarts"] == "1" and tags["resumed_from_step"] == str(saved_step), tags
    runs = mlflow_runs(tmp_path)
    assert {status for status, _ in runs.values() if status != "KILLED"} <= {"FINISHED"}, runs
    assert [status for name, (status, _) in runs.items() if not name.startswith("sweep-")] == ["FINISHED"], runs


def test_a_second_ctrl_c_ends_at_once_and_leaves_no_process(tmp_path):
    proc = start(tmp_path, "steps=12,4000")
    wait_for_step(tmp_path, "01-", 2, proc)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - signalled < 5, out  # at once: no wait for a checkpoint, nor for MLflow
    assert proc.returncode == 130, out
    sweep = sweep_dir(tmp_path)
    assert_nothing_left(sweep)
    first, second = cells(sweep)
    assert first["status"] == "done"
    assert second["status"] == "cancelled" and "a second signal" in second["error"], second
    assert not (sweep / "cells" / second["dirname"] / "result.json").exists()
    # Ending at once leaves MLflow as it was; the next status settles it (runs whose processes are gone).
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLFLOW_DISABLE_TELEMETRY="true")
    status = subprocess.run([sys.executable, "-m", "launcher.status", str(sweep)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert "Traceback" not in status.stdout + status.stderr, status.stderr
    assert finish.wait_for_settled(sweep)  # status settles MLflow in a detached process
    runs = mlflow_runs(tmp_path)
    assert "RUNNING" not in {state for state, _ in runs.values()}, runs
    assert runs["steps=4000"][0] == "KILLED", runs


def test_the_local_controller_gets_the_environment_submitit_gives_it():
    # launcher/cluster/local/submit.py starts submitit's local controller itself (in a session of its own): with the
    # same environment variables as submitit's own start_controller, checked against its source.
    import inspect

    from submitit.local import local

    source = inspect.getsource(local.start_controller)
    ours = inspect.getsource(__import__("launcher.cluster.local.submit", fromlist=["_start_controller"])._start_controller)
    names = {word.split("=")[0] for word in source.replace("(", " ").replace(",", " ").split() if word.startswith("SUBMITIT_")}
    assert names and all(f"{name}=" in ours for name in names), names


@pytest.mark.slurm
def test_ctrl_c_while_waiting_for_slurm_stops_waiting_only(tmp_path):
    import shutil

    if not os.environ.get("SLURM_CONF") or not shutil.which("squeue"):
        pytest.skip("no Slurm cluster: run the tests with scripts/test (it starts slurm/local-cluster.sh)")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLFLOW_DISABLE_TELEMETRY="true")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "launcher", *FAST, "cluster=slurm", "cluster.timeout_min=10", "steps=4000", "wait=true",
           f"output_root={tmp_path}", f"sweep_dir={sweep}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
                            preexec_fn=as_a_terminal_starts_it)
    lines = []
    for line in proc.stdout:  # the launcher waits once it says how to follow the jobs
        lines.append(line)
        if line.startswith("Follow with:"):
            break
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=60)[0]
    try:
        assert proc.returncode == 130, out
        assert "go on in Slurm" in out and f"python -m launcher.status {sweep} --cancel" in out, out
        assert "Traceback" not in out
        (cell,) = cells(sweep)
        queued = subprocess.run(["squeue", "-h", "-j", cell["job_id"].split("_")[0], "-o", "%T"], capture_output=True,
                                text=True, timeout=30).stdout.split()
        assert queued and queued[0] in ("PENDING", "RUNNING", "CONFIGURING"), queued  # the job goes on
    finally:
        subprocess.run([sys.executable, "-m", "launcher.status", str(sweep), "--cancel"], env=env,
                       capture_output=True, timeout=120)
