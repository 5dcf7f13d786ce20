import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# Small enough for 2 cores, big enough to exercise every code path of a real run.
# One run per cell: tests that measure noise set runs themselves. No fabric probe: it is a job of its
# own before the cells (seconds per 2-rank sweep), tested in tests/test_fabric.py. No probes after
# the window either (the profiled steps of the step's anatomy and communication, and the per-rank
# straggler steps: about 0.5 to 1 s of a launch at this size, most of it the profiler's start and
# its events); the tests that read what they measure launch with PROBED.
FAST = ["model=gpt_tiny", "model.seq_len=32", "model.vocab_size=256", "batch_size=4", "steps=6", "warmup_steps=2",
        "runs=1", "fabric.probe=off", "comm_probe_steps=0", "local_probe_steps=0"]
PROBED = [o for o in FAST if o.split("=", 1)[0] not in ("comm_probe_steps", "local_probe_steps")]


@pytest.fixture
def fast_overrides():
    return list(FAST)


CHECKOUT_OUTPUTS = Path(__file__).resolve().parent.parent / "outputs"


@pytest.fixture(autouse=True)
def leaves_no_outputs_in_the_checkout():
    """A test writes under its tmp_path: the launcher's default output_root (outputs/ in the checkout)
    is the user's. Catches, e.g., a read-only lookup that creates an empty MLflow store there."""
    existed = CHECKOUT_OUTPUTS.exists()
    yield
    if not existed and CHECKOUT_OUTPUTS.exists():
        created = sorted(str(p.relative_to(CHECKOUT_OUTPUTS)) for p in CHECKOUT_OUTPUTS.rglob("*"))
        pytest.fail(f"this test created {CHECKOUT_OUTPUTS} ({', '.join(created) or 'empty'}): give it output_root "
                    f"under tmp_path")
