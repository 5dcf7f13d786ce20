"""History and trend (python -m launcher.history): six sweeps of two configurations logged by the
launcher's own writers (sweep.prepare, the worker's JSONL sink, launcher.track's runs) into a real
MLflow store; a slowdown injected into one configuration from the fourth sweep on is dated at that
sweep, the same noise without it shows no change point. The node ledger likewise, from probes judged
and appended by launcher/report/health.py."""

import math
import random
import sys

import pytest

from jobs.sinks import JsonlSink
from launcher import sweep
from launcher.commands import history as command
from launcher.plan.cell import CellStatus
from launcher.plan.grid import compose, expand
from launcher.plan.planner import plan
from launcher.report import health
from launcher.report import history as hist
from launcher.track.runs import complete_runs
from tests.stores import existing_store

DAY_S = 86400
START_S = 1_780_000_000  # the first sweep's date; one sweep a day after it
SLOW_FROM = 3  # the fourth sweep (index 3) and those after it run 15% slower
SLOWDOWN = 0.85


def _sweeps(root, overrides, draws):
    """Six sweeps of ``strategy=ddp,fsdp`` with 3 runs each; run r of sweep i measures draws[i][r] *
    100 samples/s, fsdp's from SLOW_FROM on times SLOWDOWN. Returns the sweep states."""
    states = []
    for i, noise in enumerate(draws):
        points, swept = expand([*overrides, "runs=3", "strategy=ddp,fsdp", f"output_root={root}",
                                f"sweep_dir={root / f'sweep{i}'}", "tracking.experiment=nightly"], multirun=True)
        state = sweep.prepare(plan(compose(points, swept)), ["test"])
        for cell in state.cells:
            start_s = START_S + i * DAY_S + cell.index
            cell.submitted_at = start_s
            factor = SLOWDOWN if cell.strategy == "fsdp" and i >= SLOW_FROM else 1.0
            sink = JsonlSink(state.cell_dir(cell) / "metrics.jsonl")  # what the worker's rank 0 writes
            sink.log_start(start_s)
            sink.log_summary({"throughput_samples_per_s": 100.0 * factor * noise[cell.run - 1]})
            sink.finish("FINISHED")
            cell.status = CellStatus.done
            if i == 1 and cell.strategy == "ddp" and cell.run == 3:
                cell.interference = "other processes used 40% of its cores"  # left out, as the report does
        state.save()
        complete_runs(state)  # the parent run, then each cell's run, filled from its records
        states.append(state)
    return states


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    pytest.importorskip("signal_processing_algorithms", reason=hist.INSTALL)
    from tests.conftest import FAST

    root = tmp_path_factory.mktemp("history")
    existing_store(root)
    rng = random.Random(5)
    draws = [[rng.gauss(1.0, 0.02) for _ in range(3)] for _ in range(6)]  # the same noise for both
    return root, _sweeps(root, FAST, draws)


def test_a_slowdown_from_the_fourth_sweep_is_dated_there_and_none_without_it(nightly, capsys):
    root, states = nightly
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert command.main(["nightly", "--tracking-uri", uri, "--out", str(root / "out")]) == 0
    printed = capsys.readouterr().out
    series, flagged = hist.experiment_series(uri, "nightly")
    found = {name.split()[0]: points for name, points in ((n.replace("strategy=", ""), p) for n, p in series)}
    assert sorted(found) == ["ddp", "fsdp"] and all(len(p) == 6 and len(p[0].values) == 3 for p in found.values())
    assert flagged == 1 and len(found["ddp"][1].values) == 2 and len(found["fsdp"][1].values) == 3
    assert "left out: 1 run(s) flagged for interference" in printed
    slowed, steady = hist.analyse("fsdp", "samples/s", found["fsdp"]), hist.analyse("ddp", "samples/s", found["ddp"])
    assert steady.changes == []
    [change] = slowed.changes
    assert change.at == SLOW_FROM and change.after.label == states[SLOW_FROM].name
    assert change.before.label == states[SLOW_FROM - 1].name and change.diff.verdict == "lower"
    assert change.after.when == "2026-05-31 20:26 UTC"  # the fourth sweep's parent run started then
    assert math.isclose(change.diff.ratio, SLOWDOWN, rel_tol=0.03)
    # the latest sweep against the sweeps since the change (not against the first sweep): no change
    assert slowed.since == SLOW_FROM and slowed.verdict.verdict == "same"
    assert steady.since == 0 and steady.verdict.verdict == "same"
    assert f"at 2026-05-31 20:26 UTC ({states[SLOW_FROM - 1].name} -> {states[SLOW_FROM].name})" in printed
    # report.md links its plot; both are attached to the latest sweep's parent run
    report = (root / "out" / "report.md").read_text()
    assert "![each series over time, change points dashed](history.png)" in report
    from contract import mlflow_client

    attached = {f.path for f in mlflow_client.client(uri).list_artifacts(states[-1].parent_run_id, "history")}
    assert attached == {"history/report.md", "history/history.png"}


def test_unknown_experiments_are_refused_naming_those_there(nightly, capsys):
    root, _ = nightly
    assert command.main(["weekly", "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}", "--out", str(root / "x")]) == 2
    assert "no MLflow experiment named 'weekly'" in capsys.readouterr().err and not (root / "x").exists()


def _probe(rng, probe, slow_from=None, repeats=8):
    """A probe's result as jobs/nodeprobe.py returns it: four nodes, each figure's repeats with 2% noise;
    n2 20% slower from probe ``slow_from`` on (still within the fleet's margin until then)."""
    nodes = []
    for name in ("n0", "n1", "n2", "n3"):
        scale = 0.8 if name == "n2" and slow_from is not None and probe >= slow_from else 1.0
        nodes.append({"host": name, "figures": {f: [base * scale * math.exp(rng.gauss(0, 0.02)) for _ in range(repeats)]
                                                for f, base in (("matmul_gflops", 30), ("copy_gb_per_s", 10),
                                                                ("step_samples_per_s", 50))}})
    pairs = [{"pair": [a, (a + 1) % 4], "busbw_gb_per_s": [1.0] * repeats} for a in range(4)]
    return {"nodes": nodes, "pairs": pairs, "in_turn": False, "node_s": 1.0, "pairs_s": 1.0, "job_s": 3.0,
            "measured_at": f"2026-11-{20 + probe:02d}T03:00:00"}


def _ledger(path, probes, slow_from=None, repeats=8, uri=None):
    """A ledger of ``probes`` probes as launcher.health keeps them (and, with ``uri``, their MLflow runs)."""
    from launcher.healthprobe import log_run

    rng = random.Random(11)
    for i in range(probes):
        result = _probe(rng, i, slow_from, repeats)
        record = health.record("local", result, health.judge(result), {})
        health.append(path, record)
        if uri:
            log_run(uri, "local", record, path.parent)
    return path


def test_the_node_ledger_dates_a_node_slowed_from_the_fourth_probe_and_nothing_else(tmp_path, capsys):
    pytest.importorskip("signal_processing_algorithms", reason=hist.INSTALL)
    uri = f"sqlite:///{existing_store(tmp_path)}"  # beside the ledger, where launcher.health keeps its runs
    ledger = _ledger(tmp_path / "health-local.jsonl", 6, slow_from=SLOW_FROM, uri=uri)
    assert command.main(["--ledger", str(ledger)]) == 0
    found = {h.name: h for h in hist.ledger_histories(ledger)}
    changed = {name: h.changes for name, h in found.items() if h.changes}
    assert sorted(changed) == [f"n2 {f}" for f in sorted(("matmul_gflops", "copy_gb_per_s", "step_samples_per_s"))]
    assert all([c.at for c in cs] == [SLOW_FROM] and cs[0].after.when == "2026-11-23T03:00:00"
               for cs in changed.values())
    out = health.history_dir(ledger)
    assert (out / "report.md").exists() and (out / "history.png").exists()
    from contract import mlflow_client

    client = mlflow_client.client(uri)
    [latest] = client.search_runs([client.get_experiment_by_name("health-local").experiment_id], "", max_results=1,
                                  order_by=["attributes.start_time DESC"])
    assert {f.path for f in client.list_artifacts(latest.info.run_id, "history")} == {"history/report.md",
                                                                                       "history/history.png"}
    assert f"attached to MLflow run {latest.info.run_id}" in capsys.readouterr().out
    # a health=auto sweep keeps the ledger's history plot among its plots and its Node health section links it
    sweep_dir = tmp_path / "sweep"
    health.keep_in_sweep(sweep_dir, {"probes": [{"partition": None, "judged": True, "excluded": [],
                                                 "measured_at": "2026-11-25T03:00:00", "ledger": str(ledger)}]})
    assert "[plot](plots/health-history-default.png)" in "\n".join(health.section(sweep_dir))
    assert (sweep_dir / "plots" / "health-history-default.png").read_bytes() == (out / "history.png").read_bytes()
    healthy = _ledger(tmp_path / "healthy" / "health-local.jsonl", 6)
    assert all(not h.changes and h.verdict.verdict == "same" for h in hist.ledger_histories(healthy))


def test_a_short_ledger_is_refused_with_what_it_needs_and_one_repeat_leaves_the_verdict_undecided(tmp_path, capsys):
    pytest.importorskip("signal_processing_algorithms", reason=hist.INSTALL)
    assert command.main(["--ledger", str(_ledger(tmp_path / "health-short.jsonl", 2))]) == 2
    assert f"at most 2 probe(s) of one series with a result; a history needs at least {hist.MIN_POINTS}" \
        in capsys.readouterr().err
    assert command.main(["--ledger", str(_ledger(tmp_path / "health-once.jsonl", 5, repeats=1))]) == 3
    assert "undecided: no noise estimate" in capsys.readouterr().out


def test_without_the_change_point_package_it_refuses_with_the_command_that_installs_it(tmp_path, monkeypatch, capsys):
    for name in ("signal_processing_algorithms", "signal_processing_algorithms.determinism",
                 "signal_processing_algorithms.energy_statistics.energy_statistics"):
        monkeypatch.setitem(sys.modules, name, None)  # the import fails as it does when it is not installed
    assert command.main(["--ledger", str(tmp_path / "health-x.jsonl")]) == 2
    assert ("pip install structlog more-itertools && pip install --no-deps signal-processing-algorithms==2.1.6"
            in capsys.readouterr().err)
