"""Steady state: the warm-up is extended while step times still fall (contract.stats.still_falling)."""

import time

import pytest
from torch import nn

from contract.spec import ConfigError, TrainSpec
from contract.stats import still_falling
from tests.ranks import make_spec, run_ranks


@pytest.mark.parametrize("times, falling", [
    ([5, 4, 3, 2, 1.5, 1.2], True),  # previous median 4, last 1.5
    ([1.0, 1.02, 0.99, 1.01, 1.0, 0.98], False),  # flat within noise
    ([9.0, 1.0, 1.0, 1.0, 1.0, 1.0], False),  # one cold first step is not a trend
    ([1.0, 1.0, 1.0, 1.0, 5.0, 1.0], False),  # one late outlier is ignored by the median
    ([1.2, 1.2, 1.2, 1.0, 1.0, 1.0], True),  # 20% drop
    ([1.05, 1.05, 1.05, 1.0, 1.0, 1.0], False),  # 5%: below the 10% rule
    ([3, 2, 1, 1, 1], False),  # fewer than 2k steps: cannot tell
    ([], False),
])
def test_still_falling_rule(times, falling):
    assert still_falling(times) is falling


def test_warmup_extend_max_is_validated():
    with pytest.raises(ConfigError, match="warmup_extend_max"):
        TrainSpec(warmup_extend_max=-1).validate()
    TrainSpec(warmup_extend_max=0).validate()


class SlowingDown(nn.Module):
    """A token model whose forward sleeps less on every call (``start_s`` x ``decay`` ** calls):
    step times that keep falling through the warm-up."""

    def __init__(self, vocab_size: int = 128, start_s: float = 0.08, decay: float = 0.7):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, vocab_size)
        self.start_s, self.decay, self.calls = start_s, decay, 0

    def forward(self, x):
        time.sleep(self.start_s * self.decay ** self.calls)
        self.calls += 1
        return self.head(self.embed(x))


FALLING = dict(name="custom", _target_=f"{__name__}.SlowingDown", input="tokens", seq_len=16, vocab_size=128,
               params={"vocab_size": 128})


@pytest.mark.slow
def test_a_falling_warmup_is_extended_to_the_cap_and_the_window_keeps_its_length(tmp_path):
    specs = [make_spec(tmp_path / "falling", model=FALLING, steps=10, warmup_steps=6, warmup_extend_max=3,
                       comm_probe_steps=0, local_probe_steps=0),
             make_spec(tmp_path / "flat", steps=10, warmup_steps=6, warmup_extend_max=3, comm_probe_steps=0,
                       local_probe_steps=0)]
    falling, flat = run_ranks(specs, 2, timeout_s=60)
    for results in (falling, flat):
        errors = [r["error"] for r in results if "error" in r]
        assert not errors, errors[0]
    s = falling[0]["summary"]
    assert s["warmup_steps_extended"] == 3 and s["measured_steps"] == 4
    assert len(falling[0]["losses"]) == 13  # 10 steps + 3 extra warm-up steps, every one trained
    assert all(r["summary"]["warmup_steps_extended"] == 3 for r in falling)  # every rank agreed
    # The tiny gpt's step times are flat after a step or two: little or no extension.
    assert flat[0]["summary"]["measured_steps"] == 4
    assert len(flat[0]["losses"]) == 10 + flat[0]["summary"]["warmup_steps_extended"]
