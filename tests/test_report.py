"""The report: a real 2x2 local sweep (ddp/fsdp x 1/2 nodes) read back from its directory and from
its MLflow experiment, plus hand-made rows and runs for the cases a healthy sweep does not show
(failed cells, communication share, noisy cells, several sweeps and models)."""

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from launcher.__main__ import main
from launcher.cluster.failures import FIXES
from launcher.report import collect, markdown
from launcher.report.__main__ import main as report_main
from launcher.report.rows import add_derived
from launcher.state import SweepState
from tests.conftest import PROBED  # the report draws the anatomy the probe measures

CELLS = ["strategy=ddp nodes=1", "strategy=ddp nodes=2", "strategy=fsdp nodes=1", "strategy=fsdp nodes=2"]


def ranking(md: str) -> dict:
    """The first ranking table of a report, as {cell (+ sweep): {column title: text}}."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # | cell |"))
    header = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        values = dict(zip(header, (v.strip() for v in line.strip("|").split("|")), strict=True))
        key = values["cell"] + (f" @ {values['sweep']}" if "sweep" in values else "")
        rows[key] = values
    return rows


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    # repeats=2: two measured windows of two steps each, so every cell has a CV.
    code = main(["-m", "strategy=ddp,fsdp", "nodes=1,2", *PROBED, "repeats=2", f"output_root={root}",
                 f"sweep_dir={root / 'sweep'}"])
    state = SweepState.load(root / "sweep")
    assert code == 0, [(c.name, c.status, c.error) for c in state.cells]
    return state


@pytest.mark.slow
def test_sweep_report_ranks_every_cell(sweep):
    md = (sweep.path / "report.md").read_text()
    table = ranking(md)
    assert sorted(table) == CELLS
    # Ranked within each world size: 1 rank (two cells), then 2 ranks (two cells).
    assert [(r["ranks"], r["#"]) for r in table.values()] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
    for cell, r in table.items():
        assert r["status"] == "done"
        assert float(r["samples/s"].replace(",", "")) > 0 and float(r["tokens/s"].replace(",", "")) > 0
        assert r["ranks"] == ("2" if "nodes=2" in cell else "1")
        assert r["step p50 ms"] != "-" and r["step p90 ms"] != "-" and r["peak mem GiB"] != "-"
        assert r["state MiB/rank"] != "-"
        assert r["comm share"] in ("-",) or r["comm share"].endswith("%")
        # Two windows were measured, but one run and no noise floor give no interval.
        assert r["window CV"] != "-" and r["±95% CI"] == "-"
        # Scaling efficiency is defined for every cell of a series measured at two node counts;
        # the 1-node cells are the base (100%).
        assert r["scaling eff"].endswith("%")
        if "nodes=1" in cell:
            assert r["scaling eff"] == "100%"
    for ranks in ("1", "2"):  # the best of each world size is 100%, and only it
        peers = [r for r in table.values() if r["ranks"] == ranks]
        assert [r["rel perf"] for r in peers][0] == "100%" and peers[0]["#"] == "1"
        assert float(peers[1]["rel perf"].rstrip("%")) <= 100
    # FSDP holds half the model state per rank on two ranks.
    fsdp1 = float(table["strategy=fsdp nodes=1"]["state MiB/rank"])
    assert float(table["strategy=fsdp nodes=2"]["state MiB/rank"]) == pytest.approx(fsdp1 / 2, rel=0.05)
    for section in ("## Findings", "### Strategies", "### Scaling efficiency", "### Recommendation",
                    "## How measured", "## Environment", "## Cells without results", "warm-up"):
        assert section in md
    assert "2.13.0" in md and "| hosts |" in md and "| device | cpu |" in md
    assert "All cells finished with results." in md
    # Strategies are compared at 1 and at 2 ranks, never across.
    found = md.split("## Findings")[1].split("## Results")[0]
    assert "| 1 | " in found and "| 2 | " in found and "fsdp vs ddp" in found
    # Every cell, with every figure, in cells.csv beside the report.
    import csv
    with (sweep.path / "cells.csv").open() as f:
        cells = list(csv.DictReader(f))
    assert sorted(c["cell"] for c in cells) == CELLS
    assert all(float(c["throughput_samples_per_s"]) > 0 and c["throughput_cv"] != "" for c in cells)


@pytest.mark.slow
def test_plots_exist_open_and_are_linked(sweep):
    md = (sweep.path / "report.md").read_text()
    for name in ("throughput", "memory", "scaling"):
        path = sweep.path / "plots" / f"{name}.png"
        assert f"]({markdown.PLOTS_DIR}/{name}.png)" in md  # relative link, resolves from report.md
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert img.format == "PNG" and img.width > 400 and img.height > 200


@pytest.mark.slow
def test_parent_run_holds_the_report_and_is_finished(sweep):
    client = MlflowClient(tracking_uri=sweep.tracking_uri)
    parent = client.get_run(sweep.parent_run_id)
    assert parent.info.status == "FINISHED"
    top = {a.path for a in client.list_artifacts(sweep.parent_run_id)}
    assert {"report.md", "plots", "cells.csv"} <= top
    # The run's description: the report and the cells' compare page one click away, the ranking, the findings.
    note = parent.data.tags["mlflow.note.content"]
    links, rest = note.split("\n\n## Results\n\n", 1)
    assert f"[report.md](#/experiments/{sweep.experiment_id}/runs/{sweep.parent_run_id}/artifacts?" in links
    assert f"[compare the {len(sweep.cells)} cell runs](#/compare-runs?runs=" in links
    assert all(c.run_id in links for c in sweep.cells)
    table, found = rest.split("\n\n## Findings\n\n", 1)
    assert all(c.name in table for c in sweep.cells) and "### Recommendation" in found
    plots = {a.path for a in client.list_artifacts(sweep.parent_run_id, "plots")}
    assert plots == {"plots/throughput.png", "plots/memory.png", "plots/scaling.png", "plots/anatomy.png"}
    # Artifacts live beside the SQLite store, not in whatever directory the tests started in.
    root = Path(sweep.tracking_uri[len("sqlite:///"):]).parent
    assert parent.info.artifact_uri.startswith((root / "mlartifacts").as_uri())
    local = client.download_artifacts(sweep.parent_run_id, "report.md", str(root / "download"))
    assert Path(local).read_text() == (sweep.path / "report.md").read_text()
    # A training experiment: MLflow's UI opens it on its runs, not on the GenAI overview.
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.slow
def test_experiment_report_reads_back_the_same_cells(sweep, tmp_path, capsys):
    out = tmp_path / "exp"
    code = report_main(["--experiment", "ddp-vs-fsdp", "--tracking-uri", sweep.tracking_uri, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    from_dir = ranking((sweep.path / "report.md").read_text())
    from_mlflow = ranking((out / "report.md").read_text())
    assert sorted(from_mlflow) == CELLS
    for cell in CELLS:
        for column in ("#", "ranks", "samples/s", "samples/s/dev", "tokens/s", "step p50 ms", "peak mem GiB",
                       "state MiB/rank", "rel perf", "scaling eff", "window CV", "±95% CI", "status"):
            assert from_mlflow[cell][column] == from_dir[cell][column], (cell, column)
    assert {p.name for p in (out / "plots").iterdir()} == {"throughput.png", "memory.png", "scaling.png", "anatomy.png"}


@pytest.mark.slow
def test_report_command_rewrites_a_sweep_report(sweep, capsys):
    (sweep.path / "report.md").unlink()
    assert report_main([str(sweep.path)]) == 0
    printed = capsys.readouterr().out
    assert "| # | cell |" in printed and str(sweep.path / "report.md") in printed
    assert sorted(ranking((sweep.path / "report.md").read_text())) == CELLS


def test_command_line_errors_name_the_fix(tmp_path, capsys):
    assert report_main([]) == 2
    assert "pass a sweep directory or --experiment" in capsys.readouterr().err
    assert report_main([str(tmp_path)]) == 2
    assert "sweep.json" in capsys.readouterr().err


def test_launcher_does_not_import_matplotlib_at_start_up():
    code = ("import sys, launcher.__main__, launcher.sweep, launcher.report, launcher.report.plots; "
            "sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode == 0


# ---- hand-made rows and runs -------------------------------------------------------------------

def _row(cell, strategy, nodes, samples_per_s, **extra):
    return {"cell": cell, "sweep": "s1", "strategy": strategy, "precision": "bf16", "model": "resnet50",
            "nodes": nodes, "world_size": 8 * nodes, "status": "done", "series": strategy, "repeats": 3,
            "batch_size": 32, "steps": 30, "warmup_steps": 10, "measured_steps": 20,
            "throughput_samples_per_s": samples_per_s, "throughput_samples_per_s_per_device": samples_per_s / (8 * nodes),
            "step_time_ms_p50": 100.0, "step_time_ms_p90": 120.0, "peak_mem_allocated_gib": 30.0,
            "model_state_bytes": 3 * 1024**3, "throughput_cv": 0.01, "hostnames": f"gpu{nodes}",
            "device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.13.0", "backend": "nccl", **extra}


def test_report_from_rows_shows_comm_share_noise_failures_and_gpu_memory(tmp_path):
    rows = [
        _row("strategy=ddp nodes=1", "ddp", 1, 8000.0, comm_share=0.12, mfu=0.41),
        _row("strategy=ddp nodes=2", "ddp", 2, 14400.0, comm_share=0.25, throughput_cv=0.08),
        _row("strategy=fsdp nodes=1", "fsdp", 1, 7000.0),
        {"cell": "strategy=fsdp nodes=2", "sweep": "s1", "strategy": "fsdp", "precision": "bf16", "model": "resnet50",
         "nodes": 2, "world_size": 16, "status": "failed", "series": "fsdp", "error": "rank 3 on gpu2 failed: OOM | x",
         "failure_class": "oom"},
        {"cell": "strategy=zero2 nodes=1", "sweep": "s1", "strategy": "zero2", "precision": "bf16",
         "model": "resnet50", "nodes": 1, "world_size": 8, "status": "cancelled", "series": "zero2", "error": None},
    ]
    add_derived(rows)
    written = markdown.write(rows, tmp_path, "t", {"cluster": "slurm"})
    md = written.path.read_text()
    table = ranking(md)
    # Ranked within each world size (8 ranks, then 16), failures last.
    assert list(table) == ["strategy=ddp nodes=1", "strategy=fsdp nodes=1", "strategy=ddp nodes=2",
                           "strategy=fsdp nodes=2", "strategy=zero2 nodes=1"]
    assert [table[c]["#"] for c in table] == ["1", "2", "1", "-", "-"]
    assert [table[c]["rel perf"] for c in table] == ["100%", "88%", "100%", "-", "-"]
    ddp2 = table["strategy=ddp nodes=2"]
    assert ddp2["samples/s"] == "14,400" and ddp2["samples/s/dev"] == "900.0"
    assert ddp2["scaling eff"] == "90%"  # 900 / 1000 per device
    assert ddp2["comm share"] == "25%" and ddp2["window CV"] == "8.0% ⚠"
    assert ddp2["±95% CI"] == "-"  # one run and no noise floor: its windows are not the noise of a claim
    assert table["strategy=ddp nodes=1"]["window CV"] == "1.0%" and table["strategy=ddp nodes=1"]["MFU"] == "41.0%"
    assert table["strategy=fsdp nodes=1"]["comm share"] == "-"
    assert table["strategy=fsdp nodes=1"]["scaling eff"] == "-"  # its 2-node peer failed: nothing to compare
    assert table["strategy=fsdp nodes=2"]["#"] == "-" and table["strategy=fsdp nodes=2"]["status"] == "failed"
    assert table["strategy=ddp nodes=1"]["peak mem GiB"] == "30.00"  # CUDA allocated, not RSS
    assert table["strategy=ddp nodes=1"]["state GiB/rank"] == "3.00"
    header = next(line for line in md.splitlines() if line.startswith("| # | cell |"))
    assert "tokens/s" not in header and "sweep" not in header  # no language model, one sweep
    assert "rank 3 on gpu2 failed: OOM \\| x" in md and "| strategy=zero2 nodes=1 | cancelled | - | - | - |" in md
    assert "| strategy=fsdp nodes=2 | failed | oom | rank 3 on gpu2" in md and FIXES["oom"] in md
    assert "Best at 8 rank(s): **strategy=ddp nodes=1**" in md and "Best at 16 rank(s): **strategy=ddp nodes=2**" in md
    assert "1 cell(s) varied by more than 3%" in md
    assert "| hosts | gpu1, gpu2 |" in md and "H100" in md
    assert {p.name for p in written.plots} == {"throughput.png", "memory.png", "scaling.png"}


def _log_sweep(client, experiment_id, sweep, cells):
    parent = client.create_run(experiment_id, run_name=sweep, tags={"sweep": sweep}).info.run_id
    for cell, model, nodes, samples_per_s, status in cells:
        params = {"batch_size": "8", "steps": "30", "warmup_steps": "10", "repeats": "1", "nodes": str(nodes),
                  "model.name": model, "strategy.name": "ddp", "sweep_dir": f"/x/{sweep}", "output_root": "/x"}
        tags = {"mlflow.parentRunId": parent, "cell": cell, "strategy": "ddp", "precision": "fp32", "model": model,
                "nodes": str(nodes), "world_size": str(nodes), "hostnames": "node1", "torch_version": "2.13.0"}
        run_id = client.create_run(experiment_id, run_name=cell, tags=tags).info.run_id
        for k, v in params.items():
            client.log_param(run_id, k, v)
        if status == "FINISHED":
            for k, v in {"throughput_samples_per_s": samples_per_s, "world_size": nodes,
                         "throughput_samples_per_s_per_device": samples_per_s / nodes, "step_time_ms_p50": 10.0}.items():
                client.log_metric(run_id, k, v, step=0)
        else:
            client.set_tag(run_id, "error", "rank 0 on node1 failed: RuntimeError: boom")
        client.set_terminated(run_id, status)
    client.set_terminated(parent, "FINISHED")


def test_experiment_report_compares_sweeps_and_models(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bench", artifact_location=(tmp_path / "art").as_uri())
    # Two sweeps of the same settings at different node counts form one scaling series; a second
    # model gets its own table; a failed run is listed with its error.
    _log_sweep(client, exp, "sweep-a", [("nodes=1", "gpt_tiny", 1, 100.0, "FINISHED"),
                                        ("nodes=1", "mlp", 1, 5000.0, "FINISHED")])
    _log_sweep(client, exp, "sweep-b", [("nodes=2", "gpt_tiny", 2, 160.0, "FINISHED"),
                                        ("nodes=4", "gpt_tiny", 4, 0.0, "FAILED")])
    written = markdown.write_experiment_report(uri, "bench", tmp_path / "out")
    md = written.path.read_text()
    assert "### gpt_tiny" in md and "### mlp" in md
    gpt = ranking(md.split("### gpt_tiny")[1])
    assert gpt["nodes=2 @ sweep-b"]["scaling eff"] == "80%"  # 80 per device vs 100, across sweeps
    assert gpt["nodes=2 @ sweep-b"]["rel perf"] == "100%"  # best of its model, not of the mlp
    assert gpt["nodes=4 @ sweep-b"]["status"] == "failed"
    assert "RuntimeError: boom" in md and "4 cell(s) (3 done, 1 failed)" in md
    # No memory figures were logged: no memory plot, and the report says nothing false about it.
    assert [p.name for p in written.plots] == ["throughput.png", "scaling.png"]
    with pytest.raises(collect.ReportError, match="no MLflow experiment named 'nope'.*bench"):
        markdown.write_experiment_report(uri, "nope", tmp_path / "out2")


def test_a_thousand_cell_report_reads_per_series(tmp_path):
    """300 cells: 12 configurations (strategy x precision x nodes) over 25 seeds each. The markdown
    table has one row per configuration with the mean and the spread over seeds; cells.csv has
    every cell; the findings use the spread over seeds as the noise."""
    import csv
    import random

    rnd = random.Random(0)
    rows = []
    for strategy, base in (("ddp", 1000.0), ("fsdp", 800.0)):
        for precision, speed in (("fp32", 1.0), ("bf16", 1.5)):
            for nodes in (1, 2, 4):
                for seed in range(25):
                    tp = base * speed * nodes * 0.9 ** (nodes - 1) * rnd.gauss(1.0, 0.02)
                    rows.append(_row(f"strategy={strategy} precision={precision} nodes={nodes} seed={seed}",
                                     strategy, nodes, tp, precision=precision,
                                     series=f"strategy={strategy} precision={precision} seed={seed}"))
    assert len(rows) == 300
    add_derived(rows)
    written = markdown.write(rows, tmp_path, "t", {"cluster": "slurm"})
    md = written.path.read_text()
    table = ranking(md)
    assert len(table) == 12
    for cell, r in table.items():
        assert cell.endswith("(25 seeds)") and "seed=" not in cell
        assert r["runs"] == "25" and r["run spread"].endswith("%") and r["±95% CI"].startswith("±")
        assert 0.5 < float(r["run spread"].rstrip("%")) < 4
    assert [table[c]["#"] for c in table][:4] == ["1", "2", "3", "4"]
    assert table["strategy=ddp precision=bf16 nodes=1 (25 seeds)"]["rel perf"] == "100%"
    assert table["strategy=ddp precision=bf16 nodes=2 (25 seeds)"]["scaling eff"] == "90%"
    with written.cells_csv.open() as f:
        assert len(list(csv.DictReader(f))) == 300
    found = md.split("## Findings")[1].split("## Results")[0]
    assert "**fsdp** is 20.0% slower than **ddp**" in found.replace("19.9%", "20.0%").replace("20.1%", "20.0%")
    assert "**bf16** is" in found and "faster than **fp32**" in found
    assert {p.name for p in written.plots} == {"throughput.png", "memory.png", "scaling.png"}


def test_plots_cap_their_bars(tmp_path):
    from launcher.report import plots

    rows = [_row(f"strategy=ddp nodes=1 bucket={i}", "ddp", 1, 1000.0 + i, series=f"b{i}") for i in range(90)]
    add_derived(rows)
    path = plots.throughput(rows, tmp_path / "t.png")
    with Image.open(path) as img:  # 40 bars, not 90: the figure's height says so
        assert img.height < (1.4 + 0.42 * 45) * plots.DPI
