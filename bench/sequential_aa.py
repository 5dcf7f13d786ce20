"""False claims under repeated looks, simulated on recorded run-to-run noise (``runs=auto``'s proof).

    python -m bench.sequential_aa --record SWEEP_DIR [SWEEP_DIR ...]   # noise -> tests/data/run_noise.json
    python -m bench.sequential_aa [--sequences 4000] [--seed 1]         # the simulation and its figure

The noise: each recorded sweep's configurations, every run's throughput (and step time p50, peak
memory) divided by its configuration's mean over the sweep's runs: the run-to-run spread of real
sweeps on the machine that ran them, centred so that a draw carries no difference between
configurations. An A/A sequence draws the runs of both sides from that pool (with replacement):
any claimed difference is false.

Each sequence is judged twice on the same draws, as ``runs=auto`` would see them:

* **runs=auto** (launcher/report/sequential.py): looks at the planned schedule (3, 5, 8, 12 runs per
  side), each at its spent alpha; stops at the first decided look, or early where the noise seen
  says runs_max cannot decide it (launcher/report/stats.py, stop_reason);
* **naive re-testing**: the fixed-runs 95% verdict after every run from runs_min to runs_max,
  stopping at the first claim.

Writes outputs/bench/sequential_aa/false_claims.png (false-claim rate by look, both rules) and prints
the table. The fast version of this check is tests/test_sequential.py.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from launcher.report.sequential import Looks, schedule
from launcher.report.stats import METRICS, MIN_EFFECT, Diff, Estimate, difference, runs_needed, stop_reason

ROOT = Path(__file__).resolve().parent.parent
NOISE_FILE = ROOT / "tests" / "data" / "run_noise.json"


# ---- the recorded noise -------------------------------------------------------------------------

def record(sweep_dirs: Sequence[Path], out: Path = NOISE_FILE) -> dict:
    """Each configuration's runs, relative to its mean, from finished sweep directories."""
    configurations: dict[str, dict[str, list[float]]] = {}
    sources = []
    for sweep_dir in sweep_dirs:
        state = json.loads((Path(sweep_dir) / "sweep.json").read_text())
        runs: dict[str, list[dict]] = {}
        foreign = []
        for cell in state["cells"]:
            path = Path(sweep_dir) / "cells" / cell["dirname"] / "result.json"
            if cell["status"] != "done" or not path.exists():
                continue
            summary = json.loads(path.read_text()).get("summary", {})
            name = " ".join(w for w in cell["name"].split() if not w.startswith("run="))
            runs.setdefault(f"{Path(sweep_dir).name}: {name}", []).append(summary)
            if isinstance(summary.get("foreign_cpu_share"), (int, float)):
                foreign.append(summary["foreign_cpu_share"])
        for name, summaries in runs.items():
            if len(summaries) < 3:
                continue
            configurations[name] = {}
            for metric, read in METRICS.items():  # the claimed metrics, read as the report reads them
                values = [v for s in summaries if (v := read({**s, "status": "done"})) is not None]
                if len(values) == len(summaries):
                    mean = statistics.fmean(values)
                    configurations[name][metric] = [round(v / mean, 5) for v in values]
        sources.append({"sweep": str(sweep_dir), "command": " ".join(state.get("argv", [])),
                        "cells": len(state["cells"]), "recorded": datetime.now().isoformat(timespec="seconds"),
                        "foreign_cpu_share_median": round(statistics.median(foreign), 3) if foreign else None})
    data = {"what": "run-to-run noise of real sweeps: every run's figure over its configuration's mean",
            "sources": sources, "configurations": configurations}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def load_noise(path: Path = NOISE_FILE, metric: str = "throughput") -> list[float]:
    """The pooled relative run values of ``metric`` over every recorded configuration."""
    data = json.loads(path.read_text())
    return [v for c in data["configurations"].values() for v in c.get(metric, [])]


def cv(pool: Sequence[float]) -> float:
    return statistics.stdev(pool) / statistics.fmean(pool)


# ---- one A/A sequence, judged two ways ----------------------------------------------------------

def estimate(values: Sequence[float]) -> Estimate:
    n = len(values)
    return Estimate(statistics.fmean(values), statistics.stdev(values) / math.sqrt(n), n - 1, n, "runs", list(values))


@dataclass
class Outcome:
    claimed: bool  # a difference claimed (false: both sides draw from one pool)
    same: bool  # "no change" shown
    runs: int  # runs per side when it stopped
    look: int


def auto(a: Sequence[float], b: Sequence[float], looks: Looks, effect: float) -> Outcome:
    """runs=auto's rule: the planned looks, each at its alpha; no more runs once decided or not
    decidable within runs_max (launcher/decide.py). As the report does, every planned look is still
    judged on the runs there are (a comparison whose runs stopped early keeps being looked at), and
    the first decided look is the verdict."""
    stopped_at: int | None = None  # runs per side when the launcher would stop adding runs
    for look, planned in enumerate(looks.schedule, 1):
        n = min(planned, stopped_at or planned)
        ea, eb = estimate(a[:n]), estimate(b[:n])
        d: Diff = difference(ea, eb, effect, looks.alpha_at(look))
        d.look, d.looks = look, looks.rounds
        if d.decided:
            return Outcome(d.claimed, not d.claimed, n, look)
        d.runs_needed = runs_needed(ea, eb, effect, looks.alpha_at(looks.rounds))
        if stopped_at is None and stop_reason(d, looks):
            stopped_at = n
    return Outcome(False, False, stopped_at or looks.schedule[-1], looks.rounds)


def naive(a: Sequence[float], b: Sequence[float], runs_min: int, runs_max: int, effect: float) -> Outcome:
    """Re-testing at 95% after every run, as if each look were the only one."""
    for n in range(runs_min, runs_max + 1):
        d = difference(estimate(a[:n]), estimate(b[:n]), effect)
        if d.claimed:
            return Outcome(True, False, n, n - runs_min + 1)
    return Outcome(False, False, runs_max, runs_max - runs_min + 1)


@dataclass
class Result:
    sequences: int
    auto_claims: int
    naive_claims: int
    auto_same: int
    auto_runs_mean: float
    auto_claims_by_look: list[int]
    naive_claims_by_run: list[int]

    @property
    def auto_rate(self) -> float:
        return self.auto_claims / self.sequences

    @property
    def naive_rate(self) -> float:
        return self.naive_claims / self.sequences


def simulate(pool: Sequence[float], sequences: int, seed: int, runs_min: int = 3, runs_max: int = 12,
             effect: float = MIN_EFFECT["throughput"], shift: float = 1.0) -> Result:
    """``sequences`` A/A sequences (``shift``: B's runs scaled by it, for power) drawn from ``pool``."""
    rng = random.Random(seed)
    looks = Looks(schedule(runs_min, runs_max))
    by_look = [0] * looks.rounds
    by_run = [0] * (runs_max - runs_min + 1)
    auto_claims = naive_claims = same = 0
    runs = []
    for _ in range(sequences):
        a = [rng.choice(pool) for _ in range(runs_max)]
        b = [rng.choice(pool) * shift for _ in range(runs_max)]
        got = auto(a, b, looks, effect)
        auto_claims += got.claimed
        same += got.same
        runs.append(got.runs)
        if got.claimed:
            by_look[got.look - 1] += 1
        seen = naive(a, b, runs_min, runs_max, effect)
        naive_claims += seen.claimed
        if seen.claimed:
            by_run[seen.look - 1] += 1
    return Result(sequences, auto_claims, naive_claims, same, statistics.fmean(runs), by_look, by_run)


def upper95(k: int, n: int) -> float:
    """The one-sided 95% upper bound of a binomial rate (Clopper-Pearson, by bisection)."""
    from launcher.report.sequential import _betainc

    low, high = k / n, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        # P(X <= k | p = mid) = I_{1-mid}(n - k, k + 1)
        tail = 1.0 if k >= n else _betainc(n - k, k + 1, 1 - mid)
        low, high = (mid, high) if tail > 0.05 else (low, mid)
    return high


def figure(result: Result, runs_min: int, runs_max: int, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    looks = schedule(runs_min, runs_max)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    naive_cum = [sum(result.naive_claims_by_run[:i + 1]) / result.sequences for i in range(len(result.naive_claims_by_run))]
    auto_cum = [sum(result.auto_claims_by_look[:i + 1]) / result.sequences for i in range(len(looks))]
    ax.step(range(runs_min, runs_max + 1), naive_cum, where="post", label="naive: 95% test after every run")
    ax.step(looks, auto_cum, where="post", label="runs=auto: planned looks, alpha spending")
    ax.axhline(0.05, color="grey", ls="--", lw=1, label="5% (the nominal rate)")
    ax.set_xlabel("runs per side")
    ax.set_ylabel("A/A sequences with a false claim so far")
    ax.set_title(f"{result.sequences} A/A sequences on recorded run noise")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sequential_aa", description=__doc__.splitlines()[0])
    p.add_argument("--record", nargs="+", type=Path, help="record the noise of these finished sweep directories")
    p.add_argument("--sequences", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs-min", type=int, default=3)
    p.add_argument("--runs-max", type=int, default=12)
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / "sequential_aa")
    args = p.parse_args(argv)
    if args.record:
        data = record(args.record)
        print(f"recorded {len(data['configurations'])} configuration(s) into {NOISE_FILE}")
        return 0
    pool = load_noise()
    result = simulate(pool, args.sequences, args.seed, args.runs_min, args.runs_max)
    path = figure(result, args.runs_min, args.runs_max, args.out / "false_claims.png")
    print(f"noise: {len(pool)} recorded runs, CV {cv(pool):.1%} ({NOISE_FILE.relative_to(ROOT)})")
    print("| rule | false claims | rate | 95% upper bound | mean runs per side |")
    print("|---|---:|---:|---:|---:|")
    print(f"| runs=auto ({Looks(schedule(args.runs_min, args.runs_max)).text()}) | {result.auto_claims}/"
          f"{result.sequences} | {result.auto_rate:.2%} | {upper95(result.auto_claims, result.sequences):.2%} | "
          f"{result.auto_runs_mean:.1f} |")
    print(f"| naive: 95% after every run, {args.runs_min}..{args.runs_max} | {result.naive_claims}/{result.sequences} | "
          f"{result.naive_rate:.2%} | {upper95(result.naive_claims, result.sequences):.2%} | - |")
    print(f"runs=auto showed \"no change\" in {result.auto_same}/{result.sequences}; figure: {path}")
    return 0 if result.auto_rate <= 0.05 < result.naive_rate else 1


if __name__ == "__main__":
    sys.exit(main())
