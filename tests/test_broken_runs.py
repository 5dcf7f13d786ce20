"""Broken runs are not results: a non-finite loss, a loss that never moves, or a window of skipped
fp16 steps fails the cell with a class and the fix (jobs/brokenrun.py), on real ranks through the
launcher, and it is left out of the findings, the recommendation and --compare."""

from __future__ import annotations

import math

import pytest
import torch

from jobs.brokenrun import DIVERGED, LOSS_FROZEN, STEPS_SKIPPED, inspect
from launcher.cluster.failures import FIXES
from launcher.report.rows import throughput
from tests.stores import existing_store


class NanInitLM(torch.nn.Module):
    """A user's token model whose constructor leaves one weight unset: NaN, as memory left
    uninitialised may hold; every loss it produces is NaN."""

    def __init__(self, vocab_size: int = 64, nan: bool = True):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)
        if nan:
            with torch.no_grad():
                self.head.weight.fill_(float("nan"))

    def forward(self, x):
        return self.head(self.embed(x))


def test_inspect_names_each_kind_of_broken_run():
    warm, window = [False, False], [True, True, True, True]
    assert inspect([2.0, 1.9, 1.8, 1.7, 1.6, 1.5], warm + window) is None
    nan = inspect([2.0, float("nan"), 1.8, 1.7, 1.6, 1.5], warm + window)
    assert nan is not None and nan.failure_class == DIVERGED and "step 1 (warm-up)" in nan.detail
    inf = inspect([2.0, 1.9, 1.8, math.inf, 1.6, 1.5], warm + window)
    assert inf is not None and inf.failure_class == DIVERGED and "measured window" in inf.detail
    frozen = inspect([2.0, 1.9, 1.5, 1.5, 1.5, 1.5], warm + window)
    assert frozen is not None and frozen.failure_class == LOSS_FROZEN
    skipped = inspect([2.0, 1.9, 1.8, 1.7, 1.6, 1.5], warm + window, [False, False, True, True, True, False])
    assert skipped is not None and skipped.failure_class == STEPS_SKIPPED and "3 of the 4" in skipped.detail
    assert inspect([2.0, 1.9, 1.8, 1.7, 1.6, 1.5], warm + window, [True, True, True, False, False, False]) is None


def test_a_row_with_a_non_finite_loss_is_no_result():
    assert throughput({"throughput_samples_per_s": 10.0, "loss_first": 2.0, "loss_last": 1.0}) == 10.0
    assert throughput({"throughput_samples_per_s": 10.0, "loss_first": float("nan"), "loss_last": 1.0}) is None


@pytest.mark.slow
def test_nan_loss_cell_fails_as_diverged_and_is_left_out(tmp_path, fast_overrides, capsys):
    """Two ranks of a model whose first loss is NaN, beside a healthy cell: the NaN cell is failed
    (diverged) in sweep.json, status, the report and MLflow, and nothing is claimed or recommended
    about it; the healthy cell is done."""
    from mlflow.tracking import MlflowClient

    from launcher.__main__ import main
    from launcher.commands import status
    from launcher.state import SweepState

    existing_store(tmp_path)
    code = main(["-m", *fast_overrides, "model=custom", f"model.target={__name__}.NanInitLM",
                 "model.input=tokens", "model.seq_len=8", "model.vocab_size=64", "+model.params.vocab_size=64",
                 "+model.params.nan=true,false",
                 "cluster.tasks_per_node=2", "runs=1", f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 1
    state = SweepState.load(tmp_path / "sweep")
    broken, healthy = (next(c for c in state.cells if f"nan={flag}" in c.name) for flag in ("True", "False"))
    assert healthy.status == "done", healthy.error
    assert broken.status == "failed" and broken.failure_class == DIVERGED, (broken.status, broken.error)
    assert "loss is nan at step 0 (warm-up)" in broken.error
    assert not (state.cell_dir(broken) / "result.json").exists()
    run = MlflowClient(tracking_uri=state.tracking_uri).get_run(broken.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_class"] == DIVERGED
    md = (tmp_path / "sweep" / "report.md").read_text()
    assert f"| {DIVERGED} |" in md and FIXES[DIVERGED][:40] in md
    findings = md.split("## Findings", 1)[1].split("## Results", 1)[0]
    assert "Left out (no result)" in findings and "nan=True" in findings.split("### Recommendation")[0]
    assert "nan=True" not in findings.split("### Recommendation", 1)[1]
    capsys.readouterr()
    assert status.main([str(tmp_path / "sweep")]) == 1
    out = capsys.readouterr().out
    assert "failed" in out and f"{DIVERGED}: the loss was NaN" in out
