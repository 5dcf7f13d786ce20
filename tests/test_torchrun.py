"""A worker any launcher can start: ``python -m jobs spec.json`` under a real torchrun (2 gloo ranks,
a tiny model, a few steps), and the backend that uses it, ``cluster=torchrun``, through the real
launcher: the cell's result, its reproduce.sh, the report's link to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from contract import metrics
from contract.codec import to_plain
from launcher.__main__ import main
from launcher.state import SweepState
from tests.ranks import make_spec
from tests.stores import existing_store

pytestmark = pytest.mark.slow


def test_python_m_jobs_under_torchrun_writes_a_cells_results_and_leaves_the_spec_dir_alone(tmp_path):
    spec = make_spec(tmp_path / "cell", strategy="fsdp", world_size=2, steps=4, warmup_steps=1)
    spec_path = tmp_path / "cell" / "spec.json"
    spec_path.write_text(json.dumps(to_plain(spec)))
    out = tmp_path / "by-hand"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "jobs", str(spec_path), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    summary = result["summary"]
    assert summary["world_size"] == 2 and summary["measured_steps"] == 3
    assert summary[metrics.headlines()[0]] > 0 and summary["param_bytes"] > 0
    assert result["tags"]["world_size"] == "2" and len(result["rank_hosts"]) == 2
    assert (out / "metrics.jsonl").stat().st_size > 0 and not (tmp_path / "cell" / "result.json").exists()


def test_cluster_torchrun_runs_a_sweeps_cell_and_writes_how_to_reproduce_it(tmp_path, fast_overrides, capsys):
    existing_store(tmp_path)
    code = main(["-m", "strategy=fsdp", "cluster=torchrun", *fast_overrides, f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 'sweep'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    state = SweepState.load(tmp_path / "sweep")
    (cell,) = state.cells
    assert cell.status.value == "done" and cell.world_size == 2
    summary = json.loads((state.cell_dir(cell) / "result.json").read_text())["summary"]
    assert summary["world_size"] == 2 and summary[metrics.headlines()[0]] > 0
    script = (state.cell_dir(cell) / "reproduce.sh").read_text()
    assert "torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 -m jobs" in script
    assert "spec.json" in script and "--out" in script
    cells_csv = (state.path / "cells.csv").read_text()
    assert f"cells/{cell.dirname}/reproduce.sh" in cells_csv
