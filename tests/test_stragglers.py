"""Stragglers: one rank made slow on purpose is found, and the spread across ranks shows it; ranks that
share one host's cores are not called stragglers (tests/test_metrics.py names one across hosts)."""

import time

import pytest
import torch
from torch import nn

from tests.ranks import make_spec, run_ranks

pytestmark = pytest.mark.slow


class SlowOnOneRank(nn.Module):
    """A tiny token model whose forward sleeps ``sleep_s`` on rank ``slow_rank`` only."""

    def __init__(self, vocab_size: int = 128, d_model: int = 16, slow_rank: int = 1, sleep_s: float = 0.03):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.slow_rank, self.sleep_s = slow_rank, sleep_s

    def forward(self, x):
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == self.slow_rank:
            time.sleep(self.sleep_s)
        return self.head(self.embed(x))


SLOW_MODEL = dict(name="custom", _target_=f"{__name__}.SlowOnOneRank", input="tokens", seq_len=16, vocab_size=128,
                  params={"vocab_size": 128, "slow_rank": 1, "sleep_s": 0.03})


def test_a_slow_rank_is_named_a_straggler(tmp_path):
    spec = make_spec(tmp_path / "slow", model=SLOW_MODEL, steps=8, warmup_steps=2, comm_probe_steps=0)
    spec.cost_per_device_hour = 2.0  # the cluster's price, as the launcher would fill it in
    results = run_ranks(spec, 2, timeout_s=60)
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    result = results[0]
    host = result["rank_hosts"][1]
    assert result["tags"]["slowest_rank"] == f"1 on {host}"
    # Both CPU ranks share this host's cores: the lag is found but not called a straggler, with why.
    assert "straggler_rank" not in result["tags"]
    assert result["tags"]["straggler_withheld"] == "2 CPU ranks share the cores of 1 host(s): a lag between them is not a host's"
    assert result["summary"]["step_time_rank_spread"] > 1.1
    assert len(result["rank_step_time_ms_p50"]) == 2 and len(result["rank_local_step_time_ms_p50"]) == 2
    # Step times are alike on both ranks (the fast one waits in the all-reduce); its own work is not.
    assert result["rank_local_step_time_ms_p50"][1] > 1.1 * result["rank_local_step_time_ms_p50"][0]
    assert result["summary"]["cost_per_1m_samples"] > 0 and result["summary"]["cost_per_1m_tokens"] > 0
