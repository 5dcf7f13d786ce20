"""How soon ``runs=auto`` decides a real difference under four schedules, simulated: growing by 1.5 or
doubling up to 12 runs (a cluster's runs_max), and up to 6 (one machine with CPU ranks).

    python -m bench.schedules [--sequences 4000] [--seed 1] [--ratio 0.77]

The main job's question (fsdp against ddp at two ranks, about 23% slower on this machine): each
sequence draws every run of both sides with a log-normal run-to-run spread, and judges them as
runs=auto does (bench/sequential_aa.py's ``auto``: the planned looks at their levels, stopping once
decided or once runs_max cannot decide it).
Printed per spread and schedule: how often it is decided, how often by 6 runs per side (the default
grid then needs at most 18 launches: 12 in the first round, the rest at two ranks), and the mean
launches. docs/deciding.md ("Why runs double each round") quotes the table.
"""

from __future__ import annotations

import argparse
import math
import random

from bench.sequential_aa import auto
from launcher.report.sequential import Looks
from launcher.report.stats import MIN_EFFECT

FIRST_ROUND = 12  # the default grid's first round: 4 configurations x runs_min 3
GROWING = 2  # configurations that gain runs: the two at two ranks


def runs_per_side(schedule: tuple[int, ...], spread: float, ratio: float, rng: random.Random) -> tuple[bool, int]:
    """One sequence judged by runs=auto's own rule (bench/sequential_aa.py, ``auto``: the planned
    looks, stopping once decided or once runs_max cannot decide it): (claimed, runs per side then)."""
    a = [ratio * math.exp(rng.gauss(0, spread)) for _ in range(schedule[-1])]
    b = [math.exp(rng.gauss(0, spread)) for _ in range(schedule[-1])]
    got = auto(a, b, Looks(schedule), MIN_EFFECT["throughput"])
    return got.claimed, got.runs


def launches(schedule: tuple[int, ...], runs: int) -> int:
    return FIRST_ROUND + GROWING * (runs - schedule[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.schedules", description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ratio", type=float, default=0.77, help="the slower side's mean over the faster's")
    args = p.parse_args(argv)
    print("| spread per run | schedule | decided | by 6 runs per side (at most 18 launches) | mean launches |")
    print("|---:|---|---:|---:|---:|")
    for spread in (0.08, 0.10, 0.12):
        for schedule in ((3, 5, 8, 12), (3, 6, 12), (3, 6), (3, 4, 6)):
            rng = random.Random(args.seed)
            ends = [runs_per_side(schedule, spread, args.ratio, rng) for _ in range(args.sequences)]
            decided = sum(1 for claimed, _ in ends if claimed) / len(ends)
            early = sum(1 for claimed, n in ends if claimed and launches(schedule, n) <= 18) / len(ends)
            mean = sum(launches(schedule, n) for _, n in ends) / len(ends)
            print(f"| {spread:.0%} | {', '.join(map(str, schedule))} | {decided:.1%} | {early:.0%} | {mean:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
