"""MLflow runs whose processes are gone are closed by the finishing step, with the reason: a local
sweep whose launcher and ranks were killed (SIGKILL: nothing of theirs could close anything)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from launcher import finish, status
from launcher.plan.cell import CellStatus
from launcher.state import SweepState
from tests.stores import existing_store

pytestmark = pytest.mark.slow


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def test_runs_left_running_by_a_killed_local_sweep_are_closed_with_the_reason(tmp_path, fast_overrides, capsys):
    sweep_dir = tmp_path / "sweep"
    existing_store(tmp_path)
    cmd = [sys.executable, "-m", "launcher", "-m", *fast_overrides, "steps=8,4000", f"output_root={tmp_path}",
           f"sweep_dir={sweep_dir}"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    job = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job is None:
            time.sleep(0.5)
            try:
                doc = json.loads((sweep_dir / "sweep.json").read_text())
            except (OSError, ValueError):
                continue
            second = doc["cells"][1]
            # Running, with its ranks' first line written: the kill must come after the job began.
            started = list(sweep_dir.glob("cells/01-*/metrics.jsonl"))
            if (second["status"] == "running" and (sweep_dir / "mlflow.json").exists() and started
                    and started[0].read_text().strip()):
                job = int(second["job_id"])
        assert job is not None, "the second cell never started"
        time.sleep(1)
    finally:
        _killpg(launcher.pid)  # the launcher, then the cell's ranks (their own session): no goodbye from anyone
        if job is not None:
            _killpg(job)
        launcher.wait(timeout=30)
    state = SweepState.load(sweep_dir)
    client = MlflowClient(tracking_uri=state.tracking_uri)
    # What the kill left behind: the parent RUNNING, and no run yet for the killed cell (a cell's run
    # is created at its job's start by whoever needs it first: here, the next status).
    assert state.cells[1].run_id is None
    assert client.get_run(state.parent_run_id).info.status == "RUNNING"

    assert status.main([str(sweep_dir)]) == 1
    print(capsys.readouterr().out)
    assert finish.wait_for_settled(sweep_dir)  # status settles MLflow in a detached process
    state = SweepState.load(sweep_dir)
    assert [c.status for c in state.cells] == [CellStatus.done, CellStatus.failed]
    assert "without reporting an error" in state.cells[1].error or "ended without a result" in state.cells[1].error
    runs = {r.info.run_id: r for r in client.search_runs([state.experiment_id])}
    assert not [r for r in runs.values() if r.info.status == "RUNNING"], {r.info.run_id: r.info.status
                                                                          for r in runs.values()}
    killed = runs[state.cells[1].run_id]
    assert killed.info.status == "FAILED" and "processes are gone" in killed.data.tags["closed_by"]
    first = json.loads((state.cell_dir(state.cells[1]) / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kind"] == "start" and killed.info.start_time == int(1000 * first["time"])  # when its job began
    assert runs[state.cells[0].run_id].info.status == "FINISHED"
    assert runs[state.parent_run_id].info.status == "FAILED"
    assert (sweep_dir / "report.md").exists()
