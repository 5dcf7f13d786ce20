"""The proof of the claims, on real runs through the launcher: an A/A comparison (the same
configuration against itself) claims nothing, and a real slowdown is called a regression.

One sweep launches one configuration 6 times. Every split of those 6 independent runs into two
halves of 3 is an A/A comparison; over the 10 splits and their metrics the rate of false claims
must stay at or below 5%. A second sweep of 5 runs whose forward sleeps for the baseline's step
time (throughput halved) must be a regression. The verdicts are checked against
benchstat's rule on the same numbers (Mann-Whitney U, p < 0.05 for a difference, else "~")."""

from __future__ import annotations

import itertools
import math
import statistics
import time

import pytest
import torch

from launcher.report import compare, report
from launcher.report.__main__ import main as report_main
from launcher.state import SweepState

pytestmark = pytest.mark.slow


class PacedLM(torch.nn.Module):
    """A small token model whose forward also sleeps ``delay_ms``: a slowdown of known size. Its
    step (~20-40 ms here) is long enough that the scheduler's jitter does not dominate it."""

    def __init__(self, vocab_size: int = 1024, width: int = 256, delay_ms: float = 0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.body = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
        self.head = torch.nn.Linear(width, vocab_size)
        self.delay_s = delay_ms / 1e3

    def forward(self, x):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.head(self.body(self.embed(x)))


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Exact two-sided Mann-Whitney U p-value (no ties), by enumerating every assignment of ranks."""
    pooled = sorted(a + b)
    ranks = {v: i + 1 for i, v in enumerate(pooled)}
    n, m = len(a), len(b)
    u = sum(ranks[v] for v in a) - n * (n + 1) / 2
    us = [sum(c) - n * (n + 1) / 2 for c in itertools.combinations(range(1, n + m + 1), n)]
    centre = n * m / 2
    return sum(1 for x in us if abs(x - centre) >= abs(u - centre)) / len(us)


def sweep(tmp_path, name: str, runs: int, delay_ms: float, fast_overrides) -> list[dict]:
    from launcher.__main__ import main

    overrides = [o for o in fast_overrides if not o.startswith(("model", "runs=", "steps=", "warmup_steps=", "batch_size="))]
    code = main(["-m", *overrides, "model=custom", f"model._target_={__name__}.PacedLM", "model.input=tokens",
                 "model.seq_len=64", "model.vocab_size=1024", "+model.params.vocab_size=1024", "batch_size=8",
                 f"+model.params.delay_ms={delay_ms}", "steps=12", "warmup_steps=4", "repeats=2",
                 "comm_probe_steps=0", "local_probe_steps=0", f"runs={runs}", "tracking=off",
                 f"output_root={tmp_path}", f"sweep_dir={tmp_path / name}"])
    assert code == 0
    rows = report.collect(SweepState.load(tmp_path / name))
    assert len(rows) == runs and all(r["status"] == "done" for r in rows)
    for r in rows:  # one configuration: the A/A halves and the slowed sweep match by name
        r["settings"] = {k: v for k, v in r["settings"].items() if "delay_ms" not in k}
    return rows


def claims(result: compare.Comparison) -> list[compare.Delta]:
    return [d for m in result.matches for d in m.deltas if d.verdict in (compare.IMPROVEMENT, compare.REGRESSION)]


def test_aa_claims_nothing_and_a_real_slowdown_is_a_regression(tmp_path, fast_overrides, capsys):
    base = sweep(tmp_path, "a", 6, 0.0, fast_overrides)
    # A/A: every split of the 6 independent runs into 3 + 3.
    splits = [set(c) for c in itertools.combinations(range(6), 3) if 0 in c]
    rows_judged, false_claims, agree = 0, 0, 0
    for first in splits:
        a = [r for i, r in enumerate(base) if i in first]
        b = [r for i, r in enumerate(base) if i not in first]
        result = compare.compare(a, b)
        (match,) = result.matches
        rows_judged += len(match.deltas)
        false_claims += len(claims(result))
        tp = next(d for d in match.deltas if d.metric == "samples/s")
        benchstat_differs = mann_whitney_p([r["throughput_samples_per_s"] for r in a],
                                           [r["throughput_samples_per_s"] for r in b]) < 0.05
        agree += (tp.verdict in (compare.IMPROVEMENT, compare.REGRESSION)) == benchstat_differs
    print(f"A/A: {false_claims} claim(s) in {rows_judged} rows over {len(splits)} splits; "
          f"benchstat's rule agrees on {agree}/{len(splits)} throughput verdicts")
    assert len(splits) == 10 and false_claims <= 0.05 * rows_judged
    # With 3 + 3 runs Mann-Whitney cannot reach p < 0.05 (its smallest p is 0.1): benchstat says "~" to
    # every split, and the two disagree exactly where a false claim was made.
    assert agree >= len(splits) - false_claims

    # Power: the baseline's step time slept in every forward: half the throughput.
    step_ms = statistics.median(r["step_time_ms_p50"] for r in base)
    slow = sweep(tmp_path, "b", 5, step_ms, fast_overrides)
    result = compare.compare(base, slow)
    verdicts = {d.metric: d for m in result.matches for d in m.deltas}
    print(compare.render(result, "6 runs", f"5 runs sleeping {step_ms:.1f} ms per forward"))
    assert verdicts["samples/s"].verdict == compare.REGRESSION, verdicts["samples/s"]
    # The median step is judged by its own spread: a regression, or inconclusive on a busy machine; never
    # "no change" or an improvement.
    assert verdicts["step p50 ms"].verdict in (compare.REGRESSION, compare.UNDECIDED), verdicts["step p50 ms"]
    assert math.isclose(verdicts["samples/s"].change, 1 / 2 - 1, abs_tol=0.2)
    p = mann_whitney_p([r["throughput_samples_per_s"] for r in base], [r["throughput_samples_per_s"] for r in slow])
    assert p < 0.05, p  # benchstat's rule calls it a difference as well
    assert result.regressions() and report_main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    capsys.readouterr()
