"""launcher.plan.fit's per-rank prediction against what the worker measures, on real gloo ranks.

For each strategy, one spawn of real ranks (2, or 4 as 2 nodes x 2 for hsdp) loops over the
project models. Inside the ranks every model goes through the worker's own sequence
(``jobs.worker.build_model_to_wrap``: on meta for FSDP; ``jobs.parallel.parallelize``;
``jobs.parallel.build_optimizer``; one ``jobs.loop.Trainer`` step on a tiny synthetic batch, which
reads the gradient bytes while gradients exist), then ``jobs.memory.model_state_bytes`` with
those gradient bytes, reduced max over ranks as the worker's summary does. AdamW and SGD each get
their own optimizer on the same wrapped model, both stepped on the gradients of one Trainer step.

The models too big to step here in reasonable time (gpt2-medium/large/xl, resnet101/152, and
gpt2-small, bert-base, resnet50 under every strategy but fsdp) are checked without a step: they
are built on meta and sharded on meta with the worker's FSDP units (``jobs.parallel.apply_fsdp``
over ``jobs.parallel.fsdp_mesh``), and the prediction's parameter bytes are compared with the
exact bytes of the local shards each rank then holds (gradients and optimizer state follow those
shards; the stepped models check that part).

Run with ``-s`` to see the table of predicted and measured bytes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

from tests.ranks import _FOREIGN_PREFIXES, REPO, RanksFailed, _kill, _wait, free_ports, make_spec

TOLERANCE = 0.05

# Every project model that steps on 2 CPU cores in reasonable time; seq_len 16 (GPT's position
# table follows it), the configs' own vocabularies and class counts (odd vocabularies exercise
# FSDP2's uneven shards), image_size 32.
HF_CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
             "num_key_value_heads": 2}  # launcher/conf/model/hf.yaml's tiny defaults
STEPPED = {
    "gpt_tiny": dict(name="gpt_tiny", input="tokens", seq_len=16, vocab_size=4096),
    "gpt2-small": dict(name="gpt2-small", input="tokens", seq_len=16, vocab_size=50257),
    "bert-base": dict(name="bert-base", input="tokens", seq_len=16, vocab_size=30522),
    "resnet18": dict(name="resnet18", input="image", image_size=32, num_classes=1000),
    "resnet50": dict(name="resnet50", input="image", image_size=32, num_classes=1000),
    "mlp": dict(name="mlp", input="image", image_size=32, num_classes=10),
    "cnn": dict(name="cnn", input="image", image_size=32, num_classes=10),
    "hf-gpt2": dict(name="hf", arch="gpt2", input="tokens", seq_len=16, vocab_size=512, config=HF_CONFIG),
    "hf-llama": dict(name="hf", arch="llama", input="tokens", seq_len=16, vocab_size=512, config=HF_CONFIG),
}
# The three largest stepped models (25M-124M parameters) take 3-20 s each on 2 busy cores: they
# are stepped under fsdp (uneven shards of gpt2's 50257-row vocabulary, gradients and optimizer
# state included) and checked by sharded shapes under the other strategies, where the small
# models are stepped.
STEPPED_UNDER_FSDP_ONLY = ("gpt2-small", "bert-base", "resnet50")
# Too big to step here: shapes only (sharded on meta, no memory, no step).
SHAPES_ONLY = {
    "gpt2-medium": dict(name="gpt2-medium", input="tokens", seq_len=1024, vocab_size=50257),
    "gpt2-large": dict(name="gpt2-large", input="tokens", seq_len=1024, vocab_size=50257),
    "gpt2-xl": dict(name="gpt2-xl", input="tokens", seq_len=1024, vocab_size=50257),
    "resnet101": dict(name="resnet101", input="image", image_size=224, num_classes=1000),
    "resnet152": dict(name="resnet152", input="image", image_size=224, num_classes=1000),
}
OPTIMIZERS = ("adamw", "sgd")
# strategy -> (world size, nodes)
LAYOUTS = {"ddp": (2, 1), "fsdp": (2, 1), "zero2": (2, 1), "fsdp_noshard": (2, 1), "hsdp": (4, 2)}


def _stepped_here(name: str, strategy: str) -> bool:
    return name in STEPPED and (strategy == "fsdp" or name not in STEPPED_UNDER_FSDP_ONLY)


def _specs(tmp: Path, strategy: str) -> dict:
    world, nodes = LAYOUTS[strategy]
    specs = {}
    for name, model in {**STEPPED, **SHAPES_ONLY}.items():
        for optimizer in OPTIMIZERS:
            # Batch 2 for images: BatchNorm needs more than one value per channel (ResNet's last
            # stage is 1x1 at image_size 32); batch 1 for tokens.
            batch = 2 if model["input"] == "image" else 1
            specs[name, optimizer] = make_spec(tmp / name, strategy=strategy, nodes=nodes, world_size=world,
                                               model=model, optimizer=optimizer, batch_size=batch, steps=1,
                                               warmup_steps=0, comm_probe_steps=0)
    return specs


class _Both:
    """The Trainer's optimizer: AdamW and SGD stepped on the same gradients, so one forward and
    backward serves both (each keeps its own state; the parameters are only read for the count)."""

    def __init__(self, optimizers: dict) -> None:
        self.optimizers = optimizers

    def step(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)


def _stepped(spec_by_optimizer: dict, env, device) -> dict:
    """The worker's build, wrap and first step; its model-state bytes per optimizer, max over ranks."""
    import torch

    from contract.parallel import ParallelDims
    from jobs import memory, parallel, summary, worker
    from jobs.data import input_batches
    from jobs.loop import Trainer

    spec = next(iter(spec_by_optimizer.values()))
    train = spec.train
    par = parallel.parallelize(worker.build_model_to_wrap(spec, device), spec.strategy, spec.precision, device=device,
                               dims=ParallelDims.of(spec.strategy, spec.layout))
    optimizers = {name: parallel.build_optimizer(par.model, s.train.optimizer, s.train.lr)
                  for name, s in spec_by_optimizer.items()}
    batches = input_batches(spec.data, spec.model, batch_size=train.batch_size, accum_steps=1, seed=train.seed,
                            rank=env.rank, world_size=env.world_size, device=device)
    trainer = Trainer(par.model, _Both(optimizers), accum_steps=1, autocast_dtype=par.autocast_dtype, device=device,
                      no_sync=par.no_sync, scaler=par.scaler)
    trainer.step(batches)
    out = {}
    for name, optimizer in optimizers.items():
        mine = memory.model_state_bytes(par.model, optimizer, grad_bytes=trainer.grad_bytes)
        out[name] = {k: max(r[k] for r in summary.gather_ranks(mine)) for k in mine}
    del trainer, optimizers, par
    torch.distributed.barrier()
    return out


def _sharded_on_meta(spec, env) -> dict:
    """Parameter bytes of each rank's local shards, sharded on meta with the worker's units."""
    import torch

    from contract.parallel import ParallelDims
    from contract.spec import Strategy
    from jobs import memory, models, parallel, summary

    with torch.device("meta"):
        model = models.build_model(spec.model)
    if spec.strategy.name is Strategy.fsdp:
        mesh = parallel.fsdp_mesh("cpu", ParallelDims.of(spec.strategy, spec.layout))
        parallel.apply_fsdp(model, mesh, units=models.shard_units(model), reshard_after_forward=True,
                            param_dtype=None, reduce_dtype=None, cpu_offload=False, prefetch=0)
    mine = {"param_bytes": sum(memory.local_bytes(p) for p in model.parameters())}
    return {k: max(r[k] for r in summary.gather_ranks(mine)) for k in mine}


def _child(job_path: str, rank: int) -> None:
    """One rank: one process group, every model of the job in turn."""
    import torch

    from jobs.dist import DistEnv, process_group

    job = pickle.loads(Path(job_path).read_bytes())
    env = DistEnv.detect(os.environ)
    torch.set_num_threads(1)
    device = torch.device("cpu")
    results = {}
    with process_group(env, "gloo", timeout_s=120.0):
        models = list(dict.fromkeys(name for name, _ in job["specs"]))
        for name in models:
            by_optimizer = {opt: spec for (n, opt), spec in job["specs"].items() if n == name}
            start = time.perf_counter()
            try:
                if _stepped_here(name, job["strategy"]):
                    for opt, measured in _stepped(by_optimizer, env, device).items():
                        results[name, opt] = measured
                else:
                    results[name, None] = _sharded_on_meta(next(iter(by_optimizer.values())), env)
            except Exception:
                results[name, None] = {"error": traceback.format_exc()}
            results[name, "seconds"] = time.perf_counter() - start
    Path(job_path).with_name(f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's thread destructors occasionally abort at interpreter exit


def _measure(specs: dict, strategy: str, timeout_s: float = 240.0) -> dict:
    world, nodes = LAYOUTS[strategy]
    per_node = world // nodes
    with tempfile.TemporaryDirectory(prefix="fit-") as tmp:
        work = Path(tmp)
        job = work / "job.pkl"
        job.write_bytes(pickle.dumps({"specs": specs, "strategy": strategy}))
        base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_ports(1)[0]), OMP_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        procs = []
        try:
            for rank in range(world):
                env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank % per_node), GROUP_RANK=str(rank // per_node))
                with open(work / f"rank{rank}.log", "wb") as log:
                    procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(job), str(rank)],
                                                  cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
            _wait(procs, work, timeout_s)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    _kill(proc)
        return pickle.loads((work / "rank0.pkl").read_bytes())


def _error(predicted: int, measured: int) -> float:
    return abs(predicted - measured) / measured


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(LAYOUTS))
def test_prediction_within_5_percent_of_measured(tmp_path, strategy):
    from launcher.plan import fit

    specs = _specs(tmp_path, strategy)
    measured = _measure(specs, strategy)
    errors = [f"{name}: {m['error']}" for (name, _), m in measured.items() if isinstance(m, dict) and "error" in m]
    if errors:
        raise RanksFailed("\n".join(errors))
    rows, failures = [], []
    shapes = {}
    for (name, optimizer), spec in specs.items():
        if name not in shapes:
            shapes[name] = fit.analyse(spec.model, spec.train.batch_size, None, False)[0]
        pred = fit.predict(shapes[name], spec.strategy, spec.layout, spec.train.optimizer)
        if _stepped_here(name, strategy):
            got = measured[name, optimizer]
            pairs = [("params", pred.params, got["param_bytes"]), ("grads", pred.grads, got["grad_bytes"]),
                     ("optimizer", pred.optimizer, got["optim_state_bytes"]),
                     ("total", pred.total, got["model_state_bytes"])]
        elif optimizer == OPTIMIZERS[0]:
            pairs = [("params (shapes)", pred.params, measured[name, None]["param_bytes"])]
            optimizer = "-"
        else:
            continue
        for part, p, m in pairs:
            err = _error(p, m)
            if part.startswith(("total", "params (shapes)")):
                rows.append(f"{name:12} {strategy:12} {optimizer:5} {part:15} {p:>14,} {m:>14,} {100 * err:6.2f}% "
                            f"{measured[name, 'seconds']:6.1f}")
            if err > TOLERANCE:
                failures.append(f"{name} {strategy} {optimizer} {part}: predicted {p:,} measured {m:,} "
                                f"({100 * err:.1f}%)")
    print("\n" + "\n".join([f"{'model':12} {'strategy':12} {'optim':5} {'part':15} {'predicted':>14} "
                            f"{'measured':>14} {'error':>7} {'rank 0 s':>6}"] + rows))
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
