"""A tracking server that goes down during a sweep loses nothing: JSONL first, sync later."""

import json

import pytest
from mlflow.tracking import MlflowClient

from launcher import sweep
from launcher.cluster.backends import backend_for
from launcher.plan.grid import compose, expand
from launcher.plan.planner import plan
from launcher.track.runs import ensure_runs, sync_sweep
from tests.mlflow_server import MlflowServer, free_port

pytestmark = pytest.mark.slow


def test_server_down_during_run_then_sync_restores_every_step(tmp_path, fast_overrides):
    server = MlflowServer(tmp_path / "mlflow.db", free_port(), tmp_path / "server.log").start()
    try:
        points, swept = expand([*fast_overrides, "steps=8", "cluster.tasks_per_node=2", f"tracking.uri={server.uri}",
                                f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}"], multirun=True)
        cells = plan(compose(points, swept))
        state = sweep.prepare(cells, ["test"])
        ensure_runs(state)  # the experiment, the parent run and the cells' run templates exist
        state.save()
        cell = state.cells[0]
        server.stop()  # down for the whole job
        backend_for(state.cluster).submit(state, state.cells)
        assert cell.status == "done"  # the benchmark itself does not care about tracking
        records = [json.loads(x) for x in (state.cell_dir(cell) / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["kind"] == "step"] == list(range(8))

        server.start()
        client = MlflowClient(tracking_uri=server.uri)
        assert cell.run_id is None and ensure_runs(state) == 1  # created now, starting when its job started
        assert client.get_run(cell.run_id).info.start_time == int(1000 * records[0]["time"])
        assert client.get_metric_history(cell.run_id, "loss") == []  # nothing reached it during the outage
        added = sync_sweep(state)
        assert added[cell.name] > 8
        history = client.get_metric_history(cell.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(8))
        run = client.get_run(cell.run_id)
        assert run.info.status == "FINISHED" and run.data.metrics["throughput_samples_per_s"] > 0
        assert run.data.tags["world_size"] == "2"
        # Syncing again adds nothing and duplicates nothing.
        assert sync_sweep(state)[cell.name] == 0
        assert len(client.get_metric_history(cell.run_id, "loss")) == 8
    finally:
        server.stop()
