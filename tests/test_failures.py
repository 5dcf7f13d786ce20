"""Failure classes from what the ranks leave behind (error files, heartbeats, stall markers) and the
Slurm state, on literal error texts; plus one real provoked failure through the launcher."""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from launcher.cluster.failures import CLASSES, FIXES, classify, describe, first_failure
from tests.stores import existing_store

# Literal first lines, as jobs/worker.py writes them ("rank R on HOST failed: Type: message").
CUDA_OOM = ("rank 1 on gpu3 failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
            "total capacity of 79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has "
            "78.04 GiB memory in use.")
CPU_OOM = ("rank 0 on node1 failed: RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
           "can't allocate memory: you tried to allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)")
GLOO_TIMEOUT = ("rank 0 on node1 failed: DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                "Timed out waiting 60000ms for recv operation to complete")
NCCL_TIMEOUT = ("rank 2 on gpu1 failed: DistBackendError: [Rank 2] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=412, OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) "
                "ran for 600018 milliseconds before timing out.")
PEER_GONE = ("rank 0 on node1 failed: DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
             "Connection closed by peer [127.0.1.1]:27393")
PORT_BUSY = ("rank 0 on node1 failed: RuntimeError: MASTER_PORT 16384 is already in use on node1; another process "
             "holds it. The port derives from the job id: resubmit the cell (python -m launcher.status <sweep> "
             "--resubmit-failed) for a new id and port, free the port, or set MASTER_PORT explicitly (torchrun).")
TCPSTORE_BUSY = ("rank 0 on node1 failed: DistNetworkError: The server socket has failed to listen on any local "
                 "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address "
                 "already in use")
BAD_PARAM = ("rank 0 on node1 failed: ValueError: model 'gpt_tiny' does not take params ['bogus']; it takes "
             "['d_model', 'n_head', 'n_layer'] (vocab_size, seq_len, image_size and num_classes are model.* fields, "
             "not params).")
NAN_LOSS = "rank 0 on node1 failed: FloatingPointError: loss is nan at step 12"
STALL = ("rank 1 on node2 made no progress for 61 s after step 7; stacks:\n"
         "Thread 0x00007f (most recent call first):\n  File \"jobs/loop.py\", line 80 in step")
TRACEBACK = "\n\nTraceback (most recent call last):\n  File \"jobs/worker.py\", line 45, in __call__\n"


def cell(tmp_path: Path, errors: dict[int, str] = (), beats: dict[int, tuple[str, int | None]] = (),
         stalled: dict[int, str] = ()) -> Path:
    d = tmp_path / "cells" / "00-x"
    (d / "ranks").mkdir(parents=True, exist_ok=True)
    for rank, (state, step) in dict(beats).items():
        (d / "ranks" / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "host": f"node{rank + 1}", "pid": 100 + rank, "step": step, "state": state,
             "time": time.time() - 10 + rank}))
    for i, (rank, text) in enumerate(dict(errors).items()):
        path = d / f"error-rank{rank}.txt"
        path.write_text(text + TRACEBACK)
        os.utime(path, (time.time() - 5 + i, time.time() - 5 + i))  # order of writing = order of failing
    for rank, text in dict(stalled).items():
        (d / "ranks" / f"stalled-rank{rank}.txt").write_text(text)
    return d


def test_every_class_has_a_fix():
    assert set(FIXES) == set(CLASSES)
    assert all(len(fix) > 40 for fix in FIXES.values())
    assert describe("oom").startswith("oom: out of memory: lower batch_size")
    assert describe(None) == ""


@pytest.mark.parametrize("text", [CUDA_OOM, CPU_OOM])
def test_out_of_memory_errors(tmp_path, text):
    d = cell(tmp_path, {1: text, 0: PEER_GONE}, {0: ("failed", 3), 1: ("failed", 3)})
    assert classify(d, None, first_failure(d)) == "oom"


def test_slurm_states_decide_where_they_are_decisive(tmp_path):
    """Slurm's state names are its backend's (launcher/cluster/slurm/accounting.py), mapped to classes."""
    from launcher.cluster.slurm.accounting import failure_class

    d = cell(tmp_path, {0: PEER_GONE}, {0: ("failed", 3), 1: ("running", 3)})
    assert failure_class(d, "OUT_OF_MEMORY", None) == classify(d, "oom", None) == "oom"
    assert failure_class(d, "NODE_FAIL", None) == "node_failure"
    assert failure_class(d, "PREEMPTED", None) == "preempted"
    assert failure_class(cell(tmp_path / "t"), "TIMEOUT", None) == "hang"  # no progress to the time limit
    assert classify(cell(tmp_path / "u"), None, None, timed_out=True) == "hang"


def test_collective_timeouts(tmp_path):
    assert classify(cell(tmp_path / "g", {0: GLOO_TIMEOUT, 1: GLOO_TIMEOUT}), None, None) == "collective_timeout"
    assert classify(cell(tmp_path / "n", {2: NCCL_TIMEOUT}), None, None) == "collective_timeout"


def test_stall_watchdog_marker_is_a_hang(tmp_path):
    d = cell(tmp_path, {0: GLOO_TIMEOUT}, {0: ("failed", 7), 1: ("stalled", 7)}, {1: STALL})
    assert first_failure(d).startswith("rank 1 on node2 made no progress")
    assert classify(d, None, first_failure(d)) == "hang"


def test_rank_killed_without_a_word_is_out_of_memory(tmp_path):
    # Rank 1's heartbeat says running and it wrote no error (SIGKILL from the OOM killer); rank 0
    # only saw its connection close.
    d = cell(tmp_path, {0: PEER_GONE}, {0: ("failed", 5), 1: ("running", 5)})
    assert "died at step 5 without reporting an error" in first_failure(d)
    assert classify(d, None, first_failure(d)) == "oom"
    # The same death with no other rank left to report it; and submitit's word for a signal.
    alone = cell(tmp_path / "alone", {}, {0: ("running", 2)})
    assert classify(alone, None, first_failure(alone)) == "oom"
    assert classify(cell(tmp_path / "k"), None, "job 123 ended: Killed") == "oom"


@pytest.mark.parametrize("text", [PORT_BUSY, TCPSTORE_BUSY])
def test_port_in_use(tmp_path, text):
    d = cell(tmp_path, {0: text, 1: PEER_GONE}, {0: ("failed", None), 1: ("failed", None)})
    assert classify(d, None, first_failure(d)) == "port_in_use"


def test_settings_errors_before_the_first_step_are_config_errors(tmp_path):
    d = cell(tmp_path, {0: BAD_PARAM, 1: BAD_PARAM}, {0: ("failed", None), 1: ("failed", None)})
    assert classify(d, None, first_failure(d)) == "config_error"
    # A ValueError after steps ran is a runtime error; so is any other exception.
    late = "rank 0 on node1 failed: ValueError: expected a finite loss"
    assert classify(cell(tmp_path / "late", {0: late}, {0: ("failed", 9)}), None, None) == "runtime_error"
    assert classify(cell(tmp_path / "nan", {0: NAN_LOSS}, {0: ("failed", 12)}), None, None) == "runtime_error"


def test_preemption_record_and_vanished_jobs(tmp_path):
    d = cell(tmp_path)
    (d / "preempted.txt").write_text("rank 0 on node1: stop requested (SIGTERM)\n")
    assert classify(d, None, None) == "preempted"
    lost = "job 4242 is in neither the queue nor accounting (purged or never ran)"
    assert classify(cell(tmp_path / "lost"), None, lost) == "node_failure"
    # Only "connection closed" everywhere, nobody silent: a peer's host went away.
    d = cell(tmp_path / "gone", {0: PEER_GONE}, {0: ("failed", 4)})
    assert classify(d, None, first_failure(d)) == "node_failure"
    assert classify(cell(tmp_path / "empty"), None, None) == "runtime_error"


@pytest.mark.slow
def test_real_runtime_error_through_the_launcher(tmp_path, fast_overrides, capsys):
    """A model that passes every check before launch (its forward's shapes fit the data on fake
    tensors, which carry no values) but reads past its table on real token ids: every rank fails at
    its first step; the class lands in sweep.json, the MLflow run's tag, the report's failure table
    and status output."""
    from mlflow.tracking import MlflowClient

    from launcher.__main__ import main
    from launcher.commands import status
    from launcher.state import SweepState

    existing_store(tmp_path)
    code = main(["-m", *fast_overrides, "model=custom", "model.target=torch.nn.Embedding", "model.input=tokens",
                 "+model.params.num_embeddings=10", "+model.params.embedding_dim=256", "cluster.tasks_per_node=2",
                 f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 1
    state = SweepState.load(tmp_path / "sweep")
    c = state.cells[0]
    assert c.status == "failed" and "index out of range" in c.error, c.error
    assert c.failure_class == "runtime_error"
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["cells"][0]["failure_class"] == "runtime_error"
    run = MlflowClient(tracking_uri=state.tracking_uri).get_run(c.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_class"] == "runtime_error"
    md = (tmp_path / "sweep" / "report.md").read_text()
    assert "| runtime_error |" in md and FIXES["runtime_error"][:40] in md
    capsys.readouterr()
    assert status.main([str(tmp_path / "sweep")]) == 1
    assert "runtime_error: an error during training" in capsys.readouterr().out


class HangsAfterWarmup(torch.nn.Module):
    """A tiny token model whose forward hangs on rank 1 from its 6th call on (a deadlocked rank)."""

    def __init__(self, vocab_size: int = 64, hang_rank: int = 1, after_calls: int = 5):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)
        self.hang_rank, self.after_calls, self.calls = hang_rank, after_calls, 0

    def forward(self, x):
        self.calls += 1
        if torch.distributed.get_rank() == self.hang_rank and self.calls > self.after_calls:
            time.sleep(3600)
        return self.head(self.embed(x))


@pytest.mark.slow
def test_real_hang_through_the_launcher_is_a_hang(tmp_path, fast_overrides):
    """Rank 1 stops making progress: its stall watchdog ends it after collective_timeout_s, the job
    fails fast instead of hanging, and the class is hang (with its fix)."""
    from launcher.__main__ import main
    from launcher.state import SweepState

    overrides = [o for o in fast_overrides if not o.startswith(("model", "steps="))]
    t0 = time.monotonic()
    code = main(["-m", *overrides, "model=custom", f"model._target_={__name__}.HangsAfterWarmup", "model.input=tokens",
                 "model.seq_len=8", "model.vocab_size=64", "+model.params.vocab_size=64", "steps=40",
                 "collective_timeout_s=6", "cluster.tasks_per_node=2", "tracking=off", f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 1 and time.monotonic() - t0 < 120
    cell = SweepState.load(tmp_path / "sweep").cells[0]
    assert cell.status == "failed" and "rank 1" in cell.error and "no progress" in cell.error, cell.error
    assert cell.failure_class == "hang"


class AllocatesAfterWarmup(torch.nn.Module):
    """A tiny token model whose forward, on rank 0 from its 4th call on, touches ``gib`` GiB of host
    memory (a batch or a model that does not fit the node)."""

    def __init__(self, vocab_size: int = 64, gib: float = 4.0, after_calls: int = 3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)
        self.gib, self.after_calls, self.calls, self.held = gib, after_calls, 0, []

    def forward(self, x):
        self.calls += 1
        if torch.distributed.get_rank() == 0 and self.calls > self.after_calls:
            self.held.append(torch.ones(int(self.gib * 2**30 // 4)))  # touched, so really resident
        return self.head(self.embed(x))


@pytest.mark.slow
def test_real_host_oom_under_a_memory_limit_through_the_launcher(tmp_path, fast_overrides):
    """cluster.mem_gb on the local cluster is a real memory cgroup around the cell: rank 0 outgrows it,
    the kernel's OOM killer ends it, the job fails fast, and the cgroup's own count makes the class oom."""
    from launcher.__main__ import main
    from launcher.cluster.local import memlimit
    from launcher.state import SweepState

    if memlimit.problem():
        pytest.skip(f"no memory cgroup can be created here: {memlimit.problem()}")
    overrides = [o for o in fast_overrides if not o.startswith(("model", "steps="))]
    t0 = time.monotonic()
    code = main(["-m", *overrides, "model=custom", f"model._target_={__name__}.AllocatesAfterWarmup",
                 "model.input=tokens", "model.seq_len=8", "model.vocab_size=64", "+model.params.vocab_size=64",
                 "steps=40", "cluster.mem_gb=1.5", "cluster.tasks_per_node=2", "tracking=off",
                 f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 1 and time.monotonic() - t0 < 120
    cell = SweepState.load(tmp_path / "sweep").cells[0]
    assert cell.status == "failed" and cell.failure_class == "oom", (cell.error, cell.failure_class)
    assert "OOM killer ended" in cell.error and "cluster.mem_gb=1.5" in cell.error and "rank 0" in cell.error, cell.error
    # The cell's cgroup is gone with its processes.
    parent = memlimit.own_cgroup()
    assert parent is not None and not list(parent[0].glob(f"{memlimit.PREFIX}*"))
