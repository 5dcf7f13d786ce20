"""The node health probe on the ranks: one task per node, each node's own figures and the ring's pairs.

A job of its own (launcher/healthprobe.py submits it through the backend, like the fabric probe), one
rank per node. Each node measures, ``repeats`` times, its compute ceiling (dense matmuls), its
memory bandwidth (a large copy) and a short step of the worker's own model alone on the node; then
every pair of the ring (contract/health.py) times 2-rank all-reduces between its nodes. Where
``dcgmi`` is installed, NVIDIA DCGM's level-1 diagnostic runs on the node and its verdict is kept
beside the figures; it is not re-implemented here.

Nodes that share one machine's cores (one kernel: the Slurm test cluster, the local cluster's
emulated nodes) measure in turn, the others waiting at a barrier: measured at once, they would
measure each other. Separate machines measure at once.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract import records
from contract.fabric import bus_factor
from contract.health import RESULT_FILE, NodeProbeSpec, pair_rounds
from contract.metrics import MEASURED_MATMUL_TFLOPS
from contract.spec import ModelSpec

__all__ = ["RESULT_FILE", "NodeProbeSpec", "main"]

DCGM_TIMEOUT_S = 300


def main(spec: NodeProbeSpec) -> dict[str, Any]:
    """Measure this node and its pairs; rank 0 gathers every node's figures and writes health.json."""
    entered = time.perf_counter()
    import torch
    import torch.distributed as dist

    from jobs.dist import DistEnv, backend_for, process_group, resolve_device
    from jobs.fabric import rank_cores
    from jobs.interference import kernel_id

    env = DistEnv.detect(os.environ)
    # 0: every CPU the task may use (the probe has its nodes to itself: sbatch --exclusive).
    torch.set_num_threads(spec.cpus_per_task or len(os.sched_getaffinity(0)))
    device, backend = resolve_device(spec.gpus_per_node, env)
    with process_group(env, backend_for(device.type), timeout_s=spec.collective_timeout_s,
                       device=device if device.type == "cuda" else None):
        me = {"node": env.node_rank, "host": env.hostname if not spec.emulate_nodes else f"{env.hostname}/{env.rank}",
              "kernel": kernel_id() or env.hostname}
        everyone = _gathered(me)
        in_turn = spec.in_turn if spec.in_turn is not None else len({e["kernel"] for e in everyone}) < len(everyone)
        started = time.perf_counter()
        dcgm = dcgm_diag() if spec.dcgm else {"verdict": "skipped", "reason": "health.dcgm=false"}
        runners = {"matmul_gflops": matmul_runner(device, spec.matmul_n, spec.min_time_s),
                   "copy_gb_per_s": copy_runner(device, spec.copy_bytes, spec.min_time_s),
                   "step_samples_per_s": step_runner(spec, device)}
        figures: dict[str, list[float]] = {name: [] for name in runners}
        dist.barrier()  # a sync point: every node has built its buffers and its step before the first timing
        # Repeats interleaved across the nodes (in turn: node 0's first, node 1's first, ...), so a
        # drift of a shared machine reaches every node alike.
        for _ in range(spec.repeats):
            for turn in range(env.world_size) if in_turn else [None]:
                if turn is None or turn == env.rank:
                    for name, measure in runners.items():
                        figures[name].append(measure())
                if turn is not None:
                    dist.barrier()  # a sync point: the next node measures on idle cores
        node_s = time.perf_counter() - started
        pairs = time_pairs(spec, env.rank, env.world_size, device, in_turn)
        pairs_s = time.perf_counter() - started - node_s
        mine = {**me, "figures": figures, "dcgm": dcgm,
                "cores": rank_cores(env.rank, env.node_rank, str(me["host"]), torch.get_num_threads())}
        nodes = _gathered(mine)
    result = {"nodes": nodes, "pairs": pairs, "in_turn": in_turn, "device": device.type, "backend": backend,
              "torch": torch.__version__, "repeats": spec.repeats, "node_s": node_s, "pairs_s": pairs_s,
              "job_s": time.perf_counter() - entered, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if env.is_head:
        out = Path(spec.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        records.write_document(out / RESULT_FILE, result)
    return result


# ---- a node's own figures -----------------------------------------------------------------------

def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)  # a sync point: the kernels timed have ended


def _timed(run, device, min_time_s: float) -> tuple[int, float]:
    """Calls of ``run`` back to back until ``min_time_s`` has passed: (calls, seconds). Long enough
    that a CPU quota's period (100 ms) cannot hide inside one timing."""
    calls, started = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        _sync(device)
        elapsed = time.perf_counter() - started
        if elapsed >= min_time_s:
            return calls, elapsed


def matmul_runner(device, n: int, min_time_s: float) -> Callable[[], float]:
    """GFLOP/s of dense float32 matmuls of n x n, 2 n^3 FLOPs each (buffers made and one untimed matmul
    once; on CUDA the largest that fits, timed by jobs/matmul_peak.py)."""
    import torch

    if device.type == "cuda":
        from jobs import matmul_peak

        return lambda: float(matmul_peak.measure(device, "fp32").get(MEASURED_MATMUL_TFLOPS, 0.0)) * 1000
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    c = torch.empty(n, n, device=device)
    torch.matmul(a, b, out=c)

    def measure() -> float:
        calls, seconds = _timed(lambda: torch.matmul(a, b, out=c), device, min_time_s)
        return 2 * n**3 * calls / seconds / 1e9

    return measure


def copy_runner(device, size_bytes: int, min_time_s: float) -> Callable[[], float]:
    """GB/s of one tensor of ``size_bytes`` (1 GiB on CUDA) copied into another: bytes read + written."""
    import torch

    size_bytes = 1024**3 if device.type == "cuda" else size_bytes
    src = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the pages touched once, outside every timing

    def measure() -> float:
        calls, seconds = _timed(lambda: dst.copy_(src), device, min_time_s)
        return 2 * size_bytes * calls / seconds / 1e9

    return measure


def step_runner(spec: NodeProbeSpec, device) -> Callable[[], float]:
    """A short step of the worker itself on this node alone (jobs/loop.py's Trainer, the project's
    model and synthetic batches): one untimed step when built, then steps for ``min_time_s`` per call."""
    import torch

    from jobs.data import synthetic_batches
    from jobs.loop import StepTrace, Trainer, run_steps
    from jobs.models import build_for
    from jobs.parallel import build_optimizer

    torch.manual_seed(0)
    model_spec = ModelSpec(name=spec.step_model, seq_len=spec.step_seq_len, vocab_size=256)
    model = build_for(model_spec, device, sharded=False)
    trainer = Trainer(model, build_optimizer(model, "adamw", 1e-4), accum_steps=1, autocast_dtype=None,
                      device=device, no_sync=contextlib.nullcontext)
    batches = synthetic_batches(model_spec, spec.step_batch_size, 0, 0, device)

    def sync() -> None:
        _sync(device)

    run_steps(trainer, batches, 1, sync, StepTrace())

    def timed() -> float:
        trace = StepTrace()
        calls, _ = _timed(lambda: run_steps(trainer, batches, 1, sync, trace), device, spec.min_time_s)
        return spec.step_batch_size * calls / sum(trace.step_time_s)

    return timed


# ---- the ring's pairs ---------------------------------------------------------------------------

def time_pairs(spec: NodeProbeSpec, rank: int, world: int, device, in_turn: bool) -> list[dict[str, Any]]:
    """Every pair of the ring timing ``repeats`` times a loop of all-reduces of ``pair_bytes`` (long
    enough for ``min_time_s``). At once: round by round (no node in two pairs of one round). In turn:
    one pair at a time, the repeats interleaved across the pairs as the nodes' are. Every rank
    returns the same list."""
    import torch
    import torch.distributed as dist

    size = (256 * 1024**2 if device.type == "cuda" else spec.pair_bytes) // 4 * 4
    rounds = pair_rounds(world)
    groups = {}
    for pairs in rounds:
        for pair in pairs:
            # new_group is collective over the world: every rank makes every group, in the same order.
            groups[pair] = dist.new_group(ranks=list(pair))
    mine = [p for pairs in rounds for p in pairs if rank in p]
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    # One loop length for every pair (the most any pair needs): a shorter loop pays its start more often.
    count = torch.tensor([max([_loop_length(groups[pair], buf, spec.min_time_s, device) for pair in mine] or [3])],
                         dtype=torch.int64, device=buf.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    loop = int(count.item())  # .item(): a sync point, before any timing
    loops = {pair: loop for pair in mine}
    times: dict[tuple[int, int], list[float]] = {pair: [] for pair in mine}
    if in_turn:
        for _ in range(spec.repeats):
            for pairs in rounds:
                for pair in pairs:
                    if pair in times:
                        times[pair].append(_time_loop(groups[pair], buf, loops[pair], device))
                    dist.barrier()  # a sync point: the next pair starts on idle cores
    else:
        for pairs in rounds:
            for pair in (p for p in pairs if p in times):
                times[pair] = [_time_loop(groups[pair], buf, loops[pair], device) for _ in range(spec.repeats)]
            dist.barrier()  # a sync point: the next round starts on idle nodes
    found: dict[tuple[int, int], list[float]] = {}
    for each in _gathered({pair: t for pair, t in times.items() if pair[0] == rank}):
        found.update(each)
    return [{"pair": list(pair), "size_bytes": size, "iterations": loop,
             "busbw_gb_per_s": [size / t / 1e9 * bus_factor("all_reduce", 2) for t in found[pair]]}
            for pairs in rounds for pair in pairs]


def _loop_length(group, buf, min_time_s: float, device) -> int:
    """All-reduces per timing: enough for ``min_time_s`` at the pair's speed (one untimed, one timed),
    the larger of the two nodes' counts so that both run the same loop."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(buf, group=group)
    one = _time_loop(group, buf, 1, device)
    count = torch.tensor([max(3, math.ceil(min_time_s / max(one, 1e-6)))], dtype=torch.int64, device=buf.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return int(count.item())  # .item(): a sync point, before any timing


def _time_loop(group, buf, iterations: int, device) -> float:
    """The average time of one all-reduce in a loop of ``iterations``."""
    import torch.distributed as dist

    _sync(device)
    dist.barrier(group=group)  # a sync point: both nodes start together
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(buf, group=group)
    _sync(device)
    return (time.perf_counter() - started) / iterations


def _gathered(mine: dict[Any, Any]) -> list[dict[Any, Any]]:
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


# ---- NVIDIA DCGM ----------------------------------------------------------------------------------

def dcgm_diag() -> dict[str, Any]:
    """``dcgmi diag -r 1`` where it is installed: its verdict (pass | fail) and its own lines; else
    why it was skipped. Its checks (driver, PCIe, ...) are DCGM's, not re-implemented here."""
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return {"verdict": "skipped", "reason": "dcgmi is not installed on this node"}
    try:
        done = subprocess.run([dcgmi, "diag", "-r", "1"], capture_output=True, text=True, timeout=DCGM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"verdict": "fail", "reason": f"dcgmi diag -r 1 did not finish: {type(exc).__name__}: {exc}"}
    return parse_dcgm(done.stdout, done.returncode)


def parse_dcgm(text: str, returncode: int) -> dict[str, Any]:
    """DCGM's table: any test line saying Fail fails the node; a non-zero exit status too."""
    failed = [line.strip(" |") for line in text.splitlines() if "fail" in line.lower()]
    verdict = "fail" if failed or returncode else "pass"
    return {"verdict": verdict, "reason": "; ".join(failed)[:500] or (f"exit status {returncode}" if returncode else ""),
            "output": text[-2000:]}
