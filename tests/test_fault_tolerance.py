"""Requeue and preemption with exact resume, and a killed rank, on the real Slurm test cluster."""

import json
import os
import signal
import subprocess
import time

import pytest
from mlflow.tracking import MlflowClient

from launcher.commands import status
from launcher.state import SweepState
from tests.test_slurm import FAST, slurm_cluster, submit  # noqa: F401  (module fixture: skip without Slurm)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def wait_for_step(state: SweepState, rank: int, step: int, timeout_s: float = 90) -> dict:
    path = state.cell_dir(state.cells[0]) / "ranks" / f"rank{rank}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            beat = json.loads(path.read_text())
            if beat.get("step") is not None and beat["step"] >= step and beat["state"] == "running":
                return beat
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"rank {rank} never reached step {step}")


def assert_resumed_exactly(state: SweepState, steps: int) -> dict:
    cell = state.cells[0]
    d = state.cell_dir(cell)
    assert cell.status == "done", status.render(state)
    result = json.loads((d / "result.json").read_text())
    meta = json.loads((d / "checkpoint" / (d / "checkpoint" / "latest").read_text().strip() / "meta.json").read_text())
    assert result["summary"]["restarts"] == 1
    assert meta["ranks_saved"] == cell.world_size  # every rank wrote its part of the checkpoint
    assert 0 < meta["step"] < steps
    assert len(result["losses"]) == steps  # the step count continued exactly: no step lost, none repeated
    records = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in records if r["kind"] == "step") == list(range(steps))
    client = MlflowClient(tracking_uri=state.tracking_uri)
    history = client.get_metric_history(cell.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(steps))  # one run, continuous, no duplicates
    assert client.get_run(cell.run_id).info.status == "FINISHED"
    return meta


def test_scontrol_requeue_resumes_at_the_right_step(tmp_path):
    steps, every = 400, 20
    state = submit(tmp_path, "nodes=2", f"steps={steps}", "warmup_steps=5", "cluster.cpus_per_task=1",
                   f"checkpoint.every_steps={every}")
    beat = wait_for_step(state, 1, 45)
    subprocess.run(["scontrol", "requeue", state.cells[0].job_id], check=True)
    assert status.wait(state, timeout_s=240)
    assert_resumed_exactly(state, steps)
    result = json.loads((state.cell_dir(state.cells[0]) / "result.json").read_text())
    resumed = int(result["tags"]["resumed_from_step"])
    # Requeue sends SIGTERM to the tasks and to srun, and srun answers its own SIGTERM with SIGKILL
    # to the tasks: the checkpoint the ranks start on SIGTERM may or may not complete first. Either
    # way the job resumes from the newest complete checkpoint, never from an older one or from 0.
    newest_periodic = (beat["step"] + 1) // every * every
    assert newest_periodic <= resumed < steps, (resumed, beat)


def test_warning_signal_checkpoints_all_ranks_and_requeues(tmp_path):
    steps = 400
    state = submit(tmp_path, "nodes=2", f"steps={steps}", "warmup_steps=5", "cluster.cpus_per_task=1")
    beat = wait_for_step(state, 0, 40)
    # What Slurm sends signal_delay_s before the time limit or a preemption: USR2 to every task.
    subprocess.run(["scancel", "--signal=USR2", state.cells[0].job_id], check=True)
    assert status.wait(state, timeout_s=240)
    meta = assert_resumed_exactly(state, steps)
    result = json.loads((state.cell_dir(state.cells[0]) / "result.json").read_text())
    # No periodic checkpoints here: the job resumed from the one saved on the warning, after the
    # step the ranks had reached when it came; that checkpoint is the newest.
    assert int(result["tags"]["resumed_from_step"]) == meta["step"] > beat["step"]


def test_killed_rank_fails_the_job_fast_and_is_named(tmp_path):
    state = submit(tmp_path, "nodes=2", "steps=100000", "warmup_steps=5", "cluster.cpus_per_task=1")
    beat = wait_for_step(state, 1, 20)
    pids = []
    for r in (0, 1):
        pids.append(json.loads((state.cell_dir(state.cells[0]) / "ranks" / f"rank{r}.json").read_text())["pid"])
    t0 = time.monotonic()
    os.kill(beat["pid"], signal.SIGKILL)
    assert status.wait(state, timeout_s=60)
    assert time.monotonic() - t0 < 60
    cell = state.cells[0]
    assert cell.status == "failed"
    assert cell.error.startswith(f"rank 1 on {beat['host']} died"), cell.error
    # A rank gone without a word while its heartbeat said running: SIGKILL, mostly the OOM killer.
    assert cell.failure_class == "oom"
    run = MlflowClient(tracking_uri=state.tracking_uri).get_run(cell.run_id)
    assert run.info.status == "FAILED" and "rank 1" in run.data.tags["error"]
    assert run.data.tags["failure_class"] == "oom"
    time.sleep(1)
    for pid in pids:  # no stray rank left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
