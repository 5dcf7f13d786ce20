"""The fabric probe against a hand-run ``torch.distributed`` timing of the same collective.

    python -m bench.fabric [--runs 3] [--pairs 10] [--ranks 2] [--collective all_reduce] [--out DIR]

Both sides run on gloo over loopback, launched alike (``torchrun --standalone``):

1. **Separate launches**, alternating, ``--runs`` each: the probe (``jobs.fabric.main``, what the
   launcher submits before a sweep's cells) and a plain loop written here without the project's code
   (the same sizes, float32 tensors, one warm-up, ``iters`` back-to-back calls timed with
   ``time.perf_counter`` and averaged over the ranks). Per message size: each side's median over its
   launches with their range, both busbw figures, the probe's fit and cost.
2. **Paired in one job**: the probe's timing of one size (``jobs.fabric.time_collective``) and the
   plain loop's, alternating ``--pairs`` times in the same processes, so that a drift of the machine
   reaches both alike; per size the median of the pairs' ratios, with their range.

Whether the two differ is read against the spread (between launches, between pairs), never one
launch. Run it on an idle machine: it measures this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import TORCHRUN, bench_env, read_result, run_logged, wait_for_quiet


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix="bench-fabric-"))
    probe_runs: list[dict] = []
    hand_runs: list[dict] = []
    for run in range(args.runs):  # alternating: a drift of the machine reaches both sides alike
        probe_runs.append(_launch(work / f"probe-{run}", "probe", args))
        hand_runs.append(_launch(work / f"hand-{run}", "hand", args))
    print(render(args.collective, probe_runs, hand_runs))
    print()
    print(render_pairs(args.collective, _launch(work / "paired", "paired", args)))
    return 0


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fabric", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="independent launches of each side")
    parser.add_argument("--pairs", type=int, default=10, help="alternations of the paired job")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--collective", default="all_reduce", choices=("all_reduce", "all_gather", "reduce_scatter"))
    parser.add_argument("--out", default=None, help="where the launches write (default: a temporary directory)")
    return parser.parse_args(argv)


def _launch(out: Path, side: str, args: argparse.Namespace) -> dict:
    """One torchrun launch of ``side`` on ``args.ranks`` ranks; its rank 0's JSON."""
    out.mkdir(parents=True, exist_ok=True)
    busy = wait_for_quiet(120, print)  # both sides wait alike; the cores others kept busy are shown
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(args.ranks), "-m", "bench.fabric", "--rank-side", side,
           str(out), args.collective, str(args.pairs)]
    proc = run_logged(cmd, out / "log.txt", bench_env(1), check=False)
    return {**json.loads(read_result(out / "result.json", proc)), "busy_cores": busy}


# ---- on each rank ------------------------------------------------------------------------------

def probe_side(out: Path, collective: str) -> None:
    """The probe as the launcher runs it, on this torchrun's ranks (one node)."""
    from contract.fabric import ProbeSpec, plan
    from contract.spec import Layout
    from jobs.fabric import main

    sizes, iters, warmup = plan(gpu=False, full=False)
    ranks = int(os.environ["WORLD_SIZE"])
    result = main(ProbeSpec(out_dir=str(out), layout=Layout(nodes=1, tasks_per_node=ranks, cpus_per_task=1),
                            sizes_bytes=sizes, iters=iters, warmup_iters=warmup))
    if int(os.environ["RANK"]) == 0:
        mine = [p for p in result["points"] if p["collective"] == collective]
        fit = next(f for f in result["fits"] if f["collective"] == collective)
        (out / "result.json").write_text(json.dumps({
            "sizes": [p["size_bytes"] for p in mine], "time_us": [p["time_us"] for p in mine],
            "busbw": [p["busbw_gb_per_s"] for p in mine], "fit": fit, "probe_s": result["probe_s"],
            "job_s": result["job_s"], "iters": iters}))


def hand_time_us(collective: str, size: int, iters: int, warmup: int) -> float:
    """One size of the collective timed by hand: plain torch.distributed, nothing of the project's."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    per_rank = max(1, size // 4 // n)
    whole, part = torch.ones(per_rank * n), torch.ones(per_rank)
    call = {"all_reduce": lambda: dist.all_reduce(whole),
            "all_gather": lambda: dist.all_gather_into_tensor(whole, part),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, whole)}[collective]
    for _ in range(warmup):
        call()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    mine = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(mine)
    return mine.item() / n * 1e6


def hand_side(out: Path, collective: str) -> None:
    """Every size timed by hand, in a process group of this file's own."""
    import torch.distributed as dist

    from contract.fabric import plan

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes, iters, warmup = plan(gpu=False, full=False)  # the sizes only: the timing is hand_time_us's
    times = [hand_time_us(collective, size, iters, warmup) for size in sizes]
    if rank == 0:
        factor = 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n
        sizes_used = [max(1, s // 4 // n) * n * 4 for s in sizes]
        (out / "result.json").write_text(json.dumps({
            "sizes": sizes_used, "time_us": times,
            "busbw": [s / (t / 1e6) / 1e9 * factor for s, t in zip(sizes_used, times, strict=True)]}))
    dist.destroy_process_group()


def paired_side(out: Path, collective: str, pairs: int) -> None:
    """The probe's timing and the hand loop's, alternating in the same processes, size by size."""
    import torch
    import torch.distributed as dist

    from contract.fabric import ProbeSpec, plan
    from contract.spec import Layout
    from jobs.fabric import time_collective

    dist.init_process_group("gloo")
    n = dist.get_world_size()
    sizes, iters, warmup = plan(gpu=False, full=False)
    spec = ProbeSpec(out_dir=str(out), layout=Layout(nodes=1, tasks_per_node=n), sizes_bytes=sizes, iters=iters,
                     warmup_iters=warmup)
    probe = {s: [] for s in sizes}
    hand = {s: [] for s in sizes}
    for _ in range(pairs):
        for size in sizes:
            probe[size].append(time_collective(collective, None, n, size, spec, torch.device("cpu")) * 1e6)
            hand[size].append(hand_time_us(collective, size, iters, warmup))
    if dist.get_rank() == 0:
        (out / "result.json").write_text(json.dumps({"sizes": sizes, "probe": [probe[s] for s in sizes],
                                                     "hand": [hand[s] for s in sizes], "ranks": n}))
    dist.destroy_process_group()


# ---- the table -----------------------------------------------------------------------------------

def render(collective: str, probe_runs: list[dict], hand_runs: list[dict]) -> str:
    """Per size: each side's median over its runs (with min-max), busbw, and probe / hand."""
    lines = [f"{collective}, gloo on loopback, {len(probe_runs)} launches per side (median, min-max):", "",
             "| size B | probe time us | hand time us | probe / hand | probe busbw GB/s | hand busbw GB/s |",
             "|---:|---:|---:|---:|---:|---:|"]
    for i, size in enumerate(probe_runs[0]["sizes"]):
        ours = [r["time_us"][i] for r in probe_runs]
        theirs = [r["time_us"][i] for r in hand_runs]
        lines.append(f"| {size} | {_spread(ours)} | {_spread(theirs)} | "
                     f"{statistics.median(ours) / statistics.median(theirs):.2f} | "
                     f"{statistics.median(r['busbw'][i] for r in probe_runs):.3g} | "
                     f"{statistics.median(r['busbw'][i] for r in hand_runs):.3g} |")
    busy = [r["busy_cores"] for r in (*probe_runs, *hand_runs)]
    fits = [r["fit"] for r in probe_runs]
    lines += ["", f"probe fit (median of runs): alpha {statistics.median(f['latency_us'] for f in fits):.0f} us, "
                  f"beta {statistics.median(f['bandwidth_gb_per_s'] or 0 for f in fits):.3g} GB/s, fit error "
                  f"{statistics.median(f['fit_error'] for f in fits):.0%}",
              f"probe cost: {statistics.median(r['probe_s'] for r in probe_runs):.2f} s of collectives (all three, "
              f"every size, {probe_runs[0]['iters']} iterations) in a "
              f"{statistics.median(r['job_s'] for r in probe_runs):.1f} s job on its ranks",
              f"other processes kept {min(busy):.2f}-{max(busy):.2f} cores busy as the launches started"]
    return "\n".join(lines)


def render_pairs(collective: str, paired: dict) -> str:
    """Per size: both sides' medians over the pairs, and the median of the pairs' ratios with its range."""
    pairs = len(paired["probe"][0])
    lines = [f"{collective}, paired in one job of {paired['ranks']} ranks, {pairs} alternations (median, min-max):",
             "", "| size B | probe time us | hand time us | probe / hand, per pair |", "|---:|---:|---:|---:|"]
    for size, ours, theirs in zip(paired["sizes"], paired["probe"], paired["hand"], strict=True):
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        lines.append(f"| {size} | {_spread(ours)} | {_spread(theirs)} | {_spread(ratios, 2)} |")
    return "\n".join(lines)


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-side":
        side, out, collective, pairs = sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        if side == "paired":
            paired_side(out, collective, pairs)
        else:
            (probe_side if side == "probe" else hand_side)(out, collective)
        sys.stdout.flush()
        os._exit(0)  # skip teardown: gloo may abort in its thread destructors after the result is written
    raise SystemExit(main())
