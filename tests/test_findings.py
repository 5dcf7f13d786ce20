"""The findings rules on hand-made result sets: a clear win, a difference inside the noise, mixed
world sizes, a failed cell, interference, independent runs, and the statistics underneath."""

import math

import pytest

from launcher.report import comparisons, findings
from launcher.report.rows import add_derived, grouped, ranked
from launcher.report.stats import INCONCLUSIVE, Estimate, Floor, difference, estimate, runs_needed, t95


def one(strategy="ddp", precision="fp32", nodes=1, tp=1000.0, cv=0.01, repeats=3, world=None, peak=10.0,
        state=1e9, model="gpt2-small", seed=None, run=None, **extra):
    """One run's row (``cv``: its window CV, which no claim may use)."""
    world = world or 8 * nodes
    cell = f"strategy={strategy} precision={precision} nodes={nodes}" + (f" seed={seed}" if seed is not None else "")
    cell += f" run={run}" if run is not None else ""
    r = {"cell": cell, "sweep": "s", "strategy": strategy, "precision": precision, "model": model, "nodes": nodes,
         "world_size": world, "status": "done", "series": f"strategy={strategy} precision={precision}",
         "repeats": repeats, "throughput_samples_per_s": tp, "throughput_samples_per_s_per_device": tp / world,
         "throughput_cv": cv, "peak_mem_allocated_gib": peak, "model_state_bytes": state,
         "step_time_ms_p50": 1e3 * 8 * world / tp}
    r.update(extra)
    return r


def row(strategy="ddp", precision="fp32", nodes=1, tp=1000.0, cv=0.01, runs=3, peak=10.0, **kw):
    """A configuration measured in ``runs`` independent runs whose throughputs (and peaks) spread
    with the relative standard deviation ``cv`` around ``tp`` (and ``peak``)."""
    if runs == 1:
        return [one(strategy, precision, nodes, tp, peak=peak, **kw)]
    spread = [-1.0, 0.0, 1.0] if runs == 3 else [(-1) ** i * 1.0 for i in range(runs)]
    scale = math.sqrt((runs - 1) / sum(z * z for z in spread))  # sample stdev exactly cv * tp
    return [one(strategy, precision, nodes, tp * (1 + cv * z * scale), peak=peak * (1 + 0.001 * z), run=i + 1, **kw)
            for i, z in enumerate(spread)]


def rows_of(*configs):
    return [r for c in configs for r in c]


def failed(strategy="fsdp", precision="fp32", nodes=1):
    return [{"cell": f"strategy={strategy} precision={precision} nodes={nodes}", "sweep": "s", "strategy": strategy,
             "precision": precision, "model": "gpt2-small", "nodes": nodes, "world_size": 8 * nodes,
             "status": "failed", "error": "rank 3 on gpu2 failed: OutOfMemoryError: CUDA out of memory",
             "failure_class": "oom", "series": f"strategy={strategy} precision={precision}"}]


# ---- statistics ---------------------------------------------------------------------------------

def test_t_quantiles():
    assert t95(1) == pytest.approx(12.706) and t95(2) == pytest.approx(4.303)
    assert t95(2.7) == t95(2)  # fractional degrees of freedom round down (wider interval)
    assert t95(45) == pytest.approx(2.021) and t95(1e6) == pytest.approx(1.96) and math.isinf(t95(0.5))


def test_estimate_from_independent_runs_never_from_windows():
    (unit,) = grouped(row(tp=1000.0, cv=0.02))
    e = estimate(unit)
    assert e.source == "runs" and e.n == 3 and e.df == 2
    assert e.mean == pytest.approx(1000.0) and e.se == pytest.approx(0.02 * 1000 / math.sqrt(3))
    # One run: its windows' CV is not a noise estimate of a claim.
    single = one(tp=1000.0, cv=0.02, repeats=5)
    assert estimate(single).se is None and estimate(single).source == "none"
    # ... but the cluster's noise floor is: one run's standard error is the floor's CV times its value.
    floor = Floor(cv={"throughput": 0.04}, df=7, where="local:test")
    e = estimate(single, "throughput", floor)
    assert e.source == "floor" and e.se == pytest.approx(40.0) and e.df == 7
    assert estimate(failed()[0]) is None
    # A failed run of a configuration counts in no figure.
    (unit,) = grouped([*row(tp=1000.0, cv=0.02), {**one(tp=1.0, run=4), "loss_last": float("nan")}])
    assert estimate(unit).n == 3 and estimate(unit).mean == pytest.approx(1000.0)


def test_verdicts_need_the_interval_and_the_minimum_effect():
    a, b = Estimate(1100.0, 5.0, 2, 3, "runs"), Estimate(1000.0, 5.0, 2, 3, "runs")
    d = difference(a, b, 0.05)
    se = math.sqrt(50.0)
    df = se**4 / (5.0**4 / 2 + 5.0**4 / 2)  # Welch-Satterthwaite: 4
    assert df == pytest.approx(4.0)
    assert d.ratio == pytest.approx(1.1) and d.verdict == "higher" and d.claimed
    assert d.low == pytest.approx(1 + (100 - t95(4) * se) / 1000) and d.high == pytest.approx(1 + (100 + t95(4) * se) / 1000)
    assert difference(b, a, 0.05).verdict == "lower"
    # 3% apart, tightly measured: real but below the minimum effect, and the interval fits in it.
    assert difference(Estimate(1030.0, 2.0, 2, 3, "runs"), Estimate(1000.0, 2.0, 2, 3, "runs"), 0.05).verdict == "same"
    # 3% apart, loosely measured: cannot tell, and says how many runs would.
    loose = difference(Estimate(1030.0, 20.0, 2, 3, "runs"), Estimate(1000.0, 20.0, 2, 3, "runs"), 0.05)
    assert loose.verdict == INCONCLUSIVE and loose.runs_needed and "runs per side would decide" in loose.why_inconclusive()
    # No noise at all: inconclusive, never a claim.
    none = difference(Estimate(1500.0, None, None, 1, "none"), b, 0.05)
    assert none.verdict == INCONCLUSIVE and "no noise estimate" in none.why_inconclusive()


def test_runs_needed_is_the_first_run_count_that_decides():
    a, b = Estimate(1080.0, 40.0, 2, 3, "runs"), Estimate(1000.0, 40.0, 2, 3, "runs")
    n = runs_needed(a, b, 0.05)
    assert n is not None and n > 3
    rel_sd = math.sqrt(a.sd**2 + b.sd**2) / b.mean
    assert t95(2 * n - 2) * rel_sd / math.sqrt(n) < 0.08 <= t95(2 * n - 4) * rel_sd / math.sqrt(n - 1)
    # Simulated with that many runs at the same spread, the difference is claimed.
    big = [Estimate(m, s * 40.0 * math.sqrt(3) / math.sqrt(n), n - 1, n, "runs") for m, s in ((1080.0, 1), (1000.0, 1))]
    assert difference(big[0], big[1], 0.05).verdict == "higher"
    # Undecided at 3 + 3 runs with one side far noisier (Welch's df near 2): never "3 runs would decide it".
    lopsided = difference(Estimate(1400.0, 120.0, 2, 3, "runs"), Estimate(1000.0, 2.0, 2, 3, "runs"), 0.05)
    assert lopsided.verdict == INCONCLUSIVE and lopsided.runs_needed is not None and lopsided.runs_needed > 3


# ---- the rules ----------------------------------------------------------------------------------

def test_clear_win_is_claimed_with_numbers():
    rows = rows_of(row("ddp", tp=4600.0, cv=0.01, peak=13.0, state=1.6e9),
                   row("fsdp", tp=3200.0, cv=0.01, peak=8.5, state=0.2e9))
    (c,) = comparisons.comparisons(grouped(rows), "strategy")
    assert (c.a_label, c.b_label) == ("fsdp", "ddp")  # ddp is the baseline
    assert c.claimed and c.throughput.verdict == "lower"
    assert c.throughput.ratio == pytest.approx(3200 / 4600)
    assert c.peak_ratio == pytest.approx(8.5 / 13.0) and c.peak.verdict == "lower" and c.state_ratio == pytest.approx(0.125)
    assert c.noise == "3 + 3 runs"
    md = findings.findings(rows)
    assert "**fsdp** is 30.4% slower than **ddp** (0.70×, 95% CI" in md and "; 3 + 3 runs)" in md
    assert "35% less peak memory" in md and "0.12× the model state per rank" in md
    assert "| 8 | precision=fp32 | fsdp vs ddp | 0.70× (" in md
    # Recommendation: DDP is fastest; FSDP is not within 5% of it, so nothing leaner qualifies.
    rec = md.split("### Recommendation")[1]
    assert "fastest **strategy=ddp precision=fp32** at 4,600.0 samples/s (±" in rec
    assert "No other configuration comes within 5% of it." in rec
    (line,) = findings.answers(rows)
    assert line.startswith("8 ranks, precision=fp32: ddp faster, fsdp 30.4% slower (fsdp/ddp 0.70×, 95% CI ")
    assert line.endswith("; 3 + 3 runs)")


def test_difference_inside_the_noise_is_not_claimed():
    rows = rows_of(row("ddp", tp=1000.0, cv=0.05), row("fsdp", tp=1020.0, cv=0.05, peak=6.0))
    (c,) = comparisons.comparisons(grouped(rows), "strategy")
    assert c.throughput.verdict == INCONCLUSIVE and not c.claimed
    assert c.throughput.low < 1 < c.throughput.high
    md = findings.findings(rows)
    assert "inconclusive: about" in md and "No throughput difference is claimed." in md
    assert "faster" not in md.split("### Precisions")[0].split("### Strategies")[1].split("|")[0]
    # FSDP is within 5% of the fastest and uses 40% less peak memory: the lean pick.
    rec = md.split("### Recommendation")[1]
    assert "fastest **strategy=fsdp precision=fp32**" in rec and "inconclusive against strategy=ddp" in rec
    assert "Most memory-efficient within 5% of it: **strategy=ddp precision=fp32**" not in rec
    assert "Of the 1 other(s) within 5% of it, none uses measurably less memory." in rec
    rows = rows_of(row("ddp", tp=1000.0, cv=0.05, peak=6.0), row("fsdp", tp=1020.0, cv=0.05, peak=10.0))
    rec = findings.findings(rows).split("### Recommendation")[1]
    assert ("Most memory-efficient within 5% of it: **strategy=ddp precision=fp32** "
            "(peak 6.00 GiB against 10.00") in rec
    # Within 1% and tightly measured: provably the same speed, so the lean pick may come from it.
    rows = rows_of(row("ddp", tp=1000.0, cv=0.002, peak=10.0), row("fsdp", tp=995.0, cv=0.002, peak=6.0))
    rec = findings.findings(rows).split("### Recommendation")[1]
    assert "not measurably faster than strategy=fsdp" in rec
    assert "Most memory-efficient within 5% of it or not measurably slower: **strategy=fsdp precision=fp32**" in rec
    # A rival 20% slower by its mean but too noisy to call: never "no other configuration comes within".
    rows = rows_of(row("ddp", tp=1000.0, cv=0.25), row("fsdp", tp=800.0, cv=0.25))
    rec = findings.findings(rows).split("### Recommendation")[1]
    assert "inconclusive against strategy=fsdp" in rec and "comes within" not in rec


def test_one_run_claims_nothing_without_a_noise_floor():
    rows = rows_of(row("ddp", tp=1000.0, runs=1), row("fsdp", tp=1500.0, runs=1))
    md = findings.findings(rows)
    assert "inconclusive: no noise estimate" in md and "2 configuration(s) ran once" in md
    assert "slower" not in md and "faster" not in md.replace("not measurably faster", "")
    # With the cluster's measured noise floor, a 50% difference is claimed, and says what it rests on.
    floor = Floor(cv={"throughput": 0.03, "peak_memory": 0.01}, df=7, where="local:test")
    md = findings.findings(rows, floor=floor)
    assert "**fsdp** is 50.0% faster than **ddp**" in md and "noise floor (local:test)" in md


def test_only_the_same_world_size_is_compared():
    # A 2-node DDP cell is faster in total than every 1-node cell: it must not beat them.
    rows = rows_of(row("ddp", nodes=1, tp=1000.0, runs=1), row("fsdp", nodes=1, tp=800.0, runs=1),
                   row("ddp", nodes=2, tp=1800.0, runs=1))
    comps = comparisons.comparisons(grouped(rows), "strategy")
    assert [(c.world_size, c.a_label, c.b_label) for c in comps] == [(8, "fsdp", "ddp")]
    add_derived(rows)
    order = ranked(rows)
    assert [(r["world_size"], r["_rank"], round(r["relative_perf"], 2)) for r in order] == \
        [(8, 1, 1.0), (8, 2, 0.8), (16, 1, 1.0)]
    md = findings.findings(rows)
    rec = md.split("### Recommendation")[1]
    assert "**8 rank(s)**: fastest **strategy=ddp precision=fp32**" in rec
    assert "**16 rank(s)**: fastest **strategy=ddp precision=fp32**" in rec
    # Scaling efficiency per series: 1800 / 16 per device against 1000 / 8.
    assert "- strategy=ddp precision=fp32: against 8 rank(s), 16 ranks 90% (no noise estimate)" in md
    runs = rows_of(row("ddp", nodes=1, tp=1000.0), row("ddp", nodes=2, tp=1800.0))
    assert "16 ranks 90% (±" in findings.findings(runs) and "3 + 3 runs" in findings.findings(runs)


def test_precision_axis_and_other_settings_equal():
    rows = rows_of(row("ddp", "fp32", tp=1000.0), row("ddp", "bf16", tp=1600.0, peak=7.0),
                   row("fsdp", "fp32", tp=700.0), row("fsdp", "bf16", tp=1100.0))
    strat = comparisons.comparisons(grouped(rows), "strategy")
    prec = comparisons.comparisons(grouped(rows), "precision")
    assert sorted((c.context, c.a_label, c.b_label) for c in strat) == [
        ("precision=bf16", "fsdp", "ddp"), ("precision=fp32", "fsdp", "ddp")]
    assert sorted((c.context, c.a_label, c.b_label) for c in prec) == [
        ("strategy=ddp", "bf16", "fp32"), ("strategy=fsdp", "bf16", "fp32")]
    md = findings.findings(rows)
    assert "8 rank(s), strategy=ddp: **bf16** is 60.0% faster than **fp32**" in md


def test_failed_cell_is_left_out_and_named():
    rows = rows_of(row("ddp", tp=1000.0), failed("fsdp"))
    (c,) = comparisons.comparisons(grouped(rows), "strategy")
    assert not c.claimed and c.throughput is None and "fsdp has no result (failed)" in c.caveat
    md = findings.findings(rows)
    assert "Left out (no result): strategy=fsdp precision=fp32 nodes=1 (failed, oom)." in md
    assert "not claimed: fsdp has no result (failed)" in md
    assert "fastest **strategy=ddp precision=fp32**" in md


def test_a_configuration_that_never_ran_gets_no_result_yet_and_no_recommendation_against_it():
    # A Ctrl-C after ddp's runs: fsdp's two runs cancelled, none with a result.
    cancelled = [{**c, "status": "cancelled", "failure_class": None, "error": "interrupted by SIGINT"}
                 for c in failed("fsdp") * 2]
    cancelled = [{**c, "cell": f"{c['cell']} run={i + 1}"} for i, c in enumerate(cancelled)]
    rows = rows_of(row("ddp", tp=1000.0), cancelled)
    md = findings.findings(rows)
    assert "No result yet: strategy=fsdp precision=fp32 nodes=1 (2 runs) (0/2 done)." in md
    assert "not claimed: fsdp has no result yet" in md
    rec = md.split("### Recommendation")[1]
    assert "withheld: strategy=fsdp precision=fp32 has no result yet (0/2 done)" in rec
    assert "fastest so far strategy=ddp precision=fp32 at 1,000.0 samples/s" in rec
    assert "fastest **" not in rec and "comes within" not in rec
    from launcher.report.columns import table
    assert "| no result yet (0/2 done) |" in table(rows)
    # Its own failure (out of memory) is an answer: the others are still recommended.
    assert "fastest **strategy=ddp precision=fp32**" in findings.findings(rows_of(row("ddp"), failed("fsdp")))


def test_interference_is_qualified_and_never_recommended():
    rows = rows_of(row("ddp", tp=1000.0), row("fsdp", tp=1500.0, interference="another job on gpu1 (pid 4242, 30 GiB)"))
    (c,) = comparisons.comparisons(grouped(rows), "strategy")
    assert not c.claimed and "interference" in c.caveat
    md = findings.findings(rows)
    assert "⚠ Interference: strategy=fsdp precision=fp32 nodes=1 (3 runs): another job on gpu1 (pid 4242, 30 GiB)" in md
    assert "not claimed: fsdp flagged interference" in md
    assert "fastest **strategy=ddp precision=fp32**" in md  # the faster but disturbed cell is not picked
    assert "**fsdp** is" not in md


def test_seeds_give_the_noise_and_one_unit():
    rows = [one("ddp", tp=t, seed=s, repeats=1) for s, t in enumerate((1000.0, 1010.0, 990.0))]
    rows += [one("fsdp", tp=t, seed=s, repeats=1) for s, t in enumerate((700.0, 705.0, 695.0))]
    units = grouped(rows)
    assert len(units) == 2 and {u["runs"] for u in units} == {3}
    (c,) = comparisons.comparisons(units, "strategy")
    assert c.claimed and c.throughput.verdict == "lower" and c.throughput.ratio == pytest.approx(0.7)


def test_a_straggler_is_named_in_the_findings():
    slow = one("ddp", tp=1000.0)
    slow.update(straggler_rank="1 on node2", step_time_rank_spread=1.94)
    md = findings.findings([slow, one("fsdp", tp=900.0)])
    assert "### Stragglers" in md and "rank 1 on node2 is a straggler: 1.94x the median rank's step time" in md
    assert "No rank lagged" in findings.findings([one("ddp", tp=1000.0), one("fsdp", tp=900.0)])
    shared = one("ddp", tp=1000.0, straggler_withheld="2 CPU ranks share the cores of 1 host(s): a lag between "
                                                      "them is not a host's")
    md = findings.findings([shared, one("fsdp", tp=900.0)])
    assert "- Not judged in 1 cell(s): 2 CPU ranks share the cores of 1 host(s)" in md and "look at that host" not in md


def test_at_one_rank_ddp_against_fsdp_is_worded_as_the_wrappers_cost_not_a_strategy_result():
    """The README's default sweep at one rank: FSDP 0.72x DDP. At one rank nothing is sharded or sent,
    so the finding names the wrappers, shows where their time goes (the anatomy), and claims no strategy."""
    parts = {"anatomy_step_time_ms": 60.0, "anatomy_forward_ms": 20.0, "anatomy_backward_ms": 30.0,
             "anatomy_optimizer_ms": 10.0}
    slower = {**parts, "anatomy_step_time_ms": 83.0, "anatomy_optimizer_ms": 33.0}
    rows = rows_of(row("ddp", tp=118.6, cv=0.02, world=1, **parts), row("fsdp", tp=85.4, cv=0.02, world=1, **slower))
    (c,) = comparisons.comparisons(grouped(rows), "strategy")
    assert c.wrappers_only and c.claimed
    md = findings.findings(rows)
    assert "slower than **ddp**" not in md
    assert ("- 1 rank(s), precision=fp32: **fsdp** against **ddp**: at one rank nothing is sharded and nothing is "
            "communicated, so the two differ only in their wrappers; fsdp's wrapper makes the step 28.0% slower "
            "than ddp's (0.72×, 95% CI") in md
    assert "This is not a strategy result: compare strategies at two ranks or more." in md
    assert "+23.0 ms optimizer" in md  # where the wrapper's time goes
    assert "(one rank: the wrappers' cost, not a strategy result)" in md
    assert "(one rank: strategies differ here only in their wrappers)" in md.split("### Recommendation")[1]
    # Shown but not claimed (inside the noise), its parts still listed: said once, not in nested brackets.
    noisy = findings.findings(rows_of(row("ddp", tp=118.6, cv=0.3, world=1, **parts),
                                      row("fsdp", tp=112.0, cv=0.3, world=1, **slower)))
    assert "; one rank: the wrappers' cost, not a strategy result):" in noisy
    # At two ranks the same difference is a strategy result, worded as before.
    two = rows_of(row("ddp", tp=118.6, cv=0.02, world=2), row("fsdp", tp=85.4, cv=0.02, world=2))
    assert "**fsdp** is 28.0% slower than **ddp**" in findings.findings(two)
    assert findings.answers(rows) == ["1 rank, precision=fp32: not a strategy question (nothing is sharded or sent at "
                                      "one rank: fsdp against ddp is the wrappers' cost)"]


def test_a_bytes_finding_is_said_once_per_configuration_and_ddps_buffer_broadcast_is_theory():
    """Seed 000's CPU twin printed "broadcast moved 213 kB per step where the strategy's theory moves none"
    once per DDP run: DDP broadcasting BatchNorm's buffers. Said once per configuration, and expected."""
    from launcher.plan import traffic
    from launcher.report.explain import traffic_findings

    extra = {"comm_broadcast_bytes_per_step": 213e3, "comm_all_reduce_bytes_per_step": 1.02e8,
             "predicted_comm_all_reduce_bytes_per_step": 1.02e8}
    runs = row("ddp", world=2, runs=6, **extra)
    (line,) = traffic_findings(runs)
    assert line.startswith("- strategy=ddp precision=fp32 nodes=1 (6 runs): broadcast moved 213 kB per step where")
    expected = [{**r, "predicted_comm_broadcast_bytes_per_step": 213e3} for r in runs]
    assert traffic_findings(expected) == []
    from contract import spec

    layout = spec.Layout(tasks_per_node=2)
    params = [traffic.Param((10, 4), True)]
    assert traffic.bytes_per_step(params, spec.StrategySpec(), spec.PrecisionSpec(), layout, buffer_bytes=213_000) == {
        "all_reduce": 160, "broadcast": 213_000}
    no_broadcast = spec.StrategySpec(broadcast_buffers=False)
    assert "broadcast" not in traffic.bytes_per_step(params, no_broadcast, spec.PrecisionSpec(), layout, buffer_bytes=1)


def test_a_gpu_idle_for_much_of_the_window_is_called_host_bound_naming_what_kept_it_waiting():
    """The GPU check's FSDP at one rank: busy 59-60% (NVML), an unfused optimizer over DTensor parameters."""
    waiting = {"gpu_util_mean": 59.5, "anatomy_step_time_ms": 83.0, "anatomy_forward_ms": 20.0,
               "anatomy_backward_ms": 25.0, "anatomy_optimizer_ms": 38.0, "tuning.optimizer_impl": "for_loop"}
    rows = rows_of(row("ddp", world=1, gpu_util_mean=89.0), row("fsdp", world=1, tp=700.0, **waiting))
    md = findings.findings(rows)
    (line,) = md.split("### Host-bound steps\n\n")[1].split("\n\n")[0].splitlines()
    assert line == ("- strategy=fsdp precision=fp32 nodes=1 (3 runs): the step was host-bound: the GPU was busy 60% of "
                    "the measured window (NVML), idle the rest; what kept it waiting: the optimizer, 38.0 of the "
                    "profiled step's 83.0 ms on the host (an unfused optimizer: optimizer_impl=fused steps every "
                    "parameter in one kernel).")
    assert "### Host-bound steps" not in findings.findings(rows_of(row("ddp", world=1, gpu_util_mean=89.0)))
