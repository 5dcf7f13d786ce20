"""A sweep measured where MLflow is not installed (tracking=off, as on an offline GPU node), carried
off as a tarball and logged to an MLflow store afterwards, from wherever it was extracted."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from launcher.commands import status, sync
from launcher.report.__main__ import main as report_main
from launcher.state import SweepState

pytestmark = pytest.mark.slow

TINY = ["model=mlp", "steps=6", "warmup_steps=2", "repeats=1", "runs=1"]


def _offline_sweep(node: Path) -> Path:
    """Two cells measured with tracking=off, in a process where ``import mlflow`` fails (the node has none)."""
    no_mlflow = node / "site"
    (no_mlflow / "mlflow").mkdir(parents=True)
    (no_mlflow / "mlflow" / "__init__.py").write_text("raise ImportError('mlflow is not installed on this node')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(no_mlflow), *sys.path])}
    sweep_dir = node / "outputs" / "sweep"
    done = subprocess.run([sys.executable, "-m", "launcher", "-m", *TINY, "strategy=ddp,fsdp", "tracking=off",
                           f"output_root={node / 'outputs'}", f"sweep_dir={sweep_dir}"], env=env, cwd=node,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return sweep_dir


def _carry(sweep_dir: Path, login: Path, name: str) -> Path:
    """The sweep directory as a tarball extracted on another machine: another absolute path."""
    archive = login / "sweep.tar.gz"
    if not archive.exists():
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(sweep_dir, arcname="sweep")
    with tarfile.open(archive) as tar:
        tar.extractall(login / name, filter="data")
    return login / name / "sweep"


def _records(cell_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]


def _all_runs(client: MlflowClient) -> list:
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_an_offline_sweep_is_synced_from_its_extracted_tarball(tmp_path, capsys):
    node, login = tmp_path / "gpu-node", tmp_path / "login"
    login.mkdir()
    measured = _offline_sweep(node)
    extracted = _carry(measured, login, "from-node")
    shutil.rmtree(node)  # sweep.json's absolute paths name a machine that is not this one
    uri = f"sqlite:///{login / 'store' / 'mlflow.db'}"
    (login / "store").mkdir()
    capsys.readouterr()
    assert sync.main([str(extracted)]) == 2  # no store named: refused, nothing made, and how to name one
    assert "--tracking-uri URI" in capsys.readouterr().err and not list((login / "store").iterdir())

    assert sync.main([str(extracted), "--tracking-uri", uri]) == 0
    state = SweepState.load(extracted)
    assert state.tracking_uri == uri and state.parent_run_id and all(c.run_id for c in state.cells)
    client = MlflowClient(tracking_uri=uri)
    runs = {r.info.run_id: r for r in _all_runs(client)}
    assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs.values())

    for cell in state.cells:
        run, records = runs[cell.run_id], _records(state.cell_dir(cell))
        result = state.read_result(cell)
        assert run.data.tags["mlflow.parentRunId"] == state.parent_run_id and run.data.tags["cell"] == cell.name
        # The job's own times, from its records: its first line (start) and its last (status).
        assert records[0]["kind"] == "start" and run.info.start_time == int(1000 * records[0]["time"])
        assert records[-1]["kind"] == "status" and run.info.end_time == int(1000 * records[-1]["time"])
        numbers = {k: v for k, v in result["summary"].items() if isinstance(v, (int, float))}
        assert numbers and {k: run.data.metrics[k] for k in numbers} == numbers
        assert {k: run.data.tags[k] for k in result["tags"]} == result["tags"]
        assert run.data.params["model.name"] == "mlp" and run.data.params["strategy.name"] == cell.strategy
        steps = client.get_metric_history(cell.run_id, "loss")
        assert sorted(m.step for m in steps) == [r["step"] for r in records if r["kind"] == "step"]

    parent = runs[state.parent_run_id]
    assert parent.data.tags["sweep_id"] == state.sweep_id
    assert parent.info.start_time == int(1000 * min(c.submitted_at for c in state.cells if c.submitted_at))
    assert parent.info.end_time == max(runs[c.run_id].info.end_time for c in state.cells)
    # The report as it was written on the node, unchanged (its noise floor and host are the node's).
    attached = Path(client.download_artifacts(state.parent_run_id, "report.md", str(tmp_path)))
    assert attached.read_text() == (extracted / "report.md").read_text()

    # Twice from this directory, then from a second extraction that remembers nothing: the same runs.
    assert sync.main([str(extracted), "--tracking-uri", uri]) == 0
    again = _carry(measured, login, "second-copy")
    assert sync.main([str(again), "--tracking-uri", uri]) == 0
    assert SweepState.load(again).parent_run_id == state.parent_run_id
    assert len(_all_runs(client)) == 3
    assert sorted(m.step for m in client.get_metric_history(state.cells[0].run_id, "loss")) == list(range(6))

    # The commands that follow a sweep work across it: status, and compare against the runs in MLflow.
    capsys.readouterr()
    assert status.main([str(extracted)]) == 0
    # One run each side: shown row by row, nothing judged, so undecided (3), not a pass.
    assert report_main(["--compare", str(extracted), state.parent_run_id, "--tracking-uri", uri]) == 3
    out = capsys.readouterr().out
    assert "strategy=ddp" in out and "strategy=fsdp" in out, out

