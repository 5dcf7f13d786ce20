"""Forecasts on a real sweep: one tiny sweep of a batch series on two gloo ranks (shared by the
module) checks its own forecasts in its report, MLflow and the cluster's record; launcher.forecast
forecasts cells it did not run, with intervals and the cluster's record, and --verify runs one;
--plan shows the forecast beside its cells. The record's bookkeeping on literal numbers."""

import json
import math

import pytest

from contract import mlflow_client
from launcher import __main__ as launcher_main
from launcher.commands import forecast
from launcher.forecast import forecastrecord
from launcher.state import SweepState
from tests.conftest import PROBED  # multi-rank forecasts need the measured communication

SERIES = ["-m", "batch_size=2,4,8", "nodes=2", "repeats=1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("forecast")
    code = launcher_main.main([*SERIES, *[o for o in PROBED if not o.startswith("batch_size")],
                               f"output_root={root}"])
    assert code == 0
    (sweep_dir,) = [p.parent for p in root.glob("*/sweep.json")]
    return SweepState.load(sweep_dir)


def test_a_sweep_with_a_series_checks_its_forecasts_in_its_report_mlflow_and_the_record(sweep):
    report = (sweep.path / "report.md").read_text()
    section = report.split("## Forecasts checked\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| batch_size=")]
    assert len(lines) == 3, section
    assert "| batch_size | 3 |" in section  # the series and its three points
    assert "fitted on this sweep's" in section  # no fabric probe: alpha and beta from the sweep, said
    record = json.loads((sweep.path.parent / forecastrecord.RECORD_FILE).read_text())
    (entries,) = record.values()
    assert len(entries) == 3 and {e["kind"] for e in entries} == {"loo"}
    measured = [float(line.split("|")[2]) for line in lines]
    assert sorted(e["measured"] for e in entries) == pytest.approx(sorted(measured), rel=1e-3)
    client = mlflow_client.client(sweep.tracking_uri)
    parent = client.get_run(sweep.parent_run_id).data.metrics
    assert parent["forecast_points"] == 3
    assert parent["forecast_error_median"] == pytest.approx(
        sorted(abs(math.expm1(e["log_error"])) for e in entries)[1], rel=1e-6)
    cell = client.get_run(sweep.cells[0].run_id).data.metrics
    assert "forecast_error" in cell and cell["forecast_throughput_samples_per_s"] > 0


def test_forecast_of_cells_not_run_with_intervals_and_verify_against_a_measurement(sweep, capsys):
    assert forecast.main([str(sweep.path), "nodes=1,4", "batch_size=4"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| nodes=") and "batch_size=4" in line]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "4"], out
    assert all("–" in r.split("|")[3] for r in rows)  # every forecast has its interval
    assert "have been off by" in out and "Emulated nodes share" in out and "Recommendation" in out
    before = len(forecastrecord.errors(sweep.path.parent, _key(sweep)))
    assert forecast.main([str(sweep.path), "batch_size=16", "--verify"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("--verify: batch_size=16: forecast") and "measured" in said
    after = forecastrecord.errors(sweep.path.parent, _key(sweep))
    assert len(after) == before + 1 and after[-1]["kind"] == "verify"


def test_plan_shows_the_forecast_beside_each_cell(sweep, capsys):
    overrides = [o for o in PROBED if not o.startswith("batch_size")]
    assert launcher_main.main(["--plan", "-m", "nodes=1,3", "batch_size=4", *overrides,
                               f"output_root={sweep.path.parent}"]) == 0
    out = capsys.readouterr().out
    table = out.split(f"Forecast from sweep {sweep.name}", 1)[1]
    assert len([line for line in table.splitlines() if line.startswith("| ") and "nodes=" in line]) == 2


def test_the_record_replaces_a_sweeps_own_entries_and_says_how_far_forecasts_were_off(tmp_path):
    forecastrecord.add(tmp_path, "local:h", "s1", [{"cell": "a", "kind": "loo", "predicted": 110.0, "measured": 100.0},
                                                  {"cell": "b", "kind": "loo", "predicted": 90.0, "measured": 100.0}])
    forecastrecord.add(tmp_path, "local:h", "s2", [{"cell": "a", "kind": "loo", "predicted": 104.0, "measured": 100.0}])
    forecastrecord.add(tmp_path, "local:h", "s1", [{"cell": "a", "kind": "loo", "predicted": 120.0, "measured": 100.0}])
    entries = forecastrecord.errors(tmp_path, "local:h")
    assert [(e["sweep"], round(math.exp(e["log_error"]), 6)) for e in entries] == [("s2", 1.04), ("s1", 1.2)]
    assert forecastrecord.errors(tmp_path, "local:h", without_sweep="s1")[0]["sweep"] == "s2"
    said = forecastrecord.said(entries, "local:h")
    assert "off by 12.0% (median) over 2 checked forecast(s) from 2 sweep(s)" in said


def _key(state):
    from launcher.report.noisefloor import floor_key

    return floor_key(state)


def test_a_forecast_counts_with_the_workers_flops_and_builds_no_model(sweep, monkeypatch, tmp_path, capsys):
    """The worker records its model's FLOPs per sample; a forecast keeps that count for the model's
    other cells (launcher/plan/fitcache.py), so forecasting them counts nothing again. An empty cache
    here: nothing the launch itself kept."""
    from contract.metrics import FLOPS_PER_SAMPLE
    from contract.tuning import resolved_model
    from launcher.plan import fit, fitcache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(fit, "count_flops", lambda model: pytest.fail("a model was built to count its FLOPs"))
    assert forecast.main([str(sweep.path), "nodes=4", "batch_size=4"]) == 0
    assert "| nodes=4" in capsys.readouterr().out
    result = json.loads((sweep.cell_dir(sweep.cells[0]) / "result.json").read_text())
    spec = sweep.load_spec(sweep.cells[0])
    kept = fitcache.flops_per_sample(resolved_model(spec.model, cuda=False))
    assert kept == (result.get(FLOPS_PER_SAMPLE) or result["summary"][FLOPS_PER_SAMPLE]) > 0
