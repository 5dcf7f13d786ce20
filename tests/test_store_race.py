"""A new SQLite store is made once, whoever comes first: sweeps started together on a fresh outputs/
all log their runs, and a run the store missed is completed later at its job's own times."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from launcher import finish
from launcher.state import SweepState
from launcher.track.runs import missing_runs

pytestmark = pytest.mark.slow

# One cell each, as small as a real run gets: the subject is the store, not the measurement.
TINY = ["model=mlp", "steps=4", "warmup_steps=2", "repeats=1", "runs=1"]


def _start(output_root: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *TINY, f"output_root={output_root}",
                             f"sweep_dir={output_root / name}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize("together", [2, 4])
def test_sweeps_started_together_on_a_fresh_store_log_every_run(tmp_path, together):
    output_root = tmp_path / "outputs"  # no store yet: the first of the sweeps makes it
    procs = [_start(output_root, f"s{i}") for i in range(together)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0 and "already exists" not in err and "[mlflow]" not in err, out + err
    states = [SweepState.load(output_root / f"s{i}") for i in range(together)]
    runs = {r.info.run_id: r for r in _runs(states[0].tracking_uri or "")}
    for state in states:
        assert missing_runs(state) == []
        assert runs[state.parent_run_id].info.status == "FINISHED"
        assert runs[state.cells[0].run_id].info.status == "FINISHED"
    assert len(runs) == 2 * together


def test_runs_a_failed_store_missed_are_completed_by_the_next_status(tmp_path, capsys):
    output_root = tmp_path / "outputs"
    output_root.mkdir()
    store = output_root / "mlflow.db"
    store.write_text("not a database\n")  # the store fails on every call while the sweep runs
    out, err = _start(output_root, "sweep").communicate(timeout=300)
    assert "python -m launcher.sync" in err.strip().splitlines()[-1], out + err  # the last line says how to finish

    store.unlink()  # the store is back (a fresh one)
    # status answers without importing MLflow: a detached process completes the runs.
    said = subprocess.run([sys.executable, "-c", "import sys; from launcher.status import main; code = main(sys.argv[1:]); "
                           "print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow'); sys.exit(code)",
                           str(output_root / "sweep")], capture_output=True, text=True, timeout=120)
    assert said.returncode == 0 and said.stdout.splitlines()[-1] == "no mlflow", said.stdout + said.stderr
    assert finish.wait_for_settled(output_root / "sweep")
    state = SweepState.load(output_root / "sweep")
    runs = {r.info.run_id: r for r in _runs(state.tracking_uri or "")}
    assert missing_runs(state) == [] and len(runs) == 2
    cell = runs[state.cells[0].run_id]
    records = [json.loads(x) for x in (state.cell_dir(state.cells[0]) / "metrics.jsonl").read_text().splitlines()]
    assert (cell.info.start_time, cell.info.end_time) == (int(1000 * records[0]["time"]), int(1000 * records[-1]["time"]))
    assert cell.info.status == runs[state.parent_run_id].info.status == "FINISHED"
    assert cell.data.metrics["throughput_samples_per_s"] == state.read_result(state.cells[0])["summary"][
        "throughput_samples_per_s"]
