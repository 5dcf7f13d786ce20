"""The reference: a hand-written nanoGPT-style training loop, DDP or FSDP2, launched with torchrun.

    torchrun --standalone --nproc-per-node 2 bench/bare_loop.py --strategy ddp --out bare.json

No harness: init_process_group, the same model (jobs.models.build_model, so both sides train the
very same network; GPT family), DDP or fully_shard per block and then the root, AdamW, a small
pool of synthetic batches made up front, and one timed window after a barrier, with each step's
start recorded (the median step cycle is the figure that another process on a shared machine
moves least). Rank 0 writes one JSON object with the figures the suite compares to the worker.

Deliberately the same choices as the worker where a choice exists, so that a ratio measures the
harness and nothing else: threads per rank from OMP_NUM_THREADS, the root FSDP unit kept
gathered after forward (torchtitan's choice, and the worker's), no per-step .item().
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

# Taken before any heavy import: the process start as this script sees it (the suite records the
# command's own start; this one shows how much of the gap is Python and torch start-up).
SCRIPT_START_UNIX_S = time.time()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--model", default="gpt_tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--steps", type=int, default=30, help="warm-up included")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="rank 0 writes its JSON result here (default: stdout only)")
    return p


def main() -> None:
    args = parser().parse_args()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from contract.spec import ModelSpec
    from jobs.models import build_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)

    torch.manual_seed(args.seed)
    model = build_model(ModelSpec(name=args.model, seq_len=args.seq_len, vocab_size=args.vocab_size)).to(device)
    if args.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(args.seed * 100_003 + rank)
    pool = torch.randint(0, args.vocab_size, (4 * args.batch_size, args.seq_len + 1), generator=gen)
    batches = [(pool[i : i + args.batch_size, :-1].contiguous().to(device),
                pool[i : i + args.batch_size, 1:].contiguous().to(device))
               for i in range(0, len(pool), args.batch_size)]

    def step(i: int) -> torch.Tensor:
        x, y = batches[i % len(batches)]
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    first_step_unix_s = time.time()
    for i in range(args.warmup_steps):
        step(i)
        sync()
    dist.barrier()
    measured = args.steps - args.warmup_steps
    starts = []
    cpu0 = time.process_time()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for i in range(args.warmup_steps, args.steps):
        starts.append(time.perf_counter())
        loss = step(i)
        sync()  # sync point: on CUDA a step is done when the device is (the worker syncs per step too)
    t1 = time.perf_counter()
    # CPU time of the whole process (gloo's threads included) over the window: unlike wall time,
    # another process taking the core does not move it.
    cpu_window_s = time.process_time() - cpu0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    window_s = t1 - t0
    # Step cycle times, start to start: their median is the steady-state step time, which a step
    # that another process pre-empted does not move (this machine may be shared).
    cycles = [b - a for a, b in zip(starts, starts[1:] + [t1], strict=True)]

    # Global throughput as the worker defines it: the sum over ranks of each rank's own rate.
    rates = [None] * world
    dist.all_gather_object(rates, (args.batch_size * measured / window_s,
                                   args.batch_size / statistics.median(cycles),
                                   args.batch_size * measured / cpu_window_s, faults / measured))
    if rank == 0:
        result = {
            "impl": "bare", "strategy": args.strategy, "world_size": world, "backend": backend,
            "threads": torch.get_num_threads(), "measured_steps": measured,
            "window_s": window_s, "throughput_samples_per_s": sum(r[0] for r in rates),
            "median_step_throughput_samples_per_s": sum(r[1] for r in rates),
            "samples_per_cpu_s": sum(r[2] for r in rates),
            "minor_faults_per_step": sum(r[3] for r in rates) / world,
            "loss_last": float(loss), "script_start_unix_s": SCRIPT_START_UNIX_S,
            "first_step_unix_s": first_step_unix_s, "torch_version": torch.__version__,
        }
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
