"""Figure 1c: the worker's step path against the bare step, alternating blocks in ONE torchrun job.

    torchrun --standalone --nproc-per-node 2 bench/paired_steps.py --strategy fsdp --out paired.json

Figure 1 compares two separate jobs, and on a small shared machine two identical jobs minutes
apart differ by 5-25%: more than the 2% the target allows. Here both sides live in the same
processes, so whatever moves one run (the host's other tenants, where memory landed, core
frequency) moves both:

* bare: a copy of the model wrapped as bench/bare_loop.py wraps it (DDP, or ``fully_shard`` per
  block and the root), the nanoGPT-style step (forward, cross-entropy, backward, AdamW step,
  zero_grad);
* ours: another copy built and wrapped by the worker's public steps (``jobs.parallel.parallelize``), run by
  the worker's own step schedule ``jobs.schedule.run`` for the block (``Trainer.step``, per-step
  timing and history, the heartbeat, the stop-request agreement; a fresh schedule per block, so
  each block also pays the schedule's start: a checkpoint lookup, signal handlers, one agreement).

Blocks of ``--block-steps`` steps alternate (ours, bare, bare, ours, ...), each starting after a
barrier; rank 0 writes every rank's block times. The suite (bench/paired.py) takes each block's
slowest rank and divides neighbouring blocks: bare time / our time is our throughput relative to
the bare one, one ratio per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="fsdp")
    p.add_argument("--model", default="gpt_tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--input", choices=("tokens", "image"), default="tokens", help="image: a CNN (DDP only)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--blocks", type=int, default=16, help="blocks per side")
    p.add_argument("--block-steps", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=5, help="per side, before the first block")
    p.add_argument("--out")
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    if args.input == "image" and args.strategy != "ddp":
        p.error("--input image runs DDP only: the bare FSDP side wraps a transformer's blocks")

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from contract.parallel import ParallelDims
    from contract.spec import InputKind, Layout, ModelSpec, PrecisionSpec, Strategy, StrategySpec
    from jobs import memory, parallel, schedule
    from jobs.data import synthetic_batches
    from jobs.dist import DistEnv, backend_for, choose_device
    from jobs.heartbeat import Heartbeat
    from jobs.loop import Trainer
    from jobs.models import build_model

    env = DistEnv.detect(os.environ)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # The worker's device choice: GPUs when the host has them (one per local rank), else CPU.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name, backend = choose_device(gpus, env.local_rank, env.local_world_size, gpus)
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dist.init_process_group(backend_for(device.type), device_id=device if device.type == "cuda" else None)
    control_group = dist.new_group(backend="gloo")  # as jobs.dist.process_group opens it for the worker
    spec = ModelSpec(name=args.model, input=InputKind(args.input), seq_len=args.seq_len, vocab_size=args.vocab_size,
                     image_size=args.image_size)

    def fresh_model():
        torch.manual_seed(0)
        return build_model(spec).to(device)

    # Bare side: as bench/bare_loop.py.
    bare_model = fresh_model()
    if args.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        bare_model = DistributedDataParallel(bare_model, device_ids=[env.local_rank] if device.type == "cuda" else None)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (env.world_size,))
        for block in bare_model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(bare_model, mesh=mesh, reshard_after_forward=False)
    bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-4)
    bare_batches = synthetic_batches(spec, args.batch_size, 0, env.rank, device)

    def bare_block(n: int) -> None:
        for _ in range(n):
            x, y = next(bare_batches)
            logits = bare_model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            loss.backward()
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)
            loss.detach()
            sync()

    # Our side: the worker's public steps (parallelize, build_optimizer, the schedule) with its defaults.
    strat = StrategySpec(name=Strategy(args.strategy))
    torch.manual_seed(0)
    with torch.device("meta" if strat.name is Strategy.fsdp else device):
        ours_model = build_model(spec)
    par = parallel.parallelize(ours_model, strat, PrecisionSpec(), device=device, dims=ParallelDims.of(
        strat, Layout(nodes=env.num_nodes, tasks_per_node=env.local_world_size)))
    # The optimizer the worker's default resolves to (contract/tuning.py: fused where torch has the kernel).
    ours_opt, _ = parallel.optimizer_for(par.model, "adamw", 1e-4, "fused", auto=True)
    trainer = Trainer(par.model, ours_opt, accum_steps=1, autocast_dtype=par.autocast_dtype, device=device,
                      no_sync=par.no_sync, scaler=par.scaler)
    ours_batches = synthetic_batches(spec, args.batch_size, 0, env.rank, device)
    run_dir = Path(tempfile.mkdtemp(prefix="paired-"))
    heartbeat = Heartbeat(run_dir, env.rank, env.hostname, stall_timeout_s=300)
    hooks = schedule.Hooks(sync=sync, on_step=heartbeat.beat,
                           reset_peak_memory=lambda: memory.reset_peak_memory(device))

    def ours_block(n: int) -> None:
        schedule.run(trainer, ours_batches, env=env, device=device, out_dir=run_dir,
                     schedule=schedule.Schedule(total_steps=n, warmup_steps=0), hooks=hooks,
                     control_group=control_group)

    def timed(fn) -> float:
        dist.barrier()  # both sides start a block together, as both loops start their window
        t0 = time.perf_counter()
        fn(args.block_steps)
        return time.perf_counter() - t0

    ours_block(args.warmup_steps)
    bare_block(args.warmup_steps)
    ours_s, bare_s = [], []
    for i in range(args.blocks):
        if i % 2 == 0:
            ours_s.append(timed(ours_block))
            bare_s.append(timed(bare_block))
        else:
            bare_s.append(timed(bare_block))
            ours_s.append(timed(ours_block))
    heartbeat.close("finished")
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, {"ours_block_s": ours_s, "bare_block_s": bare_s})
    if env.rank == 0:
        result = {"strategy": args.strategy, "world_size": env.world_size, "backend": backend,
                  "blocks": args.blocks, "block_steps": args.block_steps, "ranks": per_rank}
        print(json.dumps(result), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
