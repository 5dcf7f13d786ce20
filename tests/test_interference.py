"""Other processes on the job's cores and GPUs: /proc/stat parsing and the share on literal input,
the NVML sampler on a stateful fake, real gloo runs with and without a CPU burner beside them, and a
launcher sweep whose cell is flagged co-located."""

import os
import subprocess
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from jobs.interference import GpuSampler, parse_proc_stat
from jobs.summary import foreign_cpu_share
from tests.ranks import make_spec, run_ranks

PROC_STAT = """cpu  289564 0 43328 156314 1609 0 1145 1720 0 0
cpu0 134736 0 19978 90441 256 0 564 844 0 0
cpu1 154827 0 23349 65872 1352 0 581 875 0 0
intr 2656762 0 0 0
ctxt 9934521
"""


def test_proc_stat_busy_ticks_leave_out_idle_and_iowait():
    busy = parse_proc_stat(PROC_STAT)
    assert busy == {0: 134736 + 19978 + 564 + 844, 1: 154827 + 23349 + 581 + 875}


def window(host, cpus, busy, own_s, window_s=1.0):
    return {"host": host, "cpus": cpus, "ticks_per_s": 100, "window_s": window_s,
            "busy_ticks_delta": busy, "own_cpu_delta_s": own_s}


def test_foreign_share_per_host_over_the_union_of_affinity_sets():
    # Host a: ranks on cpu 0 and cpu 1, both cores busy the whole second, ranks used 1.5 s:
    # 0.5 s of 2 core-seconds was someone else's. Cpu 2 is outside the job's cores and ignored.
    a = [window("a", [0], {0: 100, 1: 100, 2: 100}, 0.8), window("a", [1], {0: 100, 1: 100, 2: 100}, 0.7)]
    b = [window("b", [0, 1], {0: 50, 1: 0}, 0.5)]  # host b: only our own time
    assert foreign_cpu_share(a + b) == pytest.approx(0.25)
    assert foreign_cpu_share(b) == 0.0
    assert foreign_cpu_share(a + [None]) is None  # a rank without a full window: no figure


class StatefulFakeNvml:
    """A FAKE of the four pynvml functions the sampler calls. Stateful: every call to
    nvmlDeviceGetComputeRunningProcesses advances through ``timeline`` (one list of pids per
    sample), and utilisation follows ``utils``; it records the handle it was asked for."""

    def __init__(self, timeline, utils):
        self.timeline, self.utils, self.calls, self.uuids = timeline, utils, 0, []

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.uuids.append(uuid)
        return ("handle", uuid)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        pids = self.timeline[min(self.calls, len(self.timeline) - 1)]
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]

    def nvmlDeviceGetUtilizationRates(self, handle):
        util = self.utils[min(self.calls, len(self.utils) - 1)]
        self.calls += 1
        return SimpleNamespace(gpu=util, memory=0)


def test_gpu_sampler_counts_samples_with_another_process():
    fake = StatefulFakeNvml([[10], [10, 99], [10, 99], [10]], [80, 90, 100, 70])
    sampler = GpuSampler(fake, "1234-abcd", pid=10)
    for _ in range(4):
        sampler.sample()
    assert fake.uuids == [b"GPU-1234-abcd"]
    assert sampler.figures() == pytest.approx({"foreign_gpu_share": 0.5, "gpu_util_mean": 0.85})


def test_gpu_sampler_in_a_pid_namespace_counts_itself_once():
    # NVML lists host pids: ours (10) is absent, one listed process is still us.
    fake = StatefulFakeNvml([[5001], [5001, 5002]], [50, 50])
    sampler = GpuSampler(fake, "GPU-x", pid=10)
    sampler.sample()
    sampler.sample()
    assert sampler.figures()["foreign_gpu_share"] == 0.5


def test_gpu_sampler_thread_samples_during_the_window():
    fake = StatefulFakeNvml([[10, 11]], [40])
    sampler = GpuSampler(fake, "GPU-x", pid=10, interval_s=0.01)
    sampler.event("start")
    import time

    time.sleep(0.1)
    sampler.event("end")
    calls = fake.calls
    time.sleep(0.05)
    assert fake.calls == calls >= 3  # stopped at "end"
    assert sampler.figures() == pytest.approx({"foreign_gpu_share": 1.0, "gpu_util_mean": 0.4})


# ---- real runs --------------------------------------------------------------------------------

@contextmanager
def cpu_burners(niceness: int = 0):
    """One busy-looping process per core of this machine, for as long as the block runs;
    ``niceness`` > 0 lets the rest of the machine go first (they take what is left)."""
    code = f"import os\nos.nice({niceness})\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def share(results):
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results[0]["summary"]["foreign_cpu_share"]


@pytest.mark.slow
def test_a_cpu_burner_on_the_job_cores_is_measured(tmp_path):
    # A window of about a second: /proc/stat counts in 10 ms ticks.
    quiet = share(run_ranks(make_spec(tmp_path / "quiet", steps=40, warmup_steps=2), 2, timeout_s=60))
    with cpu_burners():
        burned = share(run_ranks(make_spec(tmp_path / "burned", steps=40, warmup_steps=2), 2, timeout_s=60))
    # Other tests or jobs may share this machine, so the quiet run is not held to zero; the run
    # beside the burners must be flagged and clearly above it.
    assert burned > 0.10
    assert burned > quiet, (burned, quiet)


@pytest.mark.slow
def test_a_local_cell_beside_a_burner_is_flagged_co_located(tmp_path, fast_overrides):
    from launcher.__main__ import main
    from launcher.state import SweepState

    # A measured window of a second or more: shorter ones are not judged (launcher/cluster/colocation.py).
    overrides = [o for o in fast_overrides if not o.startswith("steps=")] + ["steps=150"]
    # Mildly niced burners: the launcher and the ranks' start-up go first (a fast test), the burners
    # still take every tick the ranks leave idle on their cores during the window.
    with cpu_burners(niceness=5):
        code = main(["-m", *overrides, "cluster.tasks_per_node=2", "tracking=off", f"output_root={tmp_path}",
                     f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 0
    state = SweepState.load(tmp_path / "sweep")
    cell = state.cells[0]
    assert cell.interference and "of its cores" in cell.interference, cell.interference
    assert "co-located" in (tmp_path / "sweep" / "report.md").read_text()
