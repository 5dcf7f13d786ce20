"""Figures 1 and 2: the worker's throughput against a bare loop, and what telemetry costs.

Both sides run under torchrun with the same ranks, threads per rank, model, batch, steps and
warm-up; each times its measured window the same way (wall clock after a barrier, see
worker_entry.py and bare_loop.py). Runs alternate ABBA so that a slow drift of a shared machine
lands on both sides. Our runs log to a real MLflow run in a SQLite store, as the launcher's runs
do, so figure 2 comes from the very same runs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from bench.common import (
    PYTHON,
    REPO,
    TORCHRUN,
    Row,
    Settings,
    bench_env,
    pair_ratio_ci,
    ratio_of_medians,
    ratio_verdict,
    read_result,
    run_logged,
    wait_for_quiet,
)

THROUGHPUT_TARGET = 0.98
TELEMETRY_TARGET = 0.01
# Rank 0's timings kept for the breakdown (worker_entry.py writes them; phases: jobs.hooks.PHASES).
BREAKDOWN_KEYS = ("after_window_s", "comm_probe_s", "local_probe_s", "health_check_s", "rank_figures_s", "gather_s",
                  "summarize_s", "reduce_s", "sink_set_tags_s", "sink_log_steps_s", "sink_log_summary_s",
                  "sink_log_system_s", "sink_finish_s", "mlflow_client_start_s", "window_s", "median_cycle_s")


def telemetry_parts(head: dict, gather_wait_s: float, telemetry_s: float) -> dict[str, float]:
    """Figure 2 of one run, part by part (s): each named phase after the window that figure 2 counts,
    and what no phase names (the window's peak memory read, the schedule's closing stop-request
    agreement, the hand-offs between phases), so that the parts add up to the figure."""
    gather_s = head.get("gather_s", 0.0) - gather_wait_s
    named = {
        "health check (losses read, one all-gather)": head.get("health_check_s", 0.0),
        "this rank's figures (history, model state, interference)": head.get("rank_figures_s", 0.0),
        "gather (the last rank's time in it)": gather_s,
        "summary, tags and records (jobs.summary.report)": head.get("reduce_s", 0.0),
        "JSONL + buffering: set_tags, log_steps, log_summary, log_system": sum(
            head.get(k, 0.0) for k in ("sink_set_tags_s", "sink_log_steps_s", "sink_log_summary_s",
                                       "sink_log_system_s")),
        "finish: JSONL status line, MLflow log_batch + set_terminated (client start-up apart)":
            head.get("sink_finish_s", 0.0) - head.get("mlflow_client_start_s", 0.0),
    }
    named["unnamed (peak memory read, the schedule's closing, hand-offs between phases)"] = (
        telemetry_s - sum(named.values()))
    return named


class Tracker:
    """The launcher's part for these runs: one experiment, one run per worker run (SQLite)."""

    def __init__(self, uri: str) -> None:
        import logging
        import os

        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name("bench")
        self.experiment_id = found.experiment_id if found else self.client.create_experiment("bench")

    def new_run(self, name: str) -> str:
        return self.client.create_run(self.experiment_id, run_name=name).info.run_id


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    work = settings.work / "throughput"
    work.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(work / 'mlflow.db').resolve()}"
    tracker = Tracker(uri)
    env = bench_env(settings.threads, {"BENCH_THREADS_PER_RANK": str(settings.threads)})
    launch = [TORCHRUN, "--standalone", "--nproc-per-node", str(settings.nproc)]
    if settings.pin:
        launch += ["--no-python", str(REPO / "bench" / "pin_rank.sh"), PYTHON]
    rows, details = [], {}
    telemetry_fraction: list[float] = []
    client_start: list[float] = []
    comm_probe: list[float] = []
    local_probe: list[float] = []
    parts: dict[str, list[float]] = {}  # figure 2 part by part (telemetry_parts), per run
    part_fractions: dict[str, list[float]] = {}
    busy: list[float] = []
    breakdown: dict[str, list[float]] = {}
    cpu_per_run: dict[str, dict[str, list[float]]] = {}
    steal: dict[str, list[float]] = {}  # per run, in run order: evidence for the spread between runs

    for strategy in ("ddp", "fsdp"):
        ours: list[float] = []
        bare: list[float] = []
        ours_window: list[float] = []
        bare_window: list[float] = []
        ours_cpu: list[float] = []
        bare_cpu: list[float] = []
        reported: list[float] = []

        def run_bare(i: int, strategy=strategy, bare=bare, bare_window=bare_window, bare_cpu=bare_cpu) -> None:
            out = work / f"bare-{strategy}-{i}.json"
            proc = run_logged([*launch, str(REPO / "bench" / "bare_loop.py"), "--strategy", strategy, "--out",
                               str(out), *settings.train_args()], work / f"bare-{strategy}-{i}.log", env, check=False)
            result = json.loads(read_result(out, proc))
            bare.append(result["median_step_throughput_samples_per_s"])
            bare_window.append(result["throughput_samples_per_s"])
            bare_cpu.append(result["samples_per_cpu_s"])
            steal.setdefault(f"{strategy}_bare", []).append(proc.steal_share)

        def run_ours(i: int, strategy=strategy, ours=ours, ours_window=ours_window, ours_cpu=ours_cpu,
                     reported=reported) -> None:
            out_dir = work / f"ours-{strategy}-{i}"
            run_id = tracker.new_run(f"bench {strategy} {i}")
            proc = run_logged([*launch, str(REPO / "bench" / "worker_entry.py"), "--strategy", strategy,
                               "--out-dir", str(out_dir), "--tracking-uri", uri, "--run-id", run_id,
                               *settings.train_args()], work / f"ours-{strategy}-{i}.log", env, check=False)
            ranks = [json.loads(read_result(out_dir / f"bench-rank{r}.json", proc)) for r in range(settings.nproc)]
            # The bare loop's definitions: the sum over ranks of each rank's own rate.
            per_step = settings.batch_size
            ours.append(sum(per_step / r["median_cycle_s"] for r in ranks))
            ours_window.append(sum(r["samples_in_window"] / r["window_s"] for r in ranks))
            ours_cpu.append(sum(r["samples_in_window"] / r["cpu_window_s"] for r in ranks))
            steal.setdefault(f"{strategy}_ours", []).append(proc.steal_share)
            head = next(r for r in ranks if r["rank"] == 0)
            reported.append(head["reported_throughput_samples_per_s"])
            # Everything rank 0 does for metrics after its last step, three things aside, each reported
            # on its own line: MLflow's one-off import and store opening (inside finish), and the two
            # probes (extra steps after the window: measurements of their own, not bookkeeping).
            # The gather is a collective: rank 0's time in it includes waiting for a peer still busy
            # with its own probe. The last rank to arrive waits least; its time is the gather's cost.
            client_s = head.get("mlflow_client_start_s", 0.0)
            probe_s = head.get("comm_probe_s", 0.0)
            local_s = head.get("local_probe_s", 0.0)
            gather_wait_s = head.get("gather_s", 0.0) - min(r.get("gather_s", 0.0) for r in ranks)
            telemetry_s = (head["after_window_s"] - probe_s - local_s - gather_wait_s + head.get("sink_finish_s", 0.0)
                           - client_s)
            telemetry_fraction.append(telemetry_s / head["window_s"])
            client_start.append(client_s)
            comm_probe.append(probe_s)
            local_probe.append(local_s)
            breakdown.setdefault("gather_wait_for_peer_s", []).append(gather_wait_s)
            for key in BREAKDOWN_KEYS:
                breakdown.setdefault(key, []).append(head.get(key, 0.0))
            breakdown.setdefault("telemetry_s", []).append(telemetry_s)
            for part, seconds in telemetry_parts(head, gather_wait_s, telemetry_s).items():
                parts.setdefault(part, []).append(seconds)
                part_fractions.setdefault(part, []).append(seconds / head["window_s"])

        log(f"  {strategy}: {settings.repeats} x (ours, bare), ABBA order")
        for i in range(settings.repeats):
            order = (("ours", run_ours), ("bare", run_bare)) if i % 2 == 0 else (("bare", run_bare), ("ours", run_ours))
            for name, fn in order:
                busy.append(wait_for_quiet(settings.quiet_wait_s, log))
                fn(i)
                value = (ours if name == "ours" else bare)[-1]
                cpu_value = (ours_cpu if name == "ours" else bare_cpu)[-1]
                log(f"    {name} #{i + 1}: {value:.1f} samples/s, {cpu_value:.1f} samples/CPU-s, "
                    f"steal {steal[f'{strategy}_{name}'][-1]:.1%}")
        # The figure: the median of the per-pair ratios (run i of each side, one ABBA block), with
        # a 95% t interval on the log ratios (bench.common.pair_ratio_ci); the verdict is taken
        # from the interval, so a spread wider than the target's band reads "inconclusive".
        ratio, ratio_ci = pair_ratio_ci(ours, bare)
        passed, verdict = ratio_verdict(ratio, ratio_ci, THROUGHPUT_TARGET)
        rows.append(Row(
            figure=f"1. throughput (median step), {strategy.upper()} ({settings.nproc} ranks x {settings.threads} thread, "
                   f"{settings.model}, batch {settings.batch_size}/rank): median per-pair ratio [95% CI]",
            unit="samples/s", ours=ours, reference=bare, target=f"ratio >= {THROUGHPUT_TARGET}",
            passed=passed, verdict=verdict, ratio=ratio, ratio_ci=ratio_ci,
            note="reference: bench/bare_loop.py under torchrun"))
        details[f"{strategy}_pair_ratio_median"] = ratio
        details[f"{strategy}_pair_ratio_ci95"] = ratio_ci
        details[f"{strategy}_ratio_of_medians"] = ratio_of_medians(ours, bare)
        cpu_ratio = ratio_of_medians(ours_cpu, bare_cpu)
        rows.append(Row(
            figure=f"1b. samples per CPU-second, {strategy.upper()} (process CPU time over the window: what another "
                   "process taking the core does not move)", unit="samples/CPU-s", ours=ours_cpu, reference=bare_cpu,
            target="(info)", passed=None, ratio=cpu_ratio))
        details[f"{strategy}_reported_throughput_samples_per_s"] = reported
        cpu_per_run[strategy] = {"ours": ours_cpu, "bare": bare_cpu}
        details[f"{strategy}_pair_ratios"] = [o / b for o, b in zip(ours, bare, strict=True)]
        details[f"{strategy}_window_throughput_samples_per_s"] = {"ours": ours_window, "bare": bare_window,
                                                                 "ratio_of_medians": ratio_of_medians(ours_window,
                                                                                                      bare_window)}

    frac = statistics.median(telemetry_fraction)
    rows.append(Row(
        figure="2. telemetry / measured step time (rank 0, after the window: loss read, memory, gather, "
               "summarize, JSONL + MLflow SQLite sinks)",
        unit="fraction", ours=telemetry_fraction, reference=[], target=f"<= {TELEMETRY_TARGET}",
        passed=frac <= TELEMETRY_TARGET, ratio=frac))
    rows.append(Row(
        figure="2b. MLflow client start-up on rank 0 (import + store open), once per job, after the window",
        unit="s", ours=client_start, reference=[], target="(info)", passed=None))
    if any(comm_probe):
        rows.append(Row(
            figure="2c. communication and anatomy probe on rank 0 (extra profiled steps after the window, shapes "
                   "recorded, the trace cut into the step's parts: jobs/anatomy.py; the cost of the whole probe, "
                   "outside the window; comm_probe_steps=0 turns it off)", unit="s", ours=comm_probe, reference=[], target="(info)", passed=None))
    if any(local_probe):
        rows.append(Row(
            figure="2d. straggler probe on rank 0 (extra forward+backward passes without gradient communication "
                   "after the window; local_probe_steps=0 turns it off)", unit="s", ours=local_probe, reference=[],
            target="(info)", passed=None))
    details["telemetry_breakdown_s"] = {k: statistics.median(v) for k, v in breakdown.items()}
    details["telemetry_parts_s"] = {k: statistics.median(v) for k, v in parts.items()}
    details["telemetry_parts_fraction"] = {k: statistics.median(v) for k, v in part_fractions.items()}
    details["busy_cores_at_start"] = busy
    details["steal_share_per_run"] = steal
    details["samples_per_cpu_s_per_run"] = cpu_per_run
    return rows, details


if __name__ == "__main__":
    import sys

    rows, details = run(Settings(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 1), print)
    from bench.common import render_table

    print(render_table(rows))
    print(json.dumps(details, indent=1))
