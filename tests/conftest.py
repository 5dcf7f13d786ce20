import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# Small enough for 2 cores, big enough to exercise every code path of a real run.
# One run per cell: tests that measure noise set runs themselves.
FAST = ["model=gpt_tiny", "model.seq_len=32", "model.vocab_size=256", "batch_size=4", "steps=6", "warmup_steps=2",
        "runs=1"]


@pytest.fixture
def fast_overrides():
    return list(FAST)
