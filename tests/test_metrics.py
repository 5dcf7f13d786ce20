"""The metric math on fixed numbers worked out by hand: percentiles, CV, scaling efficiency, MFU and
the cross-rank reduction (throughput summed, step time the slowest rank's, memory the maximum)."""

import math
import statistics

import pytest

from contract import stats
from jobs import energy, peaks, summary


def test_percentile_interpolates_linearly_like_numpy():
    values = [40.0, 10.0, 30.0, 20.0]  # order must not matter
    assert stats.percentile(values, 0) == 10.0
    assert stats.percentile(values, 100) == 40.0
    # Sorted 10, 20, 30, 40: p50 sits halfway between 20 and 30; p90 at position 2.7.
    assert stats.percentile(values, 50) == pytest.approx(25.0)
    assert stats.percentile(values, 90) == pytest.approx(37.0)
    assert stats.percentile([5.0], 90) == 5.0
    assert math.isnan(stats.percentile([], 50))


def test_coefficient_of_variation_is_sample_stdev_over_mean():
    # mean 10, sample stdev sqrt(((8-10)^2 + (12-10)^2) / 1) = sqrt(8)
    assert stats.coefficient_of_variation([8.0, 12.0]) == pytest.approx(math.sqrt(8) / 10)
    assert stats.coefficient_of_variation([3.0, 3.0, 3.0]) == 0.0
    assert stats.coefficient_of_variation([7.0]) == 0.0  # one window: no spread
    assert math.isnan(stats.coefficient_of_variation([1.0, -1.0]))  # zero mean


def test_scaling_efficiency_is_per_device_ratio():
    assert stats.scaling_efficiency(90.0, 100.0) == pytest.approx(0.9)
    assert stats.scaling_efficiency(100.0, 100.0) == 1.0
    assert math.isnan(stats.scaling_efficiency(50.0, 0.0))


def test_mfu_is_achieved_flops_over_peak():
    # 6 GFLOP per sample at 100 samples/s per device = 600 GFLOP/s of a 1 TFLOP/s device.
    assert peaks.mfu(6e9, 100.0, 1e12) == pytest.approx(0.6)
    assert peaks.mfu(None, 100.0, 1e12) is None  # FLOPs unknown
    assert peaks.mfu(6e9, 100.0, None) is None  # device peak unknown (CPUs)


def test_peak_flops_lookup_by_device_name_and_precision():
    assert peaks.peak_flops_for("NVIDIA H100 80GB HBM3 SXM", "bf16") == pytest.approx(989.4e12)
    assert peaks.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp32") == pytest.approx(19.5e12)
    assert peaks.peak_flops_for("cpu", "fp32") is None


# Two ranks, four measured steps, two repeats (windows of two steps), 4 samples per step.
RANK0 = {"step_time_s": [0.1, 0.2, 0.1, 0.2], "data_time_s": [0.01, 0.01, 0.01, 0.01],
         "peak_rss_gib": 1.0, "param_bytes": 100, "model_state_bytes": 300}
RANK1 = {"step_time_s": [0.2, 0.1, 0.1, 0.4], "data_time_s": [0.0, 0.0, 0.0, 0.0],
         "peak_rss_gib": 1.5, "param_bytes": 50, "model_state_bytes": 150}


def test_summarize_reduces_across_ranks_and_repeats():
    s = summary.summarize([RANK0, RANK1], samples_per_step=4, tokens_per_sample=1, repeats=2)
    assert s["world_size"] == 2 and s["measured_steps"] == 4
    # Throughput: each rank's 16 samples over its whole measured time, summed over ranks.
    assert s["throughput_samples_per_s"] == pytest.approx(16 / 0.6 + 16 / 0.8)
    assert s["throughput_samples_per_s_per_device"] == pytest.approx((16 / 0.6 + 16 / 0.8) / 2)
    # The windows (steps 0-1, 2-3) give only the spread: 53.33 and 42.67 samples/s.
    w1, w2 = 8 / 0.3 + 8 / 0.3, 8 / 0.3 + 8 / 0.5
    assert s["throughput_cv"] == pytest.approx(abs(w1 - w2) / math.sqrt(2) / ((w1 + w2) / 2))
    # The sum over ranks is not "samples over the slowest rank's time": that would give 2*16/1.0 = 32.
    # Step time: the slowest rank per step -> 0.2, 0.2, 0.1, 0.4 s.
    assert s["step_time_ms_p50"] == pytest.approx(200.0)
    assert s["step_time_ms_p90"] == pytest.approx(340.0)  # sorted 0.1 0.2 0.2 0.4, position 2.7
    assert s["step_time_ms_max"] == pytest.approx(400.0)
    # Data-wait share: the worst rank's (rank 0: 0.04 s of 0.6 s).
    assert s["data_time_share"] == pytest.approx(0.04 / 0.6)
    # Memory and bytes: the maximum over ranks (the rank that runs out first).
    assert s["peak_rss_gib"] == 1.5 and s["param_bytes"] == 100 and s["model_state_bytes"] == 300
    assert "throughput_tokens_per_s" not in s  # not a language model


def test_throughput_is_samples_over_the_whole_measured_time_under_jitter():
    # Fast and slow steps mixed, 7 steps in 3 windows (2, 3, 2: no step left over): a mean
    # of the windows' rates would give about 2.1x the true figure, which is samples / time.
    fast, slow = 0.05, 2.0
    times = [fast, fast, fast, slow, slow, fast, slow]
    rank = {"step_time_s": times, "data_time_s": [0.0] * len(times)}
    s = summary.summarize([rank, dict(rank)], samples_per_step=4, tokens_per_sample=1, repeats=3)
    assert s["throughput_samples_per_s"] == pytest.approx(2 * 4 * len(times) / sum(times))
    windows = summary.step_windows(len(times), 3)
    mean_of_rates = 2 * statistics.fmean([4 * len(w) / sum(times[i] for i in w) for w in windows])
    assert mean_of_rates > 2 * s["throughput_samples_per_s"]  # the bias the headline no longer has
    assert [list(w) for w in summary.step_windows(7, 3)] == [[0, 1], [2, 3, 4], [5, 6]]
    assert [len(w) for w in summary.step_windows(20, 3)] == [7, 6, 7]
    assert sum(len(w) for w in summary.step_windows(5, 9)) == 5  # more windows than steps: one per step


def test_summarize_tokens_and_single_window():
    s = summary.summarize([RANK0, RANK1], samples_per_step=4, tokens_per_sample=32, repeats=1)
    # One window over all four steps: rank0 16 / 0.6 s + rank1 16 / 0.8 s.
    total = 16 / 0.6 + 16 / 0.8
    assert s["throughput_samples_per_s"] == pytest.approx(total)
    assert s["throughput_tokens_per_s"] == pytest.approx(32 * total)
    assert s["throughput_tokens_per_s_per_device"] == pytest.approx(16 * total)
    assert s["throughput_cv"] == 0.0


# ---- stragglers and cost ------------------------------------------------------------------------

def test_stragglers_name_the_slowest_rank_above_ten_percent():
    from jobs.stragglers import stragglers

    summary, tags = stragglers([0.010, 0.010, 0.013, 0.010], ["a", "a", "b", "b"])
    assert summary["step_time_rank_spread"] == pytest.approx(1.3)
    assert tags == {"slowest_rank": "2 on b", "straggler_rank": "2 on b"}
    summary, tags = stragglers([0.010, 0.0105], ["a", "a"])
    assert summary["step_time_rank_spread"] < 1.1 and "straggler_rank" not in tags and tags["slowest_rank"] == "1 on a"


def test_cost_per_million_samples_and_tokens():
    from jobs.cost import cost_per_1m

    # 8 devices at $2/h = $16/h; 1000 samples/s = 3.6M samples/h: $4.44 per million.
    assert cost_per_1m(1000.0, devices=8, nodes=1, cost_per_device_hour=2.0, cost_per_node_hour=None) == \
        pytest.approx(16 / 3.6)
    # Per node-hour when no device price is given: 2 nodes at $30/h over 1e6 tokens/s.
    assert cost_per_1m(1e6, devices=16, nodes=2, cost_per_device_hour=None, cost_per_node_hour=30.0) == \
        pytest.approx(60 / 3600)
    assert cost_per_1m(1000.0, devices=8, nodes=1, cost_per_device_hour=None, cost_per_node_hour=None) is None
    assert cost_per_1m(0.0, devices=8, nodes=1, cost_per_device_hour=2.0, cost_per_node_hour=None) is None


# ---- energy, measured matmul peak, system metrics ---------------------------------------------

def test_energy_from_counter_in_millijoules_with_wrap_and_missing_readings():
    assert energy.energy_from_counter_j(1_000, 351_000) == pytest.approx(350.0)
    # The unsigned 64-bit counter wrapped between the readings: still the 2 J spent.
    assert energy.energy_from_counter_j(2**64 - 500, 1_500) == pytest.approx(2.0)
    assert energy.energy_from_counter_j(None, 5) is None  # NotSupported at the start (pre-Volta)
    assert energy.energy_from_counter_j(5, None) is None


def test_energy_from_power_samples_is_the_trapezoid_rule():
    # 100 W for 1 s, a ramp 100 -> 300 W over 2 s (400 J), 300 W for 0.5 s: 100 + 400 + 150.
    times = [0.0, 1.0, 3.0, 3.5]
    watts = [100.0, 100.0, 300.0, 300.0]
    assert energy.energy_from_power_j(times, watts) == pytest.approx(650.0)
    assert energy.energy_from_power_j([0.0], [100.0]) is None  # one reading: no duration
    assert energy.energy_from_power_j([], []) is None
    with pytest.raises(ValueError, match="2 sample times but 1"):
        energy.energy_from_power_j([0.0, 1.0], [1.0])


def test_energy_figures_sum_devices_over_the_job_samples():
    devices = [{"energy_j": 600.0, "window_s": 2.0, "method": "nvml_energy_counter"},
               {"energy_j": 400.0, "window_s": 2.0, "method": "nvml_power_samples"}]
    summary, tags = energy.energy_figures(devices, samples_in_window=500)
    assert summary == pytest.approx({"energy_j": 1000.0, "energy_j_per_sample": 2.0, "power_w_mean": 250.0})
    assert tags == {"energy_method": "nvml_energy_counter,nvml_power_samples"}


def test_energy_figures_leave_the_job_out_when_one_device_has_none():
    devices = [{"energy_j": 600.0, "window_s": 2.0, "method": "nvml_energy_counter"},
               {"missing": "nvmlDeviceGetPowerUsage: NVMLError_NotSupported"}]
    summary, tags = energy.energy_figures(devices, samples_in_window=500)
    assert summary == {}  # a sum over the other devices would understate the job's energy
    assert tags == {"energy_missing": "rank 1: nvmlDeviceGetPowerUsage: NVMLError_NotSupported"}
    assert energy.energy_figures([None], 10)[1] == {"energy_missing": "rank 0: no NVML sample"}
    assert "energy_missing" in energy.energy_figures(devices[:1], 0)[1]


def test_matmul_flop_count_and_rate():
    assert peaks.matmul_flops(2, 3, 4) == 48  # 24 multiply-adds
    assert peaks.matmul_flops(8192, 8192, 8192) == 2 * 8192**3
    # Ten 8192^3 matmuls in 20 ms: 1.0995e15 FLOP x 10 / 0.02 s = 549.8 TFLOP/s.
    assert peaks.matmul_tflops(8192, 10, 0.02) == pytest.approx(2 * 8192**3 * 10 / 0.02 / 1e12)
    assert peaks.matmul_tflops(8192, 10, 0.02) == pytest.approx(549.76, abs=0.01)
    with pytest.raises(ValueError):
        peaks.matmul_tflops(8192, 10, 0.0)


def test_mfu_against_the_measured_peak():
    per_rank = [{"measured_matmul_tflops": 700.0}, {"measured_matmul_tflops": 660.0}]
    tflops, why = peaks.measured_peak(per_rank)
    assert (tflops, why) == (pytest.approx(680.0), None)
    # 6e9 FLOP per sample at 34,000 samples/s per device: 204 TFLOP/s of 680 measured = 0.3.
    assert peaks.mfu_checked(6e9, 34_000, tflops * 1e12) == (pytest.approx(0.3), None)
    missing = peaks.measured_peak([per_rank[0], {"missing": "cpu ranks"}])
    assert missing == (None, "rank 1: cpu ranks")
    assert peaks.measured_peak([])[0] is None


def test_thin_keeps_first_and_last_evenly():
    assert energy.thin(list(range(5)), 10) == [0, 1, 2, 3, 4]
    assert energy.thin(list(range(101)), 5) == [0, 25, 50, 75, 100]
    assert energy.thin(list(range(10)), 1) == [9]


def test_system_records_name_each_device_by_node_and_index():
    series = [{"node_id": 0, "device_index": 0, "unsupported": {},
               "samples": [{"unix_s": 10.0, "util_percent": 90.0, "mem_used_gib": 30.5, "power_w": 400.0},
                           {"unix_s": 10.1, "util_percent": 95.0, "mem_used_gib": 30.5, "power_w": 410.0}]},
              None,  # a rank without a sampler
              {"node_id": 1, "device_index": 3, "unsupported": {"power": "NotSupported"},
               "samples": [{"unix_s": 10.0, "util_percent": 50.0, "mem_used_gib": 2.0, "power_w": None}]}]
    records = energy.system_records(series)
    assert records == [
        {"step": 0, "time": 10.0, "system/node0/gpu0_utilization_percent": 90.0,
         "system/node0/gpu0_memory_used_gib": 30.5, "system/node0/gpu0_power_w": 400.0},
        {"step": 1, "time": 10.1, "system/node0/gpu0_utilization_percent": 95.0,
         "system/node0/gpu0_memory_used_gib": 30.5, "system/node0/gpu0_power_w": 410.0},
        {"step": 0, "time": 10.0, "system/node1/gpu3_utilization_percent": 50.0,
         "system/node1/gpu3_memory_used_gib": 2.0},
    ]


# ---- bench figure 1: the median per-pair ratio and its 95% interval (bench/common.py) ---------

def test_bench_pair_ratio_median_and_t_interval_on_log_ratios():
    from bench.common import pair_ratio_ci, ratio_verdict, t_975

    assert t_975(3) == 3.182 and t_975(30) == 2.042
    assert t_975(40) == pytest.approx(2.0211, abs=1e-3) and t_975(1000) == pytest.approx(1.9623, abs=1e-3)
    # The previous suite run's DDP pairs (BENCH_RESULTS.md): median 0.9216; logs' mean -0.0723,
    # sample stdev 0.0478, half-width 3.182 x 0.0478 / 2 = 0.0761 -> exp(-0.1484), exp(0.0038).
    ours, bare = [94.97, 89.19, 99.06, 89.35], [100.0] * 4
    median, ci = pair_ratio_ci(ours, bare)
    assert median == pytest.approx(0.9216)
    assert ci == (pytest.approx(0.8581, abs=1e-4), pytest.approx(1.0090, abs=1e-4))
    assert ratio_verdict(median, ci, 0.98) == (None, "inconclusive")  # the interval spans the target
    assert ratio_verdict(0.99, (0.985, 1.0), 0.98) == (True, None)
    assert ratio_verdict(0.9, (0.85, 0.95), 0.98) == (False, None)
    assert pair_ratio_ci([50.0], [100.0]) == (0.5, None)  # one pair: no interval, the median decides
    assert ratio_verdict(0.5, None, 0.98) == (False, None)
    assert pair_ratio_ci([], []) == (None, None)


def test_a_partial_bench_run_writes_a_whole_results_file_that_says_what_it_measured(tmp_path):
    """BENCH_RESULTS.md is written whole by every run (bench/results.py): a run of one part says
    which figures it measured and which it did not, points at the hand-kept analysis, and lists
    figure 2 part by part."""
    from bench.common import Row, Settings
    from bench.results import write_results

    rows = [Row(figure="2. telemetry", unit="fraction", ours=[0.004, 0.006], reference=[], target="<= 0.01",
                passed=True, ratio=0.005)]
    parts = {"gather (the last rank's time in it)": 0.002, "finish": 0.03}
    details = {"throughput": {"telemetry_parts_s": parts,
                              "telemetry_parts_fraction": {k: v / 10 for k, v in parts.items()}}}
    out = tmp_path / "BENCH_RESULTS.md"
    write_results(out, command="python -m bench --only throughput", info={"cores": "2"}, settings=Settings(),
                  rows=rows, details=details, elapsed_s=12.0, measured=["throughput"])
    text = out.read_text()
    assert text.startswith("# Benchmark results") and "bench/ANALYSIS.md" in text
    assert "This run measured figures 1, 1b, 2, 2b-2d (`throughput`)." in text
    assert "Not measured in this run, so not in the table: figure 1c (`paired`), figure 3 (`startup`)" in text
    assert "| gather (the last rank's time in it) | 2.0 | 0.02% |" in text
    assert "## How each figure is measured" in text
