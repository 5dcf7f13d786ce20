"""cells=auto: the rule on known numbers (pilot, intervals, pruning, the replay), the simulation's
fast version, and one real local sweep that prunes a configuration, reports it and logs it to MLflow
as a run tagged forecast."""

from __future__ import annotations

import math
import random

import pytest

from launcher.forecast import search, searchsim
from launcher.forecast.search import Candidate, Shape


def _shape(name, strategy="ddp", precision="fp32", world=1, size=1.0, model="m", unmodelled="", device="cpu"):
    return Shape(name, model, device, precision, strategy, world, world, size, unmodelled)


@pytest.mark.parametrize("device, fast", [("cpu", "fp32"), ("gpu", "bf16")])
def test_the_pilot_is_the_cheapest_of_each_strategy_and_precision_plus_a_second_point_per_axis(device, fast):
    shapes = [_shape(f"{s} {p} b{b} n{n}", s, p, n, float(b), device=device) for s in ("ddp", "fsdp")
              for p in ("fp32", "bf16") for b in (4, 8, 16) for n in (1, 2)]
    chosen = dict(search.pilot(shapes))
    assert {"ddp fp32 b4 n1", "ddp bf16 b4 n1", "fsdp fp32 b4 n1", "fsdp bf16 b4 n1"} <= set(chosen)
    assert "ddp bf16 b16 n1" in chosen and "ddp fp32 b16 n1" in chosen  # the overhead beside the rate
    # Each strategy's communication, in the precision the device is fastest in (bf16 is emulated
    # on CPUs: on this machine its steps took 10 to 20 times fp32's).
    assert f"ddp {fast} b4 n2" in chosen and f"fsdp {fast} b4 n2" in chosen
    assert len(chosen) == 8  # of 24


def test_a_configuration_is_pruned_only_against_a_measured_best_and_run_when_it_may_win():
    best = Candidate(_shape("best"), measured=100.0)
    far = Candidate(_shape("far"), forecast=70.0)  # x1.25 = 87.5 < 100: pruned
    near = Candidate(_shape("near"), forecast=90.0)  # x1.25 >= 100: run
    blind = Candidate(_shape("blind"), why_not="no basis")
    elsewhere = Candidate(_shape("other scale", world=2), forecast=10.0)  # the best of its scale: run
    choice = search.choose([best, far, near, blind, elsewhere], math.log(1.25))
    assert [c.shape.name for c, _ in choice.pruned] == ["far"]
    assert choice.pruned[0][1] is best
    assert {n for n, _ in choice.run} == {"near", "blind", "other scale"}
    decided = search.choose([best, far], math.log(1.25))
    assert not decided.run and not decided.undecided


def test_the_interval_rests_on_the_default_until_the_record_outweighs_it():
    assert search.band([]).half_width == pytest.approx(search.DEFAULT_ERROR)
    assert search.band([0.01] * 400).half_width < 0.03  # a long record of good forecasts outweighs it
    assert search.band([0.5] * 10).half_width > 0.4  # wrong forecasts widen it
    # the 95% quantile of the record, not its median: one error in twenty beyond the rest counts
    assert search.band([0.05] * 19 + [0.3] * 2).half_width > search.band([0.05] * 21).half_width


def test_cells_max_keeps_the_likeliest_winners():
    candidates = [Candidate(_shape("a"), forecast=5.0), Candidate(_shape("b"), forecast=9.0),
                  Candidate(_shape("c"), why_not="x")]
    assert [n for n, _ in search.cap([("a", ""), ("b", ""), ("c", "")], candidates, 2)] == ["c", "b"]


def test_the_replayed_search_finds_the_full_grids_best_in_most_replays_with_fewer_launches():
    """The fast version of python -m bench.cells_auto: the grid from the model, 40 seeded replays."""
    from bench.cells_auto import model_grid, run_noise

    shapes, works = model_grid()
    rng, noise = random.Random(3), run_noise()
    different, ran = 0, 0
    for _ in range(40):
        grid = searchsim.observed_grid(works, searchsim.nominal(), {n: rng.gauss(0, 0.06) for n in works})
        r = searchsim.replay(shapes, grid, rng, noise, 3, [rng.gauss(0, 0.06) for _ in range(20)])
        different += bool(r.different)
        ran += len(r.outcome.ran)
    assert different <= 4  # at most 10% here; the bench's 500 replays hold it at 5%
    assert ran < 40 * len(works)


def test_a_local_search_prunes_reports_and_logs_what_it_did_not_run(tmp_path, fast_overrides, capsys):
    """Three batch sizes at one rank: the pilot runs the smallest and the largest; the middle one
    is forecast from them and pruned when its interval stays below the best."""
    from contract.mlflow_client import client as mlflow_client
    from launcher.__main__ import main
    from launcher.state import SweepState
    from launcher.track import tracking

    overrides = [o for o in fast_overrides if not o.startswith("batch_size=")]
    code = main(["-m", *overrides, "batch_size=1,2,16", "cells=auto", f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 's'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    state = SweepState.load(tmp_path / "s")
    assert state.search is not None and state.search.stopped
    assert len(state.cells) <= 3 and state.search.grid == 3
    assert "cells=auto:" in out
    report = (tmp_path / "s" / "report.md").read_text()
    assert "## Cells not run (cells=auto)" in report and "of 3 configuration(s)" in report
    pruned = [p for p in state.search.pruned if p.beaten_by]
    assert pruned, report  # batch_size=2 is overhead-bound: far below batch_size=16 here
    for p in pruned:
        assert f"| {p.name} | {p.forecast:.1f} |" in report and p.beaten_by in report
    client = mlflow_client(state.tracking_uri)
    runs = client.search_runs([state.experiment_id], f"tags.{tracking.FORECAST_TAG} = 'true'")
    assert {r.data.tags["forecast_of"] for r in runs} == {p.name for p in state.search.pruned if p.forecast}
    assert all("cell" not in r.data.tags and r.data.tags["mlflow.parentRunId"] == state.parent_run_id for r in runs)


def test_the_budget_costs_each_configuration_at_the_pace_of_its_world_size(tmp_path):
    """The pilot ran three one-rank configurations (10 s each) and two two-rank ones (30 s) in 120 s;
    two ranks' best is measured, so the next round holds the five one-rank configurations left. Each
    is costed as runs=auto costs its rounds (timelimit.round_pace_s: the round's wall shared by the
    time each launch used), 120 x 10 / 90 = 13.3 s: with 60 s of the budget left, four fit. At the
    round's mean pace (24 s a configuration) two would."""
    import json

    from launcher import sweep
    from launcher.forecast import cellsearch
    from launcher.plan.cell import CellStatus
    from launcher.plan.grid import compose, expand
    from launcher.plan.planner import plan

    points, swept = expand(["model=gpt_tiny", "strategy=ddp,fsdp", "batch_size=2,4,8,16", "nodes=1,2", "runs=1",
                            "cells=auto", "cells_budget_min=3", "tracking=off", "fabric.probe=off",
                            f"output_root={tmp_path}", f"sweep_dir={tmp_path / 's'}"], multirun=True)
    state = sweep.prepare(plan(compose(points, swept)), ["test"])
    found = state.search
    assert found is not None
    assert sorted(c.world_size for c in state.cells) == [1, 1, 1, 2, 2]  # the pilot
    for cell in state.cells:  # done, as its rank 0 records it: 100 samples/s per device
        tp = 100.0 * cell.world_size
        summary = {"throughput_samples_per_s": tp, "throughput_samples_per_s_per_device": 100.0,
                   "step_time_ms_p50": 40.0, "peak_mem_allocated_gib": 0.3, "loss_first": 5.0, "loss_last": 4.0}
        (state.cell_dir(cell) / "result.json").write_text(json.dumps({"summary": summary, "tags": {"hostnames": "vm"}}))
        cell.status, cell.time_used_s = CellStatus.done, 10.0 if cell.world_size == 1 else 30.0
    state.save()
    found.started_s = found.rounds[0].started_s = 0.0
    added = cellsearch.next_round(state, now_s=3 * 60 - 60.0)
    assert [c.world_size for c in added] == [1, 1, 1, 1], [c.name for c in added]
    assert sum(1 for c in found.waiting if c.world_size == 1) == 1 and not found.stopped
