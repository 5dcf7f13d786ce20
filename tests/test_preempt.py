"""Stop-request agreement on a real one-process gloo group: a signal is acted on at a step boundary
within about two agreement intervals, never in the middle of a step, and the handlers come back."""

import os
import signal
import time

import pytest
import torch.distributed as dist

from jobs.dist import free_port
from jobs.preempt import CHECK_INTERVAL_S, NONE, TERM, USR2, StopRequests


@pytest.fixture
def group():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def _steps_until_stop(stops: StopRequests, step_s: float, limit: int) -> tuple[int, int]:
    for step in range(limit):
        time.sleep(step_s)  # the step
        request = stops.agreed()
        if request:
            return step, request
    return limit, NONE


def test_usr2_is_agreed_within_two_intervals_at_a_step_boundary(group):
    before = signal.getsignal(signal.SIGUSR2)
    stops = StopRequests(group)
    try:
        assert _steps_until_stop(stops, 0.01, 20) == (20, NONE)  # nothing received: never stops
        os.kill(os.getpid(), signal.SIGUSR2)  # recorded by the handler, not acted on mid-step
        assert stops.received == USR2
        t0 = time.monotonic()
        _, request = _steps_until_stop(stops, 0.01, 2000)
        assert request == USR2
        assert time.monotonic() - t0 < 2 * CHECK_INTERVAL_S + 0.5
        stops.finish()
    finally:
        stops.restore()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_agreement_rounds_are_about_a_second_apart_and_sigterm_is_agreed(group):
    stops = StopRequests(group)
    try:
        rounds = 0
        original = dist.all_reduce

        def counting(*args, **kwargs):
            nonlocal rounds
            rounds += 1
            return original(*args, **kwargs)

        dist.all_reduce = counting
        try:
            t0 = time.monotonic()
            _steps_until_stop(stops, 0.005, 400)  # ~2 s of 5 ms steps
            elapsed_s = time.monotonic() - t0
        finally:
            dist.all_reduce = original
        # One round per CHECK_INTERVAL_S, not one per step (400 steps).
        assert rounds <= elapsed_s / CHECK_INTERVAL_S + 3, rounds
        os.kill(os.getpid(), signal.SIGTERM)  # requeue or cancel by Slurm: save and exit, no requeue of our own
        assert _steps_until_stop(stops, 0.01, 2000)[1] == TERM
    finally:
        stops.restore()


def test_a_sigterm_after_a_preemption_warning_still_gets_its_checkpoint_and_a_second_one_ends_the_rank(group):
    # Slurm's USR2 warning, then its SIGTERM: one SIGTERM, acted on at a step boundary like any.
    import subprocess
    import sys

    code = """
import os, signal, sys, time
import torch.distributed as dist
from jobs.dist import free_port
from jobs.preempt import StopRequests, USR2
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
stops = StopRequests(dist.new_group(backend="gloo"))
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGTERM)
print("alive after one SIGTERM", stops.received == USR2, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("alive after two")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "alive after one SIGTERM True" in proc.stdout and "alive after two" not in proc.stdout
    assert proc.returncode == -signal.SIGTERM
