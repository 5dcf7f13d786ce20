"""Figure 1c: the worker's step path against the bare step, paired blocks inside one torchrun job.

Figure 1 compares separate jobs; this one alternates blocks of steps of both sides inside the same
processes (bench/paired_steps.py), so the machine's drift between runs cancels out and what is
left is what the worker's step path itself costs: its wrappers, ``Trainer.step``, per-step timing
and history, the heartbeat and the stop-request agreement.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from bench.common import PYTHON, REPO, TORCHRUN, Row, Settings, bench_env, read_result, run_logged, wait_for_quiet
from bench.throughput import THROUGHPUT_TARGET

BLOCK_STEPS = 5


def pair_ratios(ranks: list[dict[str, list[float]]]) -> list[float]:
    """Bare block time / our block time for each pair of neighbouring blocks, each block's time
    being its slowest rank's (a synchronous step ends when the last rank ends it)."""
    ours = [max(r["ours_block_s"][i] for r in ranks) for i in range(len(ranks[0]["ours_block_s"]))]
    bare = [max(r["bare_block_s"][i] for r in ranks) for i in range(len(ranks[0]["bare_block_s"]))]
    return [b / o for b, o in zip(bare, ours, strict=True)]


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    work = settings.work / "paired"
    work.mkdir(parents=True, exist_ok=True)
    env = bench_env(settings.threads, {"BENCH_THREADS_PER_RANK": str(settings.threads)})
    launch = [TORCHRUN, "--standalone", "--nproc-per-node", str(settings.nproc)]
    if settings.pin:
        launch += ["--no-python", str(REPO / "bench" / "pin_rank.sh"), PYTHON]
    blocks = 4 * settings.repeats
    rows, details = [], {}
    for strategy in ("ddp", "fsdp"):
        wait_for_quiet(settings.quiet_wait_s, log)
        out = work / f"paired-{strategy}.json"
        proc = run_logged([*launch, str(REPO / "bench" / "paired_steps.py"), "--strategy", strategy, "--out", str(out),
                           "--model", settings.model, "--seq-len", str(settings.seq_len),
                           "--vocab-size", str(settings.vocab_size), "--batch-size", str(settings.batch_size),
                           "--blocks", str(blocks), "--block-steps", str(BLOCK_STEPS),
                           "--warmup-steps", str(settings.warmup_steps)],
                          work / f"paired-{strategy}.log", env, check=False)
        result = json.loads(read_result(out, proc))
        ratios = pair_ratios(result["ranks"])
        ratio = statistics.median(ratios)
        log(f"  {strategy}: {blocks} pairs of {BLOCK_STEPS}-step blocks, median ratio {ratio:.3f}")
        rows.append(Row(
            figure=f"1c. throughput, paired blocks in one job, {strategy.upper()}: the worker's step path "
                   f"(wrappers, Trainer, schedule, heartbeat, stop agreement) vs the bare step, {BLOCK_STEPS}-step "
                   f"blocks alternating ABBA",
            unit="ratio (bare time / ours)", ours=ratios, reference=[], target=f">= {THROUGHPUT_TARGET}",
            passed=ratio >= THROUGHPUT_TARGET, ratio=ratio))
        details[f"{strategy}_paired"] = {"pair_ratios": ratios, "raw": result["ranks"]}
    return rows, details


if __name__ == "__main__":
    from bench.common import render_table

    rows, _ = run(Settings(repeats=4), print)
    print(render_table(rows))
