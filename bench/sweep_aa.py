"""False claims between two sweeps, simulated on recorded sweep-to-sweep noise (``--compare``'s proof).

    python -m bench.sweep_aa --record A1 B1 [A2 B2 ...]   # A/A pairs of sweeps -> tests/data/sweep_drift.json
    python -m bench.sweep_aa [--replicates 1000] [--seed 1] [--runs 3 6 12 24]  # the simulation, one line per run count

The noise, both levels recorded on this machine:

* **run to run**: every run's throughput, step time and peak memory over its configuration's mean
  in the recorded pairs' own sweeps (tests/data/sweep_drift.json, "runs"; without them
  tests/data/run_noise.json), drawn run by run (a run's three figures together);
* **sweep to sweep**: for real A/A pairs of default sweeps run one after the other, each
  configuration's log ratio of the two sweeps' means (tests/data/sweep_drift.json, written by
  ``--record``; it holds the pairs' own run noise too, so the drift it shows is if anything too
  large).

An A/A replicate draws a recorded pair's vector of log ratios (all configurations of one pair
together, as the machine moved them together; A and B swapped at random), applies it to B's
means, and draws ``runs`` runs per configuration and side from the run-to-run pool. Both sweeps
measure the same four configurations, so any claim is false. The comparison is ``--compare``'s own
(launcher/report/compare.py): Bonferroni over its rows, the drift between sweeps in the noise
(launcher/report/stats.py, sweep_drift) pooled from the default allowance and the drift kept from
the *other* recorded pairs (leave-one-out, as a later comparison sees a record that does not hold
it), and from the default allowance alone (no record). The slowdown replicate multiplies B's
throughput by SINGLE_CORE (every rank on one core: -40% to -48%, docs/deciding.md) in one
configuration that the replayed pair left unflagged (a flagged one is never claimed), on top of
the pair's shift, and counts it caught when that configuration's throughput is called a regression.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.report import compare, noisefloor
from launcher.report.collect import collect
from launcher.report.stats import Drift
from launcher.state import SweepState

ROOT = Path(__file__).resolve().parent.parent
RUN_NOISE = ROOT / "tests" / "data" / "run_noise.json"
DRIFT_DATA = ROOT / "tests" / "data" / "sweep_drift.json"
CONFIGURATIONS = [("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)]
# Means of the default sweep on this machine (docs/deciding.md); only their ratios matter here.
MEANS = {("ddp", 1): (118.6, 67.8, 0.45), ("ddp", 2): (127.8, 125.9, 0.48), ("fsdp", 1): (93.7, 86.6, 0.43),
         ("fsdp", 2): (86.2, 189.0, 0.43)}
METRICS = ("throughput", "step_time", "peak_memory")
SINGLE_CORE = 0.6  # throughput factor of every rank on one core (docs/deciding.md: -40% to -48%)
# The runs per side at which the simulation shows the slowdown caught (docs/deciding.md: the rates at 3..24).
CAUGHT_AT = 24


def record(pairs: Sequence[tuple[Path, Path]], out: Path = DRIFT_DATA) -> dict[str, Any]:
    """Each A/A pair's per-configuration log ratios of the means (B over A), and what their runs explain."""
    recorded, runs = [], []
    for a, b in pairs:
        rows_a, rows_b = collect(SweepState.load(a)), collect(SweepState.load(b))
        runs += _relative_runs(rows_a) + _relative_runs(rows_b)
        result = compare.compare(rows_a, rows_b)
        entry: dict[str, Any] = {"a": str(a), "b": str(b), "configurations": {}, "not_compared": [
            f"{m.name}: {m.why_not}" for m in result.not_compared]}
        for m in result.matches:
            if m.caveat:  # kept: the recorded noise of this machine is what the rule must hold against
                entry.setdefault("flagged", []).append(f"{m.name}: {m.caveat}")
            plain = [{k: v for k, v in row.items() if k != "interference"} for row in (m.a, m.b)]
            plain = [{**r, "_members": [{k: v for k, v in x.items() if k != "interference"}
                                        for x in r.get("_members", [r])]} for r in plain]
            entry["configurations"][m.name] = {
                e["metric"]: {"d": math.copysign(math.sqrt(e["d2"]), _sign(m, e["metric"])), "within": e["within"]}
                for e in noisefloor.drift_entries([(plain[0], plain[1])])}
        recorded.append(entry)
    data = {"what": "sweep-to-sweep noise: A/A pairs of default sweeps run one after the other; per configuration "
                    "and metric the log ratio d of the two sweeps' means and the part their runs explain",
            "pairs": recorded, "runs": runs}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def _relative_runs(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Every run's three figures over its configuration's mean in its sweep (runs flagged for
    interference left out, as every claim leaves them out)."""
    from launcher.report.rows import grouped
    from launcher.report.stats import estimate, run_values

    out = []
    for unit in grouped(rows):
        members = list(unit.get("_members", [unit]))  # flagged runs too: the machine's noise as it was
        values = {metric: run_values({"_members": members}, metric) for metric in METRICS}
        means = {metric: (e.mean if (e := estimate({"_members": members}, metric)) else 0.0) for metric in METRICS}
        if all(means.values()) and len({len(v) for v in values.values()}) == 1:
            out += [{metric: values[metric][i] / means[metric] for metric in METRICS}
                    for i in range(len(values["throughput"]))]
    return out


def _sign(m: compare.Match, metric: str) -> float:
    from launcher.report.stats import estimate

    ea, eb = estimate(m.a, metric), estimate(m.b, metric)
    return 1.0 if ea is None or eb is None or eb.mean >= ea.mean else -1.0


def _pool(path: Path = RUN_NOISE) -> list[dict[str, float]]:
    """Recorded runs, each its three relative figures together."""
    data = json.loads(path.read_text())
    runs = []
    for c in data["configurations"].values():
        for i in range(len(c["throughput"])):
            runs.append({m: c[m][i] for m in METRICS if m in c and i < len(c[m])})
    return [r for r in runs if len(r) == len(METRICS)]


def _flagged(pair: dict[str, Any]) -> set[str]:
    return {str(f).split(":")[0] for f in pair.get("flagged", [])}


def _drift(pairs: list[dict[str, Any]], key: str = "local:vm") -> Drift | None:
    """The drift a comparison would judge against, from these recorded pairs (as noisefloor keeps it:
    configurations flagged for interference left out)."""
    entries = [{"metric": metric, "d2": v["d"] ** 2, "within": v["within"]}
               for p in pairs for name, c in p["configurations"].items() if name not in _flagged(p)
               for metric, v in c.items()]
    left: dict[str, list[float]] = {}
    for e in entries:
        left.setdefault(e["metric"], []).append(e["d2"] - e["within"])
    if not left:
        return None
    return Drift({m: math.sqrt(max(0.0, sum(v) / len(v))) for m, v in left.items()},
                 min(len(v) for v in left.values()), f"{key}, {len(pairs)} recorded pair(s)")


def _rows(rng: random.Random, pool: list[dict[str, float]], shift: dict[str, dict[str, float]], runs: int,
          factor: dict[str, float] | None = None, flagged: set[str] | None = None) -> list[dict[str, Any]]:
    """One sweep of the four configurations, ``runs`` runs each drawn from the pool, its means moved
    by ``shift`` (log ratios per configuration and metric) and its speed by ``factor`` (per
    configuration: a slowdown multiplies throughput and divides step time)."""
    rows = []
    for strategy, nodes in CONFIGURATIONS:
        name = f"strategy={strategy} nodes={nodes}"
        tp, step, peak = MEANS[(strategy, nodes)]
        moved = {m: math.exp(shift.get(name, {}).get(m, 0.0)) for m in METRICS}
        slow = (factor or {}).get(name, 1.0)
        for run in range(1, runs + 1):
            r = rng.choice(pool)
            rows.append({"cell": f"{name} run={run}", "strategy": strategy, "precision": "fp32", "model": "gpt_tiny",
                         "nodes": nodes, "world_size": nodes, "status": "done",
                         "settings": {"strategy": strategy, "nodes": str(nodes)},
                         "throughput_samples_per_s": tp * moved["throughput"] * r["throughput"] * slow,
                         "throughput_samples_per_s_per_device": tp * moved["throughput"] * r["throughput"] * slow
                         / nodes,
                         "step_time_ms_p50": step * moved["step_time"] * r["step_time"] / slow,
                         "peak_mem_allocated_gib": peak * moved["peak_memory"] * r["peak_memory"],
                         **({"interference": "flagged in the recorded pair"} if name in (flagged or set()) else {})})
    return rows


def simulate(replicates: int, seed: int, runs: int = 3, data: dict[str, Any] | None = None,
             pool: list[dict[str, float]] | None = None, slowdown: bool = True) -> dict[str, float]:
    """Rates over ``replicates`` at ``runs`` runs per side: A/A comparisons with any false claim, with
    the drift recorded from the other pairs (leave-one-out) and without any record (the default
    allowance alone); and how often a slowdown of one configuration (throughput x SINGLE_CORE, on a
    configuration the replayed pair did not flag) is called a regression, with and without the record."""
    data = data or json.loads(DRIFT_DATA.read_text())
    pool = pool or data.get("runs") or _pool()  # the recorded pairs' own runs, else the older record
    pairs = [p for p in data["pairs"] if p["configurations"]]
    rng = random.Random(seed)
    claimed_drift = claimed_none = caught_drift = caught_none = slowed = 0
    for _ in range(replicates):
        i = rng.randrange(len(pairs))
        sign = rng.choice((1.0, -1.0))
        shift = {name: {m: sign * v["d"] for m, v in c.items()} for name, c in pairs[i]["configurations"].items()}
        drift = _drift(pairs[:i] + pairs[i + 1:]) if len(pairs) > 1 else None
        # The recorded pair's flags come with its shifts: a configuration another job slowed in that pair
        # is flagged here too, and not claimed (as --compare leaves it).
        flagged = _flagged(pairs[i])
        a, b = _rows(rng, pool, {}, runs), _rows(rng, pool, shift, runs, flagged=flagged)
        claimed_drift += bool(_claims(compare.compare(a, b, drift=drift)))
        claimed_none += bool(_claims(compare.compare(a, b)))
        # The slowdown on one configuration the pair left unflagged (a flagged one is never claimed).
        plain = sorted(set(shift) - flagged)
        if plain and slowdown:
            target = rng.choice(plain)
            slow = _rows(rng, pool, shift, runs, {target: SINGLE_CORE}, flagged)
            slowed += 1
            caught_drift += _regression(compare.compare(a, slow, drift=drift), target)
            caught_none += _regression(compare.compare(a, slow), target)
    return {"runs": runs, "aa_false_with_drift": claimed_drift / replicates,
            "aa_false_without_drift": claimed_none / replicates,
            "slowdown_caught_with_drift": caught_drift / max(1, slowed),
            "slowdown_caught_without_drift": caught_none / max(1, slowed), "slowdown_replicates": slowed,
            "replicates": replicates, "pairs": len(pairs)}


def _regression(result: compare.Comparison, name: str) -> bool:
    """The slowed configuration's throughput called a regression."""
    return any(d.verdict == compare.REGRESSION for m in result.matches if m.name == name for d in m.deltas
               if d.metric == "samples/s")


def _claims(result: compare.Comparison) -> list[compare.Delta]:
    return [d for m in result.matches for d in m.deltas if d.verdict in (compare.IMPROVEMENT, compare.REGRESSION)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sweep_aa", description=__doc__.splitlines()[0])
    p.add_argument("--record", nargs="+", metavar="SWEEP", help="A/A pairs of sweep directories: A1 B1 A2 B2 ...")
    p.add_argument("--replicates", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, nargs="+", default=[3, 6, 12, CAUGHT_AT], help="runs per side, one line each")
    args = p.parse_args(argv)
    if args.record:
        if len(args.record) % 2:
            print("error: --record takes pairs of sweep directories (A1 B1 A2 B2 ...).", file=sys.stderr)
            return 2
        found = record([(Path(a), Path(b)) for a, b in zip(args.record[::2], args.record[1::2], strict=True)])
        for pair in found["pairs"]:
            ds = [f"{v['throughput']['d']:+.3f}" for v in pair["configurations"].values() if "throughput" in v]
            print(f"{Path(pair['a']).name} -> {Path(pair['b']).name}: throughput log ratios {' '.join(ds)}; "
                  f"not compared: {pair['not_compared'] or 'none'}")
        return 0
    print("| runs per side | A/A any false claim, drift record | no record | slowdown caught, drift record | no record |")
    print("|---:|---:|---:|---:|---:|")
    for runs in args.runs:
        r = simulate(args.replicates, args.seed, runs)
        print(f"| {runs} | {r['aa_false_with_drift']:.1%} | {r['aa_false_without_drift']:.1%} | "
              f"{r['slowdown_caught_with_drift']:.1%} | {r['slowdown_caught_without_drift']:.1%} |", flush=True)
    print(f"({args.replicates} A/A replicates per line, seed {args.seed}; the slowdown x{SINGLE_CORE} in "
          f"{r['slowdown_replicates']} of them, those whose pair has an unflagged configuration)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
