"""Sweep against sweep (python -m launcher.report --compare A B) on hand-made sweep directories:
sweep.json written through launcher.state's dataclasses and a result.json per cell."""

import json
from pathlib import Path

import pytest

from contract.spec import Layout
from launcher import finish as report
from launcher.plan.cell import Cell, CellStatus
from launcher.plan.clusterschema import ClusterConfig
from launcher.report import compare, comparetable, noisefloor, stats
from launcher.report.__main__ import main as report_main
from launcher.state import SweepState

GRID = [("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)]


def make_sweep(root: Path, name: str, results: dict, where: str = "/runs", runs: int = 3,
               flagged: dict | None = None) -> Path:
    """A sweep directory: ``runs`` independent runs per (strategy, nodes) in GRID; ``results`` maps
    (strategy, nodes) to (samples/s, relative spread between runs, peak GiB) or to None (every run
    failed); ``flagged``: (strategy, nodes) to the interference its runs recorded. The where-settings
    differ per sweep."""
    sweep_dir = root / name
    state = SweepState(name=name, sweep_dir=str(sweep_dir), cluster="local", argv=["-m", "strategy=ddp,fsdp"])
    spread = {1: [0.0], 3: [-1.0, 0.0, 1.0]}.get(runs) or [(-1) ** i for i in range(runs)]
    for run in range(1, runs + 1):
        for strategy, nodes in GRID:
            i = len(state.cells)
            cell_name = f"strategy={strategy} nodes={nodes}" + (f" run={run}" if runs > 1 else "")
            cell = Cell(index=i, name=cell_name, dirname=f"{i:02d}-{strategy}-{nodes}-{run}",
                             overrides=[f"strategy={strategy}", f"nodes={nodes}", "model=gpt_tiny", "batch_size=4",
                                        f"output_root={where}", f"sweep_dir={where}/{name}"],
                             strategy=strategy, precision="fp32", model="gpt_tiny", cluster=ClusterConfig(),
                             layout=Layout(nodes=nodes, tasks_per_node=2), job_id=str(1000 + i), run=run)
            d = state.cell_dir(cell)
            d.mkdir(parents=True)
            got = results.get((strategy, nodes))
            if got is None:
                cell.status, cell.error, cell.failure_class = CellStatus.failed, "rank 1 on n1 failed: OOM", "oom"
            else:
                mean_tp, cv, peak = got
                tp = mean_tp * (1 + cv * spread[run - 1])
                cell.status = CellStatus.done
                summary = {"world_size": 2 * nodes, "throughput_samples_per_s": tp,
                           "throughput_samples_per_s_per_device": tp / (2 * nodes), "throughput_cv": 0.001,
                           "step_time_ms_p50": 1e3 * 4 * 2 * nodes / tp, "peak_rss_gib": peak * (1 + 0.002 * spread[run - 1]),
                           "model_state_bytes": 15e6 / (nodes * 2 if strategy == "fsdp" else 1)}
                (d / "result.json").write_text(json.dumps({"summary": summary, "tags": {"hostnames": "n1"}}))
            cell.interference = (flagged or {}).get((strategy, nodes))
            state.cells.append(cell)
    state.save()
    return sweep_dir


BASE = {("ddp", 1): (100.0, 0.01, 0.50), ("ddp", 2): (180.0, 0.01, 0.52),
        ("fsdp", 1): (80.0, 0.01, 0.45), ("fsdp", 2): (150.0, 0.01, 0.46)}
# A cluster whose A/A pairs never moved beyond their runs' own noise, recorded as long as the record
# is kept: the drift judged against is the default allowance outweighed, 10% * sqrt(4 / 64) = 2.5%.
QUIET = stats.Drift({m: 0.0 for m in stats.METRICS}, noisefloor.DRIFT_KEEP, "a quiet cluster's record")


def quiet_record(sweep: Path) -> None:
    """QUIET kept as the record of the sweep's cluster, beside it (what --record-drift writes)."""
    entries = [{"metric": m, "d2": 0.0, "within": 0.0} for m in stats.METRICS for _ in range(noisefloor.DRIFT_KEEP)]
    noisefloor.record_drift(sweep.parent, report.floor_key(SweepState.load(sweep)), entries, "quiet")


def rows(path: Path):
    return report.collect(SweepState.load(path))


def test_cells_match_by_settings_and_get_noise_aware_verdicts(tmp_path):
    # On a quiet cluster's record (drift 2.5%), ddp 1 node tightly measured on both sides: "no change"
    # within ±10% holds at the family's level (12 rows).
    a = make_sweep(tmp_path, "a", {**BASE, ("ddp", 1): (100.0, 0.002, 0.50)}, where="/old")
    b = make_sweep(tmp_path, "b", {**BASE, ("ddp", 2): (140.0, 0.01, 0.52),  # a clear regression
                                   ("fsdp", 1): (81.0, 0.05, 0.45),  # +1% inside the noise: cannot tell
                                   ("ddp", 1): (100.5, 0.002, 0.50),  # +0.5%, tightly measured: no change
                                   ("fsdp", 2): (150.0, 0.01, 0.40)},  # less memory
                   where="/new")
    result = compare.compare(rows(a), rows(b), threshold=0.10, drift=QUIET)
    assert {m.name for m in result.matches} == {f"strategy={s} nodes={n}" for s, n in GRID}
    assert all(m.by == "settings" for m in result.matches)  # output_root/sweep_dir are not settings
    verdicts = {(m.name, d.metric): d for m in result.matches for d in m.deltas}
    tp = verdicts[("strategy=ddp nodes=2", "samples/s")]
    assert tp.verdict == "regression" and tp.change == pytest.approx(140 / 180 - 1)
    assert "3 + 3 runs + drift 2.5% (64 df)" in tp.note
    assert verdicts[("strategy=ddp nodes=2", "step p50 ms")].verdict == "regression"
    undecided = verdicts[("strategy=fsdp nodes=1", "samples/s")]
    assert undecided.verdict == "inconclusive" and undecided.runs_needed and "runs per side" in undecided.note
    assert verdicts[("strategy=ddp nodes=1", "samples/s")].verdict == "no change"
    assert verdicts[("strategy=fsdp nodes=2", "peak mem GiB")].verdict == "improvement"
    assert verdicts[("strategy=ddp nodes=1", "model state MiB")].verdict == "no change"
    assert [(m.name, d.metric) for m, d in result.regressions()] == [
        ("strategy=ddp nodes=2", "samples/s"), ("strategy=ddp nodes=2", "step p50 ms")]
    text = comparetable.render(result, "a", "b")
    assert "| strategy=ddp nodes=2 | samples/s | 180.0 | 140.0 | -22.2% | **regression** | 99.6% CI" in text
    assert "2 regression(s) beyond the noise and the threshold of 10%" in text
    assert "Sweep-to-sweep drift in the noise: peak_memory 2.5%, step_time 2.5%, throughput 2.5% (the default 10% " \
        "as 4 A/A entries pooled with 60 recorded (a quiet cluster's record); 64 df)." in text


def test_command_exits_1_on_a_regression_beyond_the_threshold(tmp_path, capsys):
    a = make_sweep(tmp_path, "a", {**BASE, ("ddp", 1): (100.0, 0.001, 0.50)})
    b = make_sweep(tmp_path, "b", {**BASE, ("ddp", 1): (85.0, 0.001, 0.50)})  # -15%, beyond the noise and drift
    quiet_record(a)
    assert report_main(["--compare", str(a), str(b), "--threshold", "0.2"]) == 0  # below the 20% that counts
    out = capsys.readouterr().out
    assert "| strategy=ddp nodes=1 | samples/s | 100.0 | 85.0 | -15.0% | inconclusive |" in out
    assert report_main(["--compare", str(a), str(b)]) == 1
    assert "2 regression(s) beyond the noise and the threshold of 5%: strategy=ddp nodes=1 samples/s -15.0%" in \
        capsys.readouterr().out


def test_a_configuration_flagged_for_interference_is_shown_not_claimed_and_never_passes_the_gate(tmp_path, capsys):
    a = make_sweep(tmp_path, "a", BASE)
    slowed = {**BASE, ("ddp", 2): (140.0, 0.01, 0.52)}  # -22%: a regression, unless the machine did it
    b = make_sweep(tmp_path, "b", slowed, flagged={("ddp", 2): "other processes took 83% of the cores"})
    result = compare.compare(rows(a), rows(b), threshold=0.05)
    speed = [d for m in result.matches if m.name == "strategy=ddp nodes=2" for d in m.deltas
             if d.metric in ("samples/s", "step p50 ms")]
    assert [d.verdict for d in speed] == ["not claimed", "not claimed"]
    assert all(d.note.startswith("interference in B: other processes took 83%") for d in speed)
    assert not result.regressions()
    assert report_main(["--compare", str(a), str(b)]) == 3  # nothing judged (drift dominates): undecided, not a pass
    said = capsys.readouterr()
    assert "1 configuration(s) not claimed, flagged for interference" in said.out
    assert "undecided: no row of" in said.err and "2 row(s) not claimed" in said.err
    assert report_main(["--compare", str(a), str(b), "--gate"]) == 3  # not shown the same either
    assert "gate not passed" in capsys.readouterr().out


def test_single_runs_claim_nothing_unless_the_cluster_has_a_noise_floor(tmp_path, capsys):
    """One run per side: every verdict is inconclusive (no noise). A sweep with repeated runs on the
    same cluster records its noise floor; afterwards single runs are judged against it."""
    a = make_sweep(tmp_path, "a", BASE, runs=1)
    b = make_sweep(tmp_path, "b", {**BASE, ("ddp", 2): (120.0, 0.0, 0.52)}, runs=1)
    assert report_main(["--compare", str(a), str(b)]) == 3  # every row inconclusive: undecided
    out = capsys.readouterr().out
    assert "| strategy=ddp nodes=2 | samples/s | 180.0 | 120.0 | -33.3% | inconclusive | no noise estimate" in out
    floor_sweep = make_sweep(tmp_path, "floor", {k: (v[0], 0.03, v[2]) for k, v in BASE.items()}, runs=8)
    report.write_sweep_report(SweepState.load(floor_sweep))
    kept = json.loads((tmp_path / "noise-floor.json").read_text())
    (entry,) = kept.values()
    assert entry["df"] == 4 * 7 and entry["cv"]["throughput"] == pytest.approx(0.03 * (8 / 7) ** 0.5, rel=1e-6)
    assert report_main(["--compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "| strategy=ddp nodes=2 | samples/s | 180.0 | 120.0 | -33.3% | **regression** |" in out
    assert "1 + 1 runs with the noise floor" in out and "noise floor for single runs: local:" in out


def test_failed_and_unmatched_cells(tmp_path):
    a = make_sweep(tmp_path, "a", BASE)
    b = make_sweep(tmp_path, "b", {k: v for k, v in BASE.items() if k != ("fsdp", 2)})  # fsdp 2 nodes failed
    result = compare.compare(rows(a), rows(b))
    (lost,) = [d for m in result.matches for d in m.deltas if m.name == "strategy=fsdp nodes=2"]
    assert lost.verdict == "regression" and "no result in B (oom)" in lost.note
    assert len(result.regressions()) == 1
    # A grid that only B has; and a cell matched by name when its fixed settings changed.
    rows_b = rows(b)
    for r in rows_b[0::4]:  # every run of strategy=ddp nodes=1
        r["settings"] = {**r["settings"], "batch_size": "8"}
    rows_b += [{**r, "cell": r["cell"].replace("ddp", "zero2"), "strategy": "zero2",
                "settings": {**r["settings"], "strategy": "zero2"}} for r in rows_b[1::4]]
    result = compare.compare(rows(a), rows_b)
    by_name = {m.name: m for m in result.matches}
    assert by_name["strategy=ddp nodes=1"].by == "name"
    assert [r["cell"] for r in result.only_b] == ["strategy=zero2 nodes=2 (3 runs)"] and not result.only_a
    text = comparetable.render(result, "a", "b")
    assert "strategy=ddp nodes=1 (matched by name; differs in batch_size: the setting under test)" in text and "Only in B: strategy=zero2 nodes=2" in text


def test_compare_reads_mlflow_parent_runs(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bench", artifact_location=(tmp_path / "art").as_uri())
    parents = []
    for sweep, tp in (("sweep-a", 100.0), ("sweep-b", 70.0)):
        parent = client.create_run(exp, run_name=sweep, tags={"sweep": sweep}).info.run_id
        for k, spread in enumerate((-0.01, 0.0, 0.01), start=1):
            tags = {"mlflow.parentRunId": parent, "cell": f"strategy=ddp run={k}", "strategy": "ddp",
                    "precision": "fp32", "model": "gpt_tiny", "nodes": "1", "world_size": "2"}
            run = client.create_run(exp, run_name=f"strategy=ddp run={k}", tags=tags).info.run_id
            for key, v in {"strategy.name": "ddp", "batch_size": "4", "repeats": "3", "sweep_dir": f"/x/{sweep}"}.items():
                client.log_param(run, key, v)
            for key, value in {"throughput_samples_per_s": tp * (1 + spread), "throughput_cv": 0.01, "world_size": 2,
                               "throughput_samples_per_s_per_device": tp * (1 + spread) / 2}.items():
                client.log_metric(run, key, value, step=0)
            client.set_terminated(run, "FINISHED")
        parents.append(parent)
    assert report_main(["--compare", *parents, "--tracking-uri", uri]) == 1
    out = capsys.readouterr().out
    assert "| strategy=ddp | samples/s | 100.0 | 70.0 | -30.0% | **regression** |" in out and "3 + 3 runs" in out
    assert report_main(["--compare", "nope", parents[0], "--tracking-uri", uri]) == 2
    assert "no MLflow run 'nope'" in capsys.readouterr().err


def test_a_lookup_in_a_store_that_does_not_exist_creates_none(tmp_path, capsys, monkeypatch):
    """--compare by parent run id and --experiment read a store; one that is not there is refused with
    the fix, and no empty store is left behind (the default is outputs/mlflow.db under the cwd)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert report_main(["--compare", "parent-a", "parent-b"]) == 2
    assert "no MLflow store at sqlite:///" in capsys.readouterr().err
    assert report_main(["--experiment", "bench"]) == 2
    err = capsys.readouterr().err
    assert "no MLflow store at" in err and "Fix: pass --tracking-uri" in err
    absent = tmp_path / "elsewhere" / "mlflow.db"
    assert report_main(["--experiment", "bench", "--tracking-uri", f"sqlite:///{absent}"]) == 2
    assert not list(tmp_path.rglob("*")), list(tmp_path.rglob("*"))


# ---- the one rule for comparisons (issue: unlike things compared, A/A claims) ----------------------

def test_a_sweep_compared_with_itself_is_refused(tmp_path, capsys):
    a = make_sweep(tmp_path, "a", BASE)
    for b in (str(a), str(a) + "/", str(tmp_path / "." / "a")):
        assert report_main(["--compare", str(a), b, "--gate"]) == 2
        err = capsys.readouterr().err
        assert "compared with itself" in err and "gate passed" not in err and "Traceback" not in err


def test_unlike_configurations_are_listed_not_compared_and_never_pass_the_gate(tmp_path, capsys):
    a = make_sweep(tmp_path, "a", BASE)
    b = make_sweep(tmp_path, "b", BASE)
    rows_b = rows(b)
    for r in rows_b:  # an MLP sweep with the same cell names
        r["model"] = "mlp"
        r["settings"] = {**r["settings"], "model": "mlp"}
    result = compare.compare(rows(a), rows_b)
    assert not result.matches and len(result.not_compared) == 4
    assert all(m.why_not.startswith("different models (A: gpt_tiny, B: mlp)") for m in result.not_compared)
    assert result.gate()[0] is False and not result.regressions()
    text = comparetable.render(result, "a", "b")
    assert "Not compared (4 pair(s): no claim, never a pass of the gate):" in text and "improvement" not in text
    # Two settings changed at once: not the one under test.
    rows_b = rows(b)
    for r in rows_b[0::4]:
        r["settings"] = {**r["settings"], "batch_size": "8", "steps": "99"}
    result = compare.compare(rows(a), rows_b)
    (m,) = result.not_compared
    assert m.name == "strategy=ddp nodes=1" and "settings differ in 2 keys (batch_size, steps)" in m.why_not


def test_a_running_sweep_is_compared_only_on_its_ended_configurations(tmp_path, capsys):
    a = make_sweep(tmp_path, "a", BASE)
    b = make_sweep(tmp_path, "b", BASE)
    state = SweepState.load(b)
    state.cells[0].status = CellStatus.running  # strategy=ddp nodes=1 run=1
    (state.cell_dir(state.cells[0]) / "result.json").unlink()
    state.save()
    assert report_main(["--compare", str(a), str(b)]) == 3  # never a "regression" for a run that has not ended
    out = capsys.readouterr().out
    assert "- strategy=ddp nodes=1: still running in B (1 of 3 run(s) not ended)" in out
    assert "1 cell(s) have not ended: only configurations whose runs have all ended are compared" in out
    assert report_main(["--compare", str(a), str(b), "--gate"]) == 3
    assert "1 pair(s) not comparable" in capsys.readouterr().out


def test_the_family_is_stated_and_step_time_never_claims_what_throughput_does_not(tmp_path):
    a = make_sweep(tmp_path, "a", BASE)
    b = make_sweep(tmp_path, "b", BASE)
    ra, rb = rows(a), rows(b)
    for r in rb[0::4]:  # ddp 1 node: median step 20% slower, tightly; throughput the same as A's
        r["step_time_ms_p50"] *= 1.20 * (1 + 0.001 * (r["run"] if "run" in r else 0))
    result = compare.compare(ra, rb, drift=QUIET)  # beyond the drift of a quiet cluster's record
    assert result.family == 12 and result.row_alpha == pytest.approx(0.05 / 12)
    verdicts = {(m.name, d.metric): d for m in result.matches for d in m.deltas}
    step = verdicts[("strategy=ddp nodes=1", "step p50 ms")]
    assert step.verdict == "inconclusive" and step.note.startswith("not claimed: throughput on the same runs is")
    assert not result.regressions()
    assert "False claims controlled over the family of 12 judged row(s) (Bonferroni): each row at 0.417%" in \
        comparetable.render(result, "a", "b")


def test_sweep_to_sweep_drift_is_recorded_from_an_aa_pair_and_widens_later_comparisons(tmp_path, capsys):
    """Two sweeps of the same settings, the second 8% slower everywhere (the machine drifted): without
    a record the default allowance keeps it from being a claim, and says so; recorded as the
    cluster's drift, it is pooled with the default, and a real slowdown is still a regression."""
    a = make_sweep(tmp_path, "a", BASE)
    drifted = {k: (v[0] * 0.92, v[1], v[2]) for k, v in BASE.items()}
    b = make_sweep(tmp_path, "b", drifted)
    assert report_main(["--compare", str(a), str(b)]) == 3  # 3 + 3 tight runs, yet no claim: undecided
    out = capsys.readouterr().out
    assert "no A/A record on this cluster: the default allowance 10% as 4 A/A entries, 4 df" in out
    assert "cannot decide: drift between sweeps dominates (±10.0% between two sweeps, 4 df" in out
    assert report_main(["--compare", str(a), str(b), "--record-drift"]) == 0
    out = capsys.readouterr().out
    kept = json.loads((tmp_path / "sweep-drift.json").read_text())
    assert "recorded 12 A/A entries" in out and len(next(iter(kept.values()))) == 12
    c = make_sweep(tmp_path, "c", BASE)
    d = make_sweep(tmp_path, "d", drifted)
    assert report_main(["--compare", str(c), str(d)]) == 3  # the drift recorded: still nothing judged
    out = capsys.readouterr().out
    # sqrt((4 * 10%^2 + 4 * 8.3%^2) / 8) for speed; peak memory did not drift: sqrt(4 * 10%^2 / 8).
    assert "Sweep-to-sweep drift in the noise: peak_memory 7.1%, step_time 9.2%, throughput 9.2% (the default 10% " \
           "as 4 A/A entries pooled with 4 recorded (local" in out and "; 8 df)." in out and "+ drift 9.2% (8 df)" in out
    # A real slowdown (half the throughput) is still a regression beyond the drift.
    e = make_sweep(tmp_path, "e", {**BASE, ("ddp", 2): (90.0, 0.01, 0.52)})
    assert report_main(["--compare", str(c), str(e)]) == 1
    assert "strategy=ddp nodes=2 samples/s -50.0%" in capsys.readouterr().out
    # Only an A/A pair is recorded: a pair with a setting changed is refused, nothing written.
    before = (tmp_path / "sweep-drift.json").read_text()
    rows_changed = make_sweep(tmp_path, "f", BASE)
    state = SweepState.load(rows_changed)
    state.cells[0].status = CellStatus.running
    state.save()
    assert report_main(["--compare", str(a), str(rows_changed), "--record-drift"]) == 2
    assert "takes an A/A pair" in capsys.readouterr().err
    assert (tmp_path / "sweep-drift.json").read_text() == before


@pytest.mark.parametrize("argv, says", [
    (["--gate"], "--gate only mean(s) something with --compare A B"),
    (["--threshold", "0.1"], "--threshold only mean(s) something with --compare"),
    (["--record-drift"], "--record-drift only mean(s) something with --compare"),
])
def test_compare_flags_without_compare_are_refused_and_nothing_is_rewritten(tmp_path, capsys, argv, says):
    a = make_sweep(tmp_path, "a", BASE)
    listing = sorted(p.name for p in a.rglob("*"))
    assert report_main([str(a), *argv]) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in a.rglob("*")) == listing  # no report.md written


def test_a_thin_drift_record_is_held_near_the_default_and_a_long_one_outweighs_it():
    """stats.sweep_drift: the default allowance counted as 4 A/A entries, pooled with the record."""
    assert stats.sweep_drift(None).cv["throughput"] == pytest.approx(0.10) and stats.sweep_drift(None).df == 4
    # One recorded entry that drifted by nothing (a moment estimate of zero) barely moves it...
    thin = stats.sweep_drift(stats.Drift({m: 0.0 for m in stats.METRICS}, 1, "one entry"))
    assert thin.cv["throughput"] == pytest.approx(0.10 * (4 / 5) ** 0.5) and thin.df == 5 and thin.recorded == 1
    # ...a long record outweighs the default, its degrees of freedom narrow the interval.
    assert stats.sweep_drift(QUIET).cv["throughput"] == pytest.approx(0.025) and stats.sweep_drift(QUIET).df == 64
    # A metric the record lacks keeps the default and its 4 df.
    partial = stats.sweep_drift(stats.Drift({"throughput": 0.03}, 20, "throughput only"))
    assert partial.df_of("peak_memory") == 4 and partial.cv["peak_memory"] == pytest.approx(0.10)
    assert partial.df_of("throughput") == 24


def test_aa_comparisons_of_two_sweeps_on_recorded_sweep_to_sweep_noise():
    """bench/sweep_aa.py on the recorded sweep-to-sweep noise (tests/data/sweep_drift.json: three real
    A/A pairs of default sweeps on this machine, one after the other, on a loaded evening: their runs,
    shifts and interference flags). A/A comparisons claim nothing beyond the family's 5% at 3, 6 and
    12 runs per side, with the drift kept from the other pairs and without any record (the default
    allowance); a 40% slowdown of one configuration is still a regression at the stated run count."""
    from bench import sweep_aa

    for runs in (3, 6, 12):
        rates = sweep_aa.simulate(REPLICATES, seed=1, runs=runs, slowdown=False)
        print(rates)
        # Seeded: fixed for this record. Over 1000 replicates the measured rates are 0.0-0.2% (docs/deciding.md);
        # at a true 5%, 5 or fewer false claims in 100 happen with probability 0.62: the bound is no looser.
        assert rates["aa_false_with_drift"] <= 0.05 and rates["aa_false_without_drift"] <= 0.05, rates
    slow = sweep_aa.simulate(REPLICATES, seed=1, runs=sweep_aa.CAUGHT_AT)
    print(slow)
    # Measured over 1000 replicates: caught in 91% (docs/deciding.md); below 75% of about 65 slowed
    # replicates is 4.5 standard deviations under that.
    assert slow["slowdown_caught_with_drift"] >= 0.75 and slow["aa_false_with_drift"] <= 0.05, slow


REPLICATES = 100
