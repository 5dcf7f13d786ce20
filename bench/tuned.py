"""The tuned reference: a bare loop as fast as PyTorch trains GPT-2 small or ResNet-50 on one device,
run beside the worker's DDP and FSDP in ONE job, blocks alternating.

    torchrun --standalone --nproc-per-node 1 bench/tuned.py --model gpt2-small --seq-len 1024 \\
        --batch-size 32 --precisions bf16 --sides tuned,ddp,fsdp --out tuned.json

The tuned side (:class:`TunedLoop`) trains the project's own model (``jobs.models.build_model``, so
both sides train the same network) the way the tuned loops published for these models do:
``torch.compile`` over forward and loss; AdamW with ``fused=True`` (with fp16, the GradScaler hands
its scale and found-inf flag to the fused kernel: no ``.item()``); attention through the model's own
``F.scaled_dot_product_attention(is_causal=True)`` (flash on a GPU); for a CNN, input and weights
channels-last and ``cudnn.benchmark``; for a language model, the vocabulary padded to a multiple of
64 (50,304 for GPT-2) and a loss that reads the low-precision logits chunk by chunk
(:class:`LowPrecisionCrossEntropy`: no fp32 copy of the whole logits is ever made, forward or
backward); no synchronisation inside a block.

The worker's sides (``ddp``, ``fsdp``) are the worker's own set-up and schedule
(``jobs.worker.set_up``, ``jobs.worker.run_schedule``) for a RunSpec carrying the tuning settings of
bench/tuning.py, those the installed spec has (the rest are listed as not set). Each block of a
worker side is one run of the worker's schedule; its time is the schedule's measured window, as the
worker's own figures are (from the barrier that opens the window, on an idle device, to the sync
that closes it: the per-step timing, heartbeat and stop-request agreement inside, the schedule's
start around it outside, as in every cell), and the whole run's wall time is kept beside it
(``schedule_s``).

Per precision: every side is built and warmed up (the first step, or the first block, holds the
compilation: timed, outside every block), then ``--rounds`` rounds of one block per side, the order
reversed every other round (tuned, ddp, fsdp, fsdp, ddp, tuned, ...), each block starting on an
idle device and ending with ONE synchronisation; its wall time is the block's time. Afterwards, with
``--profile-blocks``, one more block of every side under the profiler (bench/blockprofile.py: whether
its device or its host sets its pace); on the worker's sides, ``--anatomy-steps`` profiled steps (jobs.anatomy.probe: where the step's time
goes, at one rank), and with ``--fabric`` the fabric probe's timing (jobs.fabric.time_collective)
of each collective at one rank. Rank 0 rewrites ``--out`` after each part, so a job stopped at
its budget leaves what it finished. bench/gpu_check.py reads it: per round, tuned / worker and
DDP / FSDP block-time ratios, throughput from the block medians.
"""

from __future__ import annotations

import time

# Taken before torch's import: the job's own start, which its --budget-s counts from.
JOB_START_S = time.monotonic()

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run by path under torchrun: the checkout's packages first
    sys.path.insert(0, str(REPO))

from bench.tuning import VOCAB_MULTIPLE, describe, refused_key, set_path, split_known, worker_tuning  # noqa: E402
from contract.spec import ConfigError, InputKind, ModelSpec  # noqa: E402
from jobs.hooks import Observer  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# The most fp32 elements one chunk of the loss holds (512 MiB): a few chunks for GPT-2 at 32 x 1024.
LOSS_CHUNK_ELEMENTS = 2**27


class LowPrecisionCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of low-precision logits [N, V], computed in fp32 one chunk of rows at a
    time: forward keeps only each row's log-sum-exp (fp32, N values) beside the logits it was given;
    backward writes the gradient straight into a tensor of the logits' dtype, the loss scale applied
    in fp32 before the cast (fp16's small probabilities survive it)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk_rows):
            z = logits[start : start + chunk_rows].float()
            t = targets[start : start + chunk_rows]
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[start : start + chunk_rows] = chunk_lse
            total = total + (chunk_lse - z.gather(1, t.unsqueeze(1)).squeeze(1)).sum()
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk_rows = chunk_rows
        return total / logits.shape[0]

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = grad_out.float() / logits.shape[0]
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            z = logits[start : start + ctx.chunk_rows].float()
            t = targets[start : start + ctx.chunk_rows]
            p = torch.exp(z - lse[start : start + ctx.chunk_rows].unsqueeze(1))
            p.scatter_add_(1, t.unsqueeze(1), torch.full_like(t, -1, dtype=p.dtype).unsqueeze(1))
            grad[start : start + ctx.chunk_rows] = (p * scale).to(grad.dtype)
        return grad, None, None


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    flat = logits.flatten(0, -2)
    return LowPrecisionCrossEntropy.apply(flat, targets.flatten(), max(1, LOSS_CHUNK_ELEMENTS // flat.shape[-1]))


def padded(spec: ModelSpec, multiple: int = VOCAB_MULTIPLE) -> ModelSpec:
    """The spec with its vocabulary rounded up to ``multiple`` (the data still draws from the real one)."""
    import dataclasses

    return dataclasses.replace(spec, vocab_size=-(-spec.vocab_size // multiple) * multiple)


class TunedLoop:
    """The bare, tuned training step on one device; :meth:`run` queues steps and never synchronises."""

    def __init__(self, spec: ModelSpec, precision: str, batch_size: int, device: torch.device, *,
                 compile: bool, loss: str = "chunked", lr: float = 1e-4, seed: int = 0,
                 backend: Any = "inductor") -> None:
        from jobs.data import POOL_STEPS, synthetic_batches
        from jobs.models import build_model

        self.conv = spec.input is InputKind.image
        self.device, self.dtype = device, DTYPES[precision]
        torch.manual_seed(seed)
        with torch.device(device):
            model = build_model(spec if self.conv else padded(spec))
        stream = synthetic_batches(spec, batch_size, seed, 0, device)  # the worker's own sample stream
        pool = [next(stream) for _ in range(POOL_STEPS)]
        if self.conv:
            model = model.to(memory_format=torch.channels_last)
            pool = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in pool]
        self.model, self.pool, self.i = model, pool, 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        # "chunked": LowPrecisionCrossEntropy; "fused": F.cross_entropy of the fp32 view of the logits,
        # which only a compiled graph keeps from being materialised (the fallback where the chunked
        # Function does not compile).
        self.token_loss = token_loss if loss == "chunked" else (
            lambda logits, y: F.cross_entropy(logits.flatten(0, -2).float(), y.flatten()))
        self.loss = torch.compile(self._loss, backend=backend) if compile else self._loss
        self.compiled, self.loss_kind = compile, loss

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            logits = self.model(x)
            if self.conv:
                return F.cross_entropy(logits.float(), y)  # [B, classes]: small
            return self.token_loss(logits, y)

    def step(self) -> torch.Tensor:
        x, y = self.pool[self.i % len(self.pool)]
        self.i += 1
        loss = self.loss(x, y)
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.step(self.optimizer)  # fused AdamW takes the scale and found-inf on the device
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def run(self, n_steps: int) -> None:
        # cudnn.benchmark is process-wide: on for this side's steps only, so that the worker's sides in
        # the same process run with whatever the worker itself sets.
        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = before or (self.conv and self.device.type == "cuda")
        try:
            for _ in range(n_steps):
                self.step()
        finally:
            torch.backends.cudnn.benchmark = before


# ---- the job: the tuned loop beside the worker's sides --------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt_tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--precisions", default="bf16", help="comma-separated: bf16,fp16,fp32")
    p.add_argument("--sides", default="tuned,ddp,fsdp", help="tuned and the worker's strategies, comma-separated")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=STRATEGY[;PATH=JSON...]",
                   help="one more worker side, built and timed after the others: a strategy with settings of its own, "
                        "e.g. 'fsdp-model=fsdp;strategy.wrap=\"model\"'")
    p.add_argument("--rounds", type=int, default=4, help="blocks per side")
    p.add_argument("--block-s", type=float, default=1.0, help="a block's length, from the tuned side's warm-up steps")
    p.add_argument("--block-steps", type=int, default=0, help="steps per block instead of --block-s")
    p.add_argument("--warmup-steps", type=int, default=4, help="tuned side, after its first (compiling) step")
    p.add_argument("--warmup-blocks", type=int, default=2, help="worker sides: the first compiles")
    p.add_argument("--compile", choices=("auto", "true", "false"), default="auto",
                   help="the tuned side's torch.compile (auto: on CUDA)")
    p.add_argument("--worker-set", action="append", default=[], metavar="PATH=JSON",
                   help="a worker setting on top of bench/tuning.py's, e.g. train.loss='\"full\"'")
    p.add_argument("--anatomy-steps", type=int, default=0, help="profiled steps per worker side afterwards")
    p.add_argument("--fabric", action="store_true", help="time each collective at one rank afterwards")
    p.add_argument("--profile-blocks", action="store_true",
                   help="one more block of every side under the profiler afterwards (bench/blockprofile.py)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="the job's wall time, counted from its start: a worker side whose build and compilation "
                        "would leave no time for the rounds is skipped, and rounds stop at it (0: no limit)")
    p.add_argument("--out", required=True)
    return p


def remaining_s(args) -> float:
    return args.budget_s - (time.monotonic() - JOB_START_S) if args.budget_s else float("inf")


# Kept for what follows the rounds: the probes, the fabric timing, the last writes.
END_MARGIN_S = 8.0


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from jobs.dist import DistEnv, backend_for, choose_device, process_group

    env = DistEnv.detect(os.environ)
    if env.world_size != 1:
        raise SystemExit(f"bench/tuned.py runs at one rank (world size {env.world_size}): the tuned loop is a "
                         "one-device reference")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name, backend = choose_device(gpus, 0, 1, gpus)
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = Path(args.out)
    work = out.with_suffix(".work")
    result: dict[str, Any] = {
        "model": args.model, "batch_size": args.batch_size, "seq_len": args.seq_len, "image_size": args.image_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "backend": backend,
        "torch": torch.__version__, "configs": []}
    with process_group(env, backend_for(device.type), timeout_s=600,
                       device=device if device.type == "cuda" else None) as control_group:
        for precision in args.precisions.split(","):
            config: dict[str, Any] = {"precision": precision}
            result["configs"].append(config)
            run_config(args, config, env, device, backend, control_group, work, save=lambda: _write(out, result))
            _write(out, result)
        if args.fabric and remaining_s(args) > END_MARGIN_S / 2:
            result["fabric"] = fabric_one_rank(device)
            _write(out, result)
    print(json.dumps({"done": str(out)}), flush=True)


PROGRESS_PREFIX = "tuned.py progress: "


def _write(path: Path, result: dict[str, Any]) -> None:
    """The result so far, into ``path`` and, on one line, into the job's output: the GPU check keeps
    that in its own output folder, so a call cut off mid-part still brings back every figure taken."""
    text = json.dumps(result)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(PROGRESS_PREFIX + text, flush=True)


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def run_config(args, config: dict[str, Any], env, device: torch.device, backend: str, control_group, work: Path,
               save: Callable[[], None]) -> None:
    """One precision (``config["precision"]``), measured as it is built, saved after every block
    round: the tuned side built, warmed up and timed at once; then each worker side built and
    timed right away in rounds with every side built so far (tuned, ddp; then tuned, ddp, fsdp),
    the order reversed every other round. A side whose build overruns costs none of the figures
    already taken. Then the probes."""
    precision = config["precision"]
    spec = ModelSpec(name=args.model, input=InputKind.image if args.model.startswith(("resnet", "cnn")) else InputKind.tokens,
                     seq_len=args.seq_len, vocab_size=args.vocab_size, image_size=args.image_size)
    sync = _sync(device)
    compile_tuned = device.type == "cuda" if args.compile == "auto" else args.compile == "true"
    config.update(samples_per_block_step=args.batch_size, unit="images" if spec.input is InputKind.image else "tokens",
                  unit_per_sample=1 if spec.input is InputKind.image else args.seq_len,
                  flops_per_sample=_flops_per_sample(spec), sides={}, rounds=[])
    runs: dict[str, Callable[[], float | None]] = {}
    sides = [s for s in args.sides.split(",") if s]
    tuned = build_tuned(args, config, spec, precision, device, compile_tuned) if "tuned" in sides else None
    save()
    step_s = (config["sides"].get("tuned") or {}).get("warmup_step_s")
    if args.block_steps or not step_s:
        block_steps = args.block_steps or 5
    else:
        block_steps = max(2, min(200, round(args.block_s / step_s)))
    config["block_steps"] = block_steps
    # A block's length as the tuned side's warm-up measured it; what one side's build and compilation
    # costs, first guessed from the tuned side's, then taken from the last worker side's.
    block_s = block_steps * step_s if step_s else args.block_s
    if tuned is not None:
        runs["tuned"] = functools.partial(tuned.run, block_steps)
        timed_rounds(args, config, runs, sync, block_s, save, phase="tuned")
    workers: dict[str, Any] = {}
    side_cost_s = (config["sides"].get("tuned") or {}).get("first_step_s") or 0.0
    worker_sides = [(s, s, []) for s in sides if s != "tuned"] + [variant(v) for v in args.variant]
    for name, strategy, extra in worker_sides:
        rounds_s = min(2, args.rounds) * (len(runs) + 1) * block_s
        if remaining_s(args) < side_cost_s + rounds_s + END_MARGIN_S:
            config["sides"][name] = {"skipped": f"{remaining_s(args):.0f} s left of the job's budget: building "
                                                f"it (about {side_cost_s:.0f} s) would leave none for its rounds"}
            save()
            continue
        t0 = time.perf_counter()
        side, built = worker_side(args, spec, strategy, precision, env, device, backend, control_group,
                                  block_steps, work / f"{precision}-{name}", extra_settings=extra)
        side_cost_s = time.perf_counter() - t0
        config["sides"][name] = {**side, "strategy": strategy}
        save()
        if built is not None:
            runs[name], workers[name] = built
            timed_rounds(args, config, runs, sync, block_s, save, phase=name)
    if args.profile_blocks:
        profile_sides(args, config, runs, sync, block_s, save, on_gpu=device.type == "cuda")
    if args.anatomy_steps:
        for strategy, setup in workers.items():
            if remaining_s(args) < END_MARGIN_S:
                break
            config["sides"][strategy]["anatomy"] = anatomy_one_rank(setup, args.anatomy_steps, device)
            save()
    runs.clear()
    workers.clear()
    tuned = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def profile_sides(args, config: dict[str, Any], runs: dict[str, Callable[[], Any]], sync: Callable[[], None],
                  block_s: float, save: Callable[[], None], on_gpu: bool) -> None:
    """One block of each side under the profiler (bench/blockprofile.py), while the budget allows: the
    last side built first (the worker's sides are the question; the tuned loop is the reference)."""
    from bench.blockprofile import profile_block

    for name, run in reversed(runs.items()):
        # The profiler's start, the block (slower under it) and reading the trace.
        if remaining_s(args) < 3 * block_s + 10 + END_MARGIN_S:
            config["sides"][name]["profile"] = "not run: the job's budget"
            break
        try:
            config["sides"][name]["profile"] = profile_block(run, sync, config["block_steps"], on_gpu)
        except Exception as exc:  # a probe that fails costs the figures nothing
            config["sides"][name]["profile"] = _error(exc)
        save()


def variant(text: str) -> tuple[str, str, list[str]]:
    """``NAME=STRATEGY;PATH=JSON;...`` -> (name, strategy, [PATH=JSON, ...])."""
    name, _, rest = text.partition("=")
    strategy, *settings = rest.split(";")
    if not name or strategy not in ("ddp", "fsdp"):
        raise SystemExit(f"--variant {text!r}: give NAME=ddp|fsdp;PATH=JSON;...")
    return name, strategy, settings


def build_tuned(args, config: dict[str, Any], spec: ModelSpec, precision: str, device: torch.device,
                compile_tuned: bool, compile_backend: Any = "inductor") -> TunedLoop | None:
    """The tuned side built, its first (compiling) step and its warm-up run; None when it failed."""
    tuned_side: dict[str, Any] = {"compile": compile_tuned, "optimizer": "AdamW(fused=True)",
                                  "channels_last": spec.input is InputKind.image,
                                  "vocab_size": None if spec.input is InputKind.image else padded(spec).vocab_size}
    config["sides"]["tuned"] = tuned_side
    cache_before = _cache_counts()
    try:
        try:
            tuned = _first_step(spec, precision, args.batch_size, device, compile_tuned, "chunked", tuned_side,
                                compile_backend)
        except Exception as exc:  # the one-shot GPU run keeps a reference: the compiled plain loss
            if spec.input is InputKind.image or not compile_tuned:
                raise
            tuned_side["loss_fallback"] = f"the chunked loss failed under compile: {_error(exc)}"
            tuned = _first_step(spec, precision, args.batch_size, device, compile_tuned, "fused", tuned_side,
                                compile_backend)
        tuned_side["loss"] = "cross-entropy" if spec.input is InputKind.image else tuned.loss_kind
        t0 = time.perf_counter()
        tuned.run(args.warmup_steps)
        _sync(device)()  # sync point, warm-up
        tuned_side["warmup_step_s"] = (time.perf_counter() - t0) / max(1, args.warmup_steps)
        tuned_side["compile_s"] = max(0.0, tuned_side["first_step_s"] - tuned_side["warmup_step_s"])
        tuned_side["inductor_cache"] = _cache_delta(cache_before)
        return tuned
    except Exception as exc:  # a side that cannot run costs the others nothing
        tuned_side["error"] = _error(exc)
        return None


def timed_rounds(args, config: dict[str, Any], runs: dict[str, Callable[[], float | None]], sync: Callable[[], None],
                 block_s: float, save: Callable[[], None], phase: str) -> None:
    """``--rounds`` rounds of one block per side built so far, the order reversed every other round;
    each round kept in ``config["rounds"]`` (``{"phase", side: seconds}``) and in each side's
    ``block_s``, and saved at once. At the job's budget it stops after the first round."""
    order = list(runs)
    for r in range(args.rounds):
        if r >= 1 and remaining_s(args) < len(order) * block_s * 1.5 + END_MARGIN_S:
            config.setdefault("rounds_cut", {})[phase] = f"after {r} rounds: the job's budget"
            break
        row: dict[str, Any] = {"phase": phase}
        for name in (order if r % 2 == 0 else order[::-1]):
            row[name], schedule_s = _timed(runs[name], sync)
            config["sides"][name].setdefault("block_s", []).append(row[name])
            if schedule_s is not None:
                config["sides"][name].setdefault("schedule_s", []).append(schedule_s)
        config["rounds"].append(row)
        save()


def _first_step(spec: ModelSpec, precision: str, batch_size: int, device: torch.device, compile: bool,
                loss: str, record: dict[str, Any], compile_backend: Any = "inductor") -> TunedLoop:
    """The tuned side built (``build_s``) and its first step run (``first_step_s``: the compilation)."""
    t0 = time.perf_counter()
    tuned = TunedLoop(spec, precision, batch_size, device, compile=compile, loss=loss, backend=compile_backend)
    record["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tuned.run(1)
    _sync(device)()  # sync point, warm-up: the first step (compilation) ends on the device
    record["first_step_s"] = time.perf_counter() - t0
    return tuned


def _cache_counts() -> dict[str, int]:
    """Inductor's FX-graph cache so far in this process: graphs found compiled (a carried or earlier
    cache: compiles saved) and graphs compiled anew."""
    from torch._dynamo.utils import counters

    return {"hits": int(counters["inductor"].get("fxgraph_cache_hit", 0)),
            "misses": int(counters["inductor"].get("fxgraph_cache_miss", 0))}


def _cache_delta(before: dict[str, int]) -> dict[str, int]:
    after = _cache_counts()
    return {k: after[k] - before[k] for k in after}


def _timed(fn: Callable[[], float | None], sync: Callable[[], None]) -> tuple[float, float | None]:
    """(the block's time, the worker's whole schedule or None): the time ``fn`` returns (a worker
    side's measured window, which starts and ends on an idle device) with the wall time around it,
    else the wall time from an idle device to one sync."""
    sync()  # sync point: the block starts on an idle device
    t0 = time.perf_counter()
    window_s = fn()
    sync()  # sync point: the block's one synchronisation, at its end
    wall_s = time.perf_counter() - t0
    return (wall_s, None) if window_s is None else (window_s, wall_s)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"


def _flops_per_sample(spec: ModelSpec) -> float | None:
    from jobs.models import build_model, flops_per_sample

    with torch.device("meta"):
        return flops_per_sample(build_model(spec), spec)


def worker_spec_plain(args, spec: ModelSpec, strategy: str, precision: str, device: torch.device,
                      block_steps: int, out_dir: Path) -> dict[str, Any]:
    """A RunSpec's plain form for one worker side: each block is a whole schedule of ``block_steps``
    measured steps (no warm-up, no probes, no checkpoint on a stop request)."""
    from contract.codec import to_plain

    return {"cell": f"tuned-beside strategy={strategy} precision={precision}", "out_dir": str(out_dir),
            "strategy": {"name": strategy}, "precision": {"name": precision}, "model": to_plain(spec), "data": {},
            "train": {"batch_size": args.batch_size, "steps": block_steps, "warmup_steps": 0, "repeats": 1,
                      "warmup_extend_max": 0, "comm_probe_steps": 0, "local_probe_steps": 0},
            "layout": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": int(device.type == "cuda"),
                       "cpus_per_task": torch.get_num_threads()},
            "checkpoint": {"enabled": False}}


class WindowClock(Observer):
    """A worker side's measured window, timed at the worker's own hooks (jobs/hooks.py): "start"
    after the barrier that opens it (the device idle), "end" after the sync that closes it."""

    def __init__(self) -> None:
        self.window_s: float | None = None
        self._start_s = 0.0

    def window(self, event: str) -> None:
        if event == "start":
            self._start_s = time.perf_counter()
        else:
            self.window_s = time.perf_counter() - self._start_s


def worker_side(args, spec: ModelSpec, strategy: str, precision: str, env, device: torch.device, backend: str,
                control_group, block_steps: int, out_dir: Path, compile_backend: Any = "inductor",
                before_first_block: Callable[[Any, Any], None] | None = None, extra_settings: list[str] | None = None):
    """(what the side records, (its block, its Setup) or None when it could not be built).
    ``before_first_block(setup, rank)``: called once it is built, before anything runs (the census's hooks)."""
    from contract.codec import from_plain
    from contract.spec import RunSpec
    from jobs.heartbeat import Heartbeat
    from jobs.interference import Interference
    from jobs.rankrun import Rank, Run
    from jobs.sinks import NullSink
    from jobs.worker import run_schedule, set_up

    wanted = worker_tuning(args.model, strategy, cuda=device.type == "cuda")
    wanted.update({k: json.loads(v) for k, v in (item.split("=", 1) for item in [*args.worker_set,
                                                                                *(extra_settings or [])])})
    known, unknown = split_known(wanted)
    side: dict[str, Any] = {"settings_set": known, "settings_not_in_spec": unknown, "settings_refused": []}
    print(f"tuned.py: {strategy} {precision}: set {describe(known)}; not in this tree's spec: "
          f"{', '.join(unknown) or 'none'}", file=sys.stderr, flush=True)
    try:
        while True:
            plain = worker_spec_plain(args, spec, strategy, precision, device, block_steps, out_dir)
            for path, value in known.items():
                set_path(plain, path, value)
            run_spec = from_plain(RunSpec, plain)
            out_dir.mkdir(parents=True, exist_ok=True)
            heartbeat = Heartbeat(out_dir, 0, socket.gethostname(), stall_timeout_s=3600)
            clock = WindowClock()
            rank = Rank(run_spec, env, device, backend, NullSink(), heartbeat, clock, control_group)
            t0 = time.perf_counter()
            try:
                for part in (run_spec.strategy, run_spec.precision, run_spec.model, run_spec.data, run_spec.train,
                             run_spec.checkpoint):
                    part.validate()  # a refused setting fails here with its ConfigError, as the launcher would
                setup = set_up(rank, compile_backend)
                break
            except ConfigError as exc:
                # A tuning setting this tree refuses (on this device): said, dropped, and the side built
                # without it, so that one refusal does not cost the one-shot run its worker figures.
                key = refused_key(exc.setting, known)
                if key is None:
                    raise
                side["settings_refused"].append(f"{key}={known.pop(key)!r}: {exc}")
                print(f"tuned.py: {strategy} {precision}: refused {side['settings_refused'][-1]}", file=sys.stderr,
                      flush=True)
        side["build_s"] = time.perf_counter() - t0
        # The worker's per-step sync point, as jobs.worker.benchmark sets it.
        run = Run(rank, setup, Interference(device), _sync(device))

        def block() -> float | None:
            run_schedule(run)
            return clock.window_s

        if before_first_block is not None:
            before_first_block(setup, rank)
        cache_before = _cache_counts()
        warm = [_timed(block, _sync(device))[0] for _ in range(max(1, args.warmup_blocks))]
        side["inductor_cache"] = _cache_delta(cache_before)
        side["first_block_s"], side["warmup_block_s"] = warm[0], warm[1:]
        return side, (block, setup)
    except Exception as exc:
        side["error"] = _error(exc)
        print(f"tuned.py: {strategy} {precision} failed: {side['error']}", file=sys.stderr, flush=True)
        return side, None


def anatomy_one_rank(setup, n_steps: int, device: torch.device) -> dict[str, float] | str:
    """The step's anatomy at one rank (jobs.anatomy.probe), on a worker side's trainer."""
    from jobs import anatomy
    from jobs.loop import StepTrace, run_steps

    trace = StepTrace()
    try:
        return anatomy.probe(lambda n: run_steps(setup.trainer, setup.batches, n, _sync(device), trace),
                             setup.trainer, n_steps, on_gpu=device.type == "cuda", world_size=1)
    except Exception as exc:
        return _error(exc)


def fabric_one_rank(device: torch.device) -> dict[str, Any]:
    """The fabric probe's own timing (jobs.fabric.time_collective) of each collective at one rank:
    the fixed cost of a call on this device's backend, which DDP and FSDP pay at one rank too."""
    from contract.fabric import COLLECTIVES, ProbeSpec, sizes
    from contract.spec import Layout
    from jobs.fabric import time_collective

    probe = ProbeSpec(out_dir="", layout=Layout(gpus_per_node=int(device.type == "cuda")), iters=20, warmup_iters=5)
    points = []
    try:
        for collective in COLLECTIVES:
            for size in sizes(1024, 64 * 2**20, 16):
                seconds = time_collective(collective, None, 1, size, probe, device)
                points.append({"collective": collective, "size_bytes": size, "time_us": seconds * 1e6,
                               "algbw_gbps": size / seconds / 1e9})
        return {"backend": str(torch.distributed.get_backend()), "points": points}
    except Exception as exc:
        return {"error": _error(exc), "points": points}


if __name__ == "__main__":
    main()
