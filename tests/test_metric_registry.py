"""The metric registry (contract/metrics.py) is the one list of metrics: every figure the worker's
summary writes is declared there, and the report's columns, cells.csv's leading figures and
MLflow's headline order are read from it."""

import ast
from pathlib import Path

from contract import cell_run, metrics
from jobs import comm, summary
from launcher.report import columns
from tests.ranks import make_spec, run_ranks

ROOT = Path(__file__).resolve().parent.parent
# The report's own columns: who the row is and how noisy it is, not one metric's value.
REPORT_OWN_COLUMNS = {"#", "cell", "sweep", "window CV", "±95% CI", "status"}


def test_every_figure_a_two_rank_run_writes_is_registered(tmp_path):
    spec = make_spec(tmp_path / "cell", world_size=2, steps=6, warmup_steps=2)
    results = run_ranks(spec, world_size=2)
    written = set(results[0]["summary"])
    assert written, results[0]
    assert written <= set(metrics.REGISTRY), sorted(written - set(metrics.REGISTRY))
    # Reductions over ranks happen in the worker: every figure it wrote says which it used.
    assert all(metrics.get(k).source is metrics.Source.WORKER for k in written)


def _string_keys(path: Path) -> set[str]:
    """The string keys of every dict literal and keyword-built dict in ``path``."""
    keys = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            keys.update(k.arg for k in node.keywords if k.arg)
    return keys


def test_every_per_rank_figure_is_registered_with_its_reduction_even_gpu_only_ones():
    # GPU-only figures (allocator peaks, copies) never appear in a CPU run: read them from the source.
    per_rank = _string_keys(ROOT / "jobs" / "memory.py") | set(comm.figures({"comm": [], "compute": []}, 1.0, 1))
    per_rank |= set(summary.skipped_steps({"skipped": [], "measured": []}))
    assert per_rank <= set(metrics.REGISTRY), sorted(per_rank - set(metrics.REGISTRY))
    assert {metrics.get(k).over_ranks for k in per_rank} == {metrics.OverRanks.MAX}


def test_the_summary_reduces_each_rank_figure_as_registered():
    rank = {"step_time_s": [0.1, 0.2], "data_time_s": [0.0, 0.0], "hostname": "h"}
    per_rank = [{**rank, "peak_rss_gib": 1.0, "comm_share": 0.3}, {**rank, "peak_rss_gib": 2.0, "comm_share": 0.1}]
    out = summary.summarize(per_rank, samples_per_step=1, tokens_per_sample=1, repeats=1)
    assert out["peak_rss_gib"] == 2.0 and out["comm_share"] == 0.3
    assert "hostname" not in out and "step_time_s" not in out  # not figures: nothing to reduce


def _row_with_every_figure() -> dict:
    row = {"cell": "strategy=ddp", "sweep": "s", "model": "m", "status": "done", "repeats": 3, "runs": 2}
    row.update({m.name: 0.5 for m in metrics.METRICS if m.name not in row})
    row.update(throughput_samples_per_s=10.0, model_state_bytes=2 * 1024**3, world_size=2)
    return row


def test_the_report_columns_are_the_registry_columns_in_its_order():
    titles = [c.title for c in columns.columns([_row_with_every_figure()])]
    registered = [c for c in titles if c not in REPORT_OWN_COLUMNS]
    expected = [str(m.label).format(unit="GiB") for m in metrics.columns()]
    assert registered == expected
    # Optional columns leave when no row has them; the others stay.
    bare = [c.title for c in columns.columns([{"cell": "c", "status": "failed"}])]
    assert [c for c in bare if c not in REPORT_OWN_COLUMNS] == [
        str(m.label).format(unit="MiB") for m in metrics.columns() if not m.optional]


def test_cells_csv_leads_with_the_registry_figures(tmp_path):
    path = columns.write_cells_csv([_row_with_every_figure()], tmp_path / "cells.csv")
    header = path.read_text().splitlines()[0].split(",")
    lead = [k for k in header if k in metrics.csv_lead()]
    assert lead == list(metrics.csv_lead())
    assert header.index(lead[-1]) < min(header.index(k) for k in header if k in metrics.REGISTRY and k not in lead
                                        and k not in ("world_size", "nodes"))  # nodes, world_size: who


def test_mlflow_headlines_come_from_the_registry_in_their_declared_order():
    assert cell_run.HEADLINE_METRICS == metrics.headlines()
    places = [m.headline for m in metrics.METRICS if m.headline]
    assert sorted(places) == list(range(1, len(places) + 1))  # one place each, none skipped
    assert cell_run.HEADLINE_METRICS[0] == "throughput_samples_per_s_per_device"


def test_every_metric_is_declared_once_with_a_direction_and_a_format_for_its_column():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    for m in metrics.columns():
        assert m.fmt in ("rate", "count", "bytes") or format(0.5, m.fmt), m
    assert all(m.or_else in metrics.REGISTRY for m in metrics.METRICS if m.or_else)
