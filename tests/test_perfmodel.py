"""The performance model's arithmetic on literal numbers (launcher/forecast/perfmodel.py): fits that
recover the figures that made the data, ring factors, time-slicing of shared cores, the measured
overlap, and the conformal intervals. Pure functions: no ranks, no files."""

import math

import pytest

from launcher.forecast import perfmodel as pm


def _work(flops, threads=1, cores=1.0, ranks=1, bytes_=0.0, strategy="ddp", calls=1.0, samples=8):
    moved = (pm.Collective("all_reduce", bytes_, ranks, pm.INTRA, calls),) if ranks > 1 else ()
    return pm.Work("cpu", "fp32", strategy, flops, samples, ranks, threads, cores, moved)


def test_bus_factors_are_nccl_tests_ring_factors():
    assert pm.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert pm.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert pm.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert pm.bus_factor("all_reduce", 1) == 0.0


def test_relative_least_squares_recovers_an_exact_line_and_keeps_the_intercept_non_negative():
    a, b = pm.relative_least_squares([1, 2, 4, 8], [7, 9, 13, 21])  # 5 + 2x
    assert (a, b) == (pytest.approx(5.0), pytest.approx(2.0))
    a, b = pm.relative_least_squares([1, 2, 4], [1, 3, 7])  # the free fit's intercept is -1: through 0
    assert a == 0.0 and b > 0
    assert pm.relative_least_squares([3, 3], [6, 6]) == (0.0, pytest.approx(2.0))  # one x: no intercept


def test_compute_fit_recovers_overhead_rate_and_thread_scaling():
    # Made with overhead 4 ms, 2e6 FLOP/ms per thread, gamma 0.6: a 2-thread rank runs 2^0.6 = 1.52x.
    made = [(f, t, 4 + f / (2e6 * t**0.6)) for f in (1e8, 2e8, 4e8) for t in (1, 2)]
    fitted = pm.fit_compute([pm.Observed(_work(f, t, float(t)), ms) for f, t, ms in made])
    assert fitted.overhead_ms == pytest.approx(4.0, rel=1e-6)
    assert fitted.flops_per_ms == pytest.approx(2e6, rel=1e-6)
    assert fitted.gamma == pytest.approx(0.6)
    one_count = pm.fit_compute([pm.Observed(_work(f, 1), 4 + f / 2e6) for f in (1e8, 2e8)])
    assert one_count.gamma == 1.0 and "linearly" in one_count.note


def test_ranks_sharing_a_core_are_time_sliced():
    fitted = pm.ComputeFit(overhead_ms=0.0, flops_per_ms=1e6, gamma=1.0, points=2)
    alone = fitted.ms(_work(1e8, threads=1, cores=1.0))
    assert fitted.ms(_work(1e8, threads=1, cores=0.25)) == pytest.approx(4 * alone)  # 8 ranks on 2 cores
    assert fitted.ms(_work(1e8, threads=2, cores=2.0)) == pytest.approx(alone / 2)


def test_fabric_fit_recovers_alpha_and_beta_from_measured_communication():
    # comm = 2 calls x 0.5 ms + bus bytes / 1e6 bytes per ms (1 GB/s)
    cells = [pm.Observed(_work(1e8, ranks=n, bytes_=b, calls=2), 100.0, 2 * 0.5 + b * 2 * (n - 1) / n / 1e6, 0.0)
             for n, b in ((2, 4e6), (2, 16e6), (4, 8e6))]
    fabric = pm.fit_fabric(cells)
    link = fabric.links[(pm.ANY, pm.ANY)]
    assert link.alpha_ms == pytest.approx(0.5, rel=1e-6)
    assert link.bytes_per_ms == pytest.approx(1e6, rel=1e-6)
    assert "no fabric probe" in fabric.source
    assert fabric.ms(_work(1e8, ranks=8, bytes_=8e6, calls=2).collectives) == pytest.approx(1 + 8e6 * 1.75 / 1e6)


def test_a_probe_fabric_is_calibrated_by_the_communication_measured_in_training():
    probe = pm.Fabric({("all_reduce", pm.INTRA): pm.Link(0.0, 1e6)}, "probe")
    cells = [pm.Observed(_work(1e8, ranks=2, bytes_=b), 100.0, 1.5 * b / 1e6, 0.0) for b in (2e6, 4e6)]
    assert pm.calibrate(probe, cells).calibration == pytest.approx(1.5)


def test_overlap_is_what_the_cells_of_a_strategy_hid_and_the_prediction_adds_up():
    cells = [pm.Observed(_work(1e8, ranks=2, bytes_=4e6, strategy="ddp"), 60.0, 10.0, 4.0),
             pm.Observed(_work(2e8, ranks=2, bytes_=4e6, strategy="ddp"), 110.0, 10.0, 2.0),
             pm.Observed(_work(1e8), 50.0), pm.Observed(_work(2e8), 100.0)]
    model = pm.fit(cells)
    assert model.overlap["ddp"] == pytest.approx(0.7)  # (0.6 + 0.8) / 2
    p = model.predict(_work(3e8, ranks=2, bytes_=4e6))
    assert p.exposed_ms == pytest.approx(0.3 * p.comm_ms)
    assert p.step_ms == pytest.approx(p.compute_ms + p.exposed_ms)
    assert p.throughput_samples_per_s == pytest.approx(1000 * 2 * 8 / p.step_ms)
    with pytest.raises(pm.CannotPredict, match="gpu"):
        model.predict(pm.Work("gpu", "fp32", "ddp", 1e8, 8, 1))


def test_conformal_spread_takes_the_kth_smallest_error_and_says_its_coverage():
    errors = [math.log(1 + e) for e in (0.01, -0.02, 0.05, -0.10, 0.03, 0.20, -0.04, 0.02, 0.07)]
    s = pm.spread(errors, 0.9)
    assert s.errors == 9 and s.coverage == pytest.approx(9 / 10)
    assert s.half_width == pytest.approx(math.log(1.2))  # k = ceil(0.9 x 10) = 9: the largest
    low, high = s.interval(100.0)
    assert (low, high) == (pytest.approx(100 / 1.2), pytest.approx(120.0))
    assert pm.spread([], 0.9) is None
    assert pm.spread(errors, 0.5).half_width == pytest.approx(-math.log(0.96))  # k = 5 of 9: |ln 0.96|


def test_cells_are_read_at_the_share_other_tenants_left_and_forecasts_assume_the_median():
    # 1e6 FLOP/ms on a whole core; the cells got 50%, 25% and 20% of theirs.
    made = [(1e8, 0.5), (2e8, 0.25), (4e8, 0.2)]
    cells = [pm.Observed(pm.Work("cpu", "fp32", "ddp", f, 8, 1, available=a), f / (1e6 * a)) for f, a in made]
    model = pm.fit(cells)
    assert model.compute[("cpu", "fp32")].flops_per_ms == pytest.approx(1e6, rel=1e-6)
    assert model.available == pytest.approx(0.25)
    assert model.predict(_work(1e8)).compute_ms == pytest.approx(1e8 / (1e6 * 0.25))


def test_each_thread_count_measured_at_two_workloads_gets_its_own_overhead_and_rate():
    # Two threads: 1600 ms of overhead per step and 2.6e6 FLOP/ms; one thread: 0 ms and 2e6 FLOP/ms.
    made = [(f, 2, 1600 + f / 2.6e6) for f in (1e8, 4e8)] + [(f, 1, f / 2e6) for f in (1e8, 4e8)]
    fitted = pm.fit_compute([pm.Observed(_work(f, t, float(t)), ms) for f, t, ms in made])
    own = {t: (o, r) for t, o, r in fitted.per_threads}
    assert own[2] == (pytest.approx(1600.0, rel=1e-6), pytest.approx(2.6e6, rel=1e-6))
    assert own[1][0] == pytest.approx(0.0, abs=1e-6)
    assert fitted.ms(_work(2e8, threads=2, cores=2.0)) == pytest.approx(1600 + 2e8 / 2.6e6)


def test_a_recommendation_is_apart_only_beyond_the_error_of_forecast_ratios():
    from types import SimpleNamespace

    from launcher.commands.forecast import recommend
    from launcher.forecast.forecastrecord import ratio_errors

    # Errors that share a bias within each sweep: every forecast ~10% high in one, ~10% low in the
    # other. Each forecast is off by about 10%, but their ratios by at most 2%.
    entries = [{"sweep": "a", "log_error": e} for e in (0.10, 0.11, 0.09, 0.10)] + \
              [{"sweep": "b", "log_error": e} for e in (-0.10, -0.09, -0.11)]
    diffs = ratio_errors(entries)
    assert len(diffs) == 6 + 3 and max(abs(d) for d in diffs) == pytest.approx(0.02)
    ratios = pm.spread(diffs)

    def made(name, samples_per_s):
        return SimpleNamespace(cell=SimpleNamespace(model="gpt_tiny", world_size=8, name=name),
                               prediction=SimpleNamespace(throughput_samples_per_s=samples_per_s))

    (apart,) = recommend([made("strategy=ddp", 100.0), made("strategy=fsdp", 95.0)], ratios)
    assert "**strategy=ddp**" in apart and "0.95×, apart beyond the error of forecast ratios" in apart
    (close,) = recommend([made("strategy=ddp", 100.0), made("strategy=fsdp", 99.0)], ratios)
    assert "within the error of forecast ratios (forecast ratios here: ×/÷1.02): run both to decide" in close
    (unknown,) = recommend([made("strategy=ddp", 100.0), made("strategy=fsdp", 50.0)], None)
    assert "run both to decide" in unknown  # nothing checked yet: no claim
