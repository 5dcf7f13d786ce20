"""BENCH_RESULTS.md, written whole: the last run's table, the machine, which figures it measured,
the details of its repeats and how each figure is measured. What the numbers were read to mean
(changes, investigations, runs made on their own) is bench/ANALYSIS.md, kept by hand."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import Row, Settings, render_table

# Each part of the suite (python -m bench --only NAME) and the figures it measures.
FIGURE_NUMBERS = {"throughput": "figures 1, 1b, 2, 2b-2d", "paired": "figure 1c", "startup": "figure 3",
                  "slurm": "figure 4", "imports": "figure 5", "thousand": "figure 6"}

METHOD = """\
## How each figure is measured

All figures are ratios of ours to a reference measured in the same suite run on the same machine.
The two sides alternate ABBA (ours, ref, ref, ours, ...), so a slow drift of a shared machine lands
on both; each cell shows the median, the full range and the number of repeats.

**1. Throughput vs a bare loop.** `bench/bare_loop.py` is a hand-written nanoGPT-style loop:
`init_process_group`, the same model (`jobs.models.build_model`), DDP or `fully_shard` per block
and then the root (root kept gathered after forward, as the worker does), AdamW, a pool of
synthetic batches made up front, no per-step `.item()`. Ours is `bench/worker_entry.py`, which
builds the RunSpec the launcher would ship and calls the worker's real entry point
(`jobs.worker.main`) unmodified, timed through the worker's public hooks (`jobs/hooks.py`). Both run
under `torchrun --standalone --nproc-per-node N` with the same threads per rank
(`OMP_NUM_THREADS`, and the worker's `cpus_per_task`), model, batch, steps and warm-up. Ours logs
to a real MLflow run in a SQLite store, as a launcher run does. The figure is the steady-state
throughput: per rank, the batch over the median step cycle time (start of one step to the start
of the next, so everything the worker does between steps counts: timing, heartbeat, the stop-
request all-reduce), summed over ranks. The median makes it robust to a step that another
process on a shared machine pre-empted. The plain window mean (samples over the wall time of
the measured window) is listed below the table as well. On CPU ranks each rank is pinned to its
own core(s) on both sides (`bench/pin_rank.sh`, `taskset`), so ranks do not migrate. Row 1b is a
cross-check that other processes on the machine move less: samples per second of process CPU
time over the window (each rank's own CPU time, gloo's threads included), summed over ranks.
This machine is a small VM on a shared host: identical runs minutes apart differ by up to ~5%,
which is more than the 2% the target allows, so read the per-pair ratios below with the table.
The ratio in the table is the median of the per-pair ratios (run i of ours over run i of the
bare loop, the two runs of one ABBA block), with a 95% interval: Student's t on the log ratios
(n-1 degrees of freedom), exponentiated, i.e. an interval for the geometric mean ratio, whose
point for these roughly symmetric logs is close to the median. The target passes when the whole
interval is at or above it, fails when the whole interval is below, and otherwise reads
"inconclusive": the runs cannot tell. With 4 pairs the t factor is 3.18, so an interval narrower
than the 2% band needs a spread of the pair ratios well under 1%.

**1c. Paired blocks in one job.** `bench/paired_steps.py` holds both sides in the same torchrun
processes: one copy of the model wrapped as the bare loop wraps it and stepped by the bare step,
another wrapped by the worker's `apply_ddp`/`apply_fsdp` and stepped by the worker's own schedule
(`jobs.schedule.run`: `Trainer.step`, per-step timing and history, heartbeat, stop-request
agreement; a fresh schedule per block, so each block also pays the schedule's start). Blocks of 5
steps alternate ABBA, each after a barrier; a block's time is its slowest rank's, and each pair of
neighbouring blocks gives one ratio, bare time / ours. Whatever moves a whole run on a shared
machine moves both sides of a pair, so this figure isolates what the worker's step path costs;
what it cannot see is anything that differs between two processes (imports, memory layout),
which figure 1 sees, together with the noise between runs.

**2. Telemetry.** In the same runs, on rank 0, the wall time from the end of the measured window
to the last sink call of `benchmark()` (the health check's loss read and agreement, the window's
peak memory, this rank's figures, `gather_ranks`, the summary, tags and step records of
`jobs.summary.report`, the sinks' `set_tags`/`log_steps`/`log_summary`), plus the sinks' `finish`
(JSONL status line, one MLflow `log_batch` and `set_terminated` against the SQLite store),
divided by the measured window's wall time. Each part is a named phase of the worker's hooks
(`jobs.hooks.PHASES`) and is listed part by part below the table, so that the next addition shows
its cost. Three things are timed and reported apart: MLflow's one-off import and store opening
(once per job, after the window: 2b), the communication probe (`comm_probe_steps` extra profiled
steps after the window: 2c) and the straggler probe (`local_probe_steps` extra forward and backward
passes without gradient communication: 2d); each probe is a measurement in its own right, not
bookkeeping. `gather_ranks` is a collective, so rank 0's time in it includes waiting for a peer
still busy with its probes: the gather is charged at the time the last rank to arrive spent in it,
and the wait goes with the probes. The per-step bookkeeping inside the window (two `perf_counter`
calls, list appends, a detached loss, the heartbeat, the stop-request agreement, the hooks' step
call) is part of figure 1. Telemetry is a constant per job, so its share falls as the window grows:
the suite's runs measure 50 steps (`--quick`: 30), a short benchmark run.

**3. Time to first step.** The suite takes the wall clock right before spawning each command;
the worker records `first_step_unix_s` (start of its first training step, rank 0) in
`result.json`, the bare loop prints the same instant. Ours: `python -m launcher strategy=ddp
cluster.tasks_per_node=N steps=3 warmup_steps=1` on the local cluster (compose, validate,
submitit's local executor, the ranks; default SQLite tracking). Reference: `torchrun --standalone
--nproc-per-node N bench/bare_loop.py`. One untimed run of each comes first (file caches warm,
the MLflow store exists, as on any machine that has run a sweep before).

**4. Slurm submission.** Both tools sweep `strategy=ddp,fsdp precision=fp32,bf16 nodes=1,2
seed=0,1` (16 cells) against the same cluster: ours with `python -m launcher -m cluster=slurm`,
the reference with hydra-submitit-launcher 1.2.0 running the minimal Hydra app in
`bench/hsl_app` (`hydra/launcher=submitit_slurm`). A shim first on PATH (`bench/sbatch_shim.sh`)
logs when each sbatch call returned (Slurm accepted the jobs) and counts the calls. The figure is
command start to the last acceptance. Every job is submitted held (`--hold`, through each tool's
additional-parameters setting) and cancelled by id right after the run, so no benchmark job ever
runs. The plugin takes resources once per sweep, so its 16 cells are one 1-node array (1 sbatch);
ours are two arrays, one per resource shape (1 and 2 nodes). Held jobs never end: our command
returning at all shows it does not wait; the plugin blocks until every job ends and is stopped
by the suite once its sbatch has returned.

**5. Imports.** `python -m launcher --help` under `python -X importtime` (the modules imported
are read from its report), and expand + compose + validate + plan of the 16-cell grid in a fresh
interpreter that lists the heavy modules in `sys.modules` afterwards. The reference time is the
Hydra app of figure 4 answering `--help`.

**6. A thousand cells** (`bench/thousand.py`). `seed=range(0,250) strategy=ddp,fsdp nodes=1,2` on
the Slurm cluster, every job held: our command with `tracking=off` and with SQLite MLflow (its runs
created by a background `launcher.sync`) against hydra-submitit-launcher having the same grid
accepted by sbatch; then `launcher.status` as the sweep changes under it: untouched, after 10 jobs
and then the other 990 are cancelled by hand (scancel, as an administrator would), and the call
after. Each once per repeat. Needs a `MaxArraySize` that admits 1000 tasks (the plugin submits one
array); against a smaller one it is skipped, with the reason.
"""

def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    med = statistics.median(values)
    return f"{100 * (max(values) - min(values)) / med:.0f}%" if med else "-"


def details_section(rows: list[Row], details: dict[str, dict]) -> str:
    out = ["## Details of this run", ""]
    tp = details.get("throughput") or {}
    for strategy in ("ddp", "fsdp"):
        if f"{strategy}_pair_ratios" not in tp:
            continue
        window = tp[f"{strategy}_window_throughput_samples_per_s"]
        row = next(r for r in rows if r.figure.startswith("1.") and strategy.upper() in r.figure)
        ci = tp.get(f"{strategy}_pair_ratio_ci95")
        interval = (f"median {_fmt(tp[f'{strategy}_pair_ratio_median'])}, 95% CI {_fmt(ci[0])}-{_fmt(ci[1])}"
                    if ci else "no interval (fewer than 2 pairs)") if f"{strategy}_pair_ratio_median" in tp else ""
        out.append(f"- {strategy.upper()}: per-pair ratios (ours/bare, median-step throughput) "
                   f"{', '.join(_fmt(x) for x in tp[f'{strategy}_pair_ratios'])}"
                   f"{f' ({interval})' if interval else ''}; range of the repeats: "
                   f"ours {_spread(row.ours)}, bare {_spread(row.reference)} of the median. Window-mean throughput "
                   f"(samples/s) ours {', '.join(_fmt(x) for x in window['ours'])}, bare "
                   f"{', '.join(_fmt(x) for x in window['bare'])}: ratio of medians "
                   f"{_fmt(window['ratio_of_medians'] or float('nan'))}. The worker's own reported throughput "
                   f"(sum of per-step times): {', '.join(_fmt(x) for x in tp[f'{strategy}_reported_throughput_samples_per_s'])}.")
    pa = details.get("paired") or {}
    for strategy in ("ddp", "fsdp"):
        if f"{strategy}_paired" in pa:
            ratios = pa[f"{strategy}_paired"]["pair_ratios"]
            out.append(f"- {strategy.upper()}, paired blocks (1c): ratios bare/ours per pair "
                       f"{', '.join(_fmt(x) for x in ratios)}; {sum(x >= 1 for x in ratios)} of {len(ratios)} pairs "
                       "had ours at least as fast.")
    if "telemetry_breakdown_s" in tp:
        b = tp["telemetry_breakdown_s"]
        out.append("- Telemetry breakdown, rank 0, medians over all our runs (ms): "
                   + ", ".join(f"{k[:-2]} {1e3 * v:.1f}" for k, v in b.items()) + ". `telemetry` is the "
                   "per-job constant that figure 2 divides by the window.")
    if "telemetry_parts_s" in tp:
        out += ["", telemetry_parts_table(tp["telemetry_parts_s"], tp["telemetry_parts_fraction"]), ""]
    sl = details.get("slurm") or {}
    if sl.get("skipped"):
        out.append(f"- Slurm: skipped ({sl['skipped']}).")
    elif sl:
        out.append(f"- Slurm: partition `{sl.get('partition')}`; our command returned "
                   f"{_fmt(sl.get('ours_return_s_median', float('nan')))} s after start (median), MLflow runs "
                   "included.")
    im = details.get("imports") or {}
    if im:
        out.append(f"- Heavy modules imported by `--help`: {', '.join(im['help_heavy_imports']) or 'none'}; by "
                   f"composition: {', '.join(im['compose_heavy_imports']) or 'none'}.")
    return "\n".join(out)


def telemetry_parts_table(seconds: dict[str, float], fractions: dict[str, float]) -> str:
    """Figure 2 part by part: each part's median over our runs, in ms and as a share of the window."""
    lines = ["Figure 2 part by part (rank 0, median over our runs; the parts of one run add up to its figure):", "",
             "| part of the work after the window | ms | share of the window |", "|---|---:|---:|"]
    lines += [f"| {part} | {1e3 * seconds[part]:.1f} | {100 * fractions[part]:.2f}% |" for part in seconds]
    return "\n".join(lines)


def measured_section(measured: list[str]) -> str:
    """Which figures this run measured: a partial run (``--only``) writes a whole file all the same."""
    not_run = [name for name in FIGURE_NUMBERS if name not in measured]
    lines = ["This run measured " + ", ".join(f"{FIGURE_NUMBERS[m]} (`{m}`)" for m in measured) + "."]
    if not_run:
        lines.append("Not measured in this run, so not in the table: " + ", ".join(
            f"{FIGURE_NUMBERS[m]} (`{m}`)" for m in not_run) + "; `python -m bench` runs them all.")
    return " ".join(lines)


def failures_section(rows: list[Row]) -> str:
    failed = [r for r in rows if r.passed is False]
    if not failed:
        return "## Targets missed\n\nNone in this run."
    lines = ["## Targets missed", ""]
    for r in failed:
        lines.append(f"- **{r.figure}**: ours {r.ours_median and _fmt(r.ours_median)} vs reference "
                     f"{r.reference_median and _fmt(r.reference_median)} ({r.unit}), ratio "
                     f"{r.ratio and _fmt(r.ratio)}, target {r.target}. Range of the repeats: ours {_spread(r.ours)}, "
                     f"reference {_spread(r.reference)} of the median.")
        if r.figure.startswith("1.") and r.reference and r.ours:
            lines.append("  The range of the repeats on each side is wider than the 2% band the target allows: "
                         "on this machine the noise between runs is larger than the difference being measured "
                         "(see the per-pair ratios below and bench/ANALYSIS.md). What is known to cost is "
                         "accounted for there; figure 1c measures the worker's step path against the bare step "
                         "inside one job, where that noise cancels. Rerun with more `--repeats` on a quiet machine, "
                         "or on a GPU node, where a step is long against the harness's microseconds.")
    return "\n".join(lines)


def write_results(path: Path, *, command: str, info: dict[str, str], settings: Settings, rows: list[Row],
                  details: dict[str, dict], elapsed_s: float, measured: list[str]) -> None:
    machine = "\n".join(f"| {k} | {v} |" for k, v in info.items())
    text = f"""# Benchmark results

The harness against hand-written references, measured side by side in one run of
`{command}` ({elapsed_s:.0f} s). Written whole by `python -m bench` (bench/results.py); rerun it to
refresh this file (see bench/README.md). Ratios are comparable within one run; absolute numbers on
a shared 2-core machine are small and noisy. What the numbers were read to mean, the changes made
to meet the targets and the runs made on their own: bench/ANALYSIS.md.

{measured_section(measured)}

| machine | |
|---|---|
{machine}

Settings: {settings.nproc} ranks x {settings.threads} thread(s) per rank{", each rank pinned to its cores" if settings.pin else ""}, model `{settings.model}`
(seq_len {settings.seq_len}, vocab {settings.vocab_size}), batch {settings.batch_size} per rank,
{settings.steps} steps of which {settings.warmup_steps} warm-up (throughput runs), {settings.repeats}
repeats per side.

## Results

{render_table(rows)}

{failures_section(rows)}

{details_section(rows, details)}

{METHOD}"""
    path.write_text(text)
