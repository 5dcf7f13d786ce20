"""Rank 0's sinks across a restart: one record per step in metrics.jsonl and in a real MLflow store."""

import json

from mlflow.tracking import MlflowClient

from jobs.sinks import FanOut, JsonlSink, MlflowSink


def _records(lo, hi, attempt):
    return [{"step": s, "loss": 10.0 - s, "step_time_ms": 100.0 + attempt} for s in range(lo, hi)]


def test_a_step_logged_before_a_kill_is_not_logged_again_after_the_resume(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("sinks")).info.run_id
    path = tmp_path / "metrics.jsonl"

    # First attempt: logs steps 0..76 before its stop-checkpoint, then is killed before the
    # checkpoint completes (no finish): the resumed job restarts from an older checkpoint (60).
    first = JsonlSink(path)
    sink = FanOut(first, MlflowSink(uri, run_id), logged_steps=first.logged_steps())
    sink.log_steps(_records(0, 77, attempt=1))
    sink.flush()

    # Second attempt: its history holds steps 0..59 from the checkpoint and 60..99 it ran itself.
    second = JsonlSink(path)
    assert second.logged_steps() == set(range(77))
    sink = FanOut(second, MlflowSink(uri, run_id), logged_steps=second.logged_steps())
    sink.log_steps(_records(0, 100, attempt=2))
    sink.finish("FINISHED")

    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if '"kind": "step"' in line]
    assert sorted(steps) == list(range(100))  # every step once
    history = client.get_metric_history(run_id, "step_time_ms")
    assert sorted(m.step for m in history) == list(range(100))
    # The record kept for a re-run step is the one logged first.
    assert {m.step: m.value for m in history}[70] == 101.0
    assert {m.step: m.value for m in history}[80] == 102.0
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_line_cut_short_by_a_killed_writer_does_not_hide_the_steps_before_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log_steps(_records(0, 3, attempt=1))
    with path.open("a") as f:
        f.write('{"kind": "step", "step": 3, "lo')  # killed mid-line
    resumed = JsonlSink(path)
    assert resumed.logged_steps() == {0, 1, 2}
    resumed.log_steps(_records(3, 5, attempt=2))  # the resumed run's records start on a line of their own
    assert JsonlSink(path).logged_steps() == {0, 1, 2, 3, 4}


def test_sync_replays_system_samples_with_their_time(tmp_path):
    # A local cell's ranks log nothing to MLflow: the GPU samples in metrics.jsonl reach the run
    # through launcher.sync, at their sample index and with the time they were taken.
    from mlflow.tracking import MlflowClient

    from launcher.track.runs import sync_run

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    records = [{"kind": "system", "step": i, "time": 1_700_000_000.0 + i, "system/node0/gpu0_power_w": 300.0 + i}
               for i in range(3)]
    assert sync_run(client, run_id, records) == 3
    history = sorted(client.get_metric_history(run_id, "system/node0/gpu0_power_w"), key=lambda m: m.step)
    assert [(m.step, m.value, m.timestamp) for m in history] == [
        (i, 300.0 + i, (1_700_000_000 + i) * 1000) for i in range(3)]
    assert sync_run(client, run_id, records) == 0  # nothing twice
