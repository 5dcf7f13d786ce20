"""Real multi-rank runs of ``jobs.worker.main`` on gloo, without the launcher or submitit.

``run_ranks(specs, world_size, nodes=...)`` starts ``world_size`` Python processes with a
torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR=127.0.0.1, MASTER_PORT), so ``jobs.dist.DistEnv.detect`` reads the layout exactly as
under torchrun; ``nodes > 1`` emulates that many nodes of ``world_size // nodes`` ranks (HSDP).

GPU specs (``layout.gpus_per_node > 0``): each emulated node's processes see only that node's
share of this process's GPUs (CUDA_VISIBLE_DEVICES: node k gets devices k*n .. k*n+n-1 of those
visible here, n ranks per node), so a box with more GPUs than ranks runs them as a node with
exactly its ranks' GPUs; the worker refuses any other count (jobs.dist.choose_device).

Every process runs all ``specs`` one after another, each on a fresh free port (importing torch
costs more than a tiny run, so several runs share one start-up). A spec that raises on a rank is
recorded as ``{"error": ...}`` for that rank and the next spec still runs. The whole call has a
deadline: past it every process is killed and :class:`RanksTimeout` raised, so a deadlocked
collective fails the test instead of hanging it.

Also runnable as ``python tests/ranks.py <job.pkl> <rank>``: that is the child side.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The variables another launcher may have left in the test's environment; DistEnv.detect would
# read them, so the children never inherit them.
_FOREIGN_PREFIXES = ("SLURM_", "SUBMITIT_", "TORCHELASTIC_")


class RanksFailed(AssertionError):
    """A rank process died (not a spec raising inside it: that is recorded in its result)."""


class RanksTimeout(RanksFailed):
    """The ranks did not finish before the deadline; every one was killed."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports, free now, below the kernel's ephemeral range.

    The ports are used minutes later (one per spec, in turn). A port from the ephemeral range (what
    binding port 0 gives) can meanwhile become the local end of any outgoing connection (gloo's
    pairs, MLflow's client), and a store then fails with EADDRINUSE while its peer rank connects to
    the wrong listener and hangs. Below that range only an explicit bind takes a port.
    """
    try:
        ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768
    # Above jobs.dist's Slurm-derived ports (10000-29999), which other tests hold on purpose.
    candidates = list(range(30000, ephemeral_start))
    random.shuffle(candidates)
    ports = []
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports between 30000 and {ephemeral_start}")


def parent_visible_devices(environ: dict[str, str] | os._Environ, device_count: int) -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()][:device_count]
    return [str(i) for i in range(device_count)]


def rank_environments(base: dict[str, str], world_size: int, nodes: int, devices: Sequence[str] | None
                      ) -> list[dict[str, str]]:
    """Each rank process's environment: torchrun's variables and, for GPU runs (``devices`` given:
    this process's visible GPUs), CUDA_VISIBLE_DEVICES limited to its emulated node's share. A node
    whose share is short (a 1-GPU box running 2 ranks) gets the first devices again: the worker's
    duplicate-GPU check then names the problem."""
    per_node = world_size // nodes
    envs = []
    for rank in range(world_size):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank % per_node), GROUP_RANK=str(rank // per_node))
        if devices is not None:
            node = rank // per_node
            share = list(devices[node * per_node : (node + 1) * per_node]) or list(devices[:per_node])
            env["CUDA_VISIBLE_DEVICES"] = ",".join(share)
        envs.append(env)
    return envs


def _devices_for(spec_list: Sequence[Any]) -> list[str] | None:
    if not any(getattr(getattr(s, "layout", None), "gpus_per_node", 0) > 0 for s in spec_list):
        return None
    import torch

    return parent_visible_devices(os.environ, torch.cuda.device_count() if torch.cuda.is_available() else 0)


def splits_the_world_group(spec: Any) -> bool:
    """Whether ``spec``'s ranks build a 2-D mesh on CUDA (HSDP, no-shard), which splits the world
    group once a device is bound to it."""
    from contract.parallel import ParallelDims

    return spec.layout.gpus_per_node > 0 and len(ParallelDims.of(spec.strategy, spec.layout).mesh_dims) == 2


def run_ranks(specs: Any | Sequence[Any], world_size: int, *, nodes: int = 1, timeout_s: float = 120.0,
              entry: str = "jobs.worker") -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
    """Run ``specs`` (one RunSpec or a list) on ``world_size`` gloo ranks as ``nodes`` nodes.

    Returns, per spec, each rank's result in rank order: ``jobs.worker.main``'s return value (or
    that of the ``main`` of module ``entry``: ``jobs.fabric`` runs the fabric probe), or
    ``{"error": "<traceback>"}`` where that spec raised on that rank. A single spec in gives a single
    per-rank list out.
    """
    single = not isinstance(specs, (list, tuple))
    spec_list = [specs] if single else list(specs)
    if world_size % nodes:
        raise ValueError(f"world_size={world_size} is not a multiple of nodes={nodes}")
    if len(spec_list) > 1 and world_size > 1 and any(splits_the_world_group(s) for s in spec_list):
        # Fresh rank processes per spec: with a bound device (torch 2.9+) a 2-D mesh splits the
        # world group, and torch 2.13's gloo split crashes (SIGSEGV) on a world group that is not
        # the process's first gloo group (GPU review 3, G6; pytorch#192106). The worker runs one
        # spec per process, so only a harness that runs several in one process meets it.
        return [run_ranks(s, world_size, nodes=nodes, timeout_s=timeout_s, entry=entry) for s in spec_list]
    per_node = world_size // nodes
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        work = Path(tmp)
        job = work / "job.pkl"
        job.write_bytes(pickle.dumps({"specs": spec_list, "ports": free_ports(len(spec_list)), "entry": entry}))
        base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        base.update(
            WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR="127.0.0.1",
            # One thread per rank: the ranks share this machine's cores (the spec's
            # layout.cpus_per_task sets torch's threads the same way).
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        procs = []
        try:
            for rank, env in enumerate(rank_environments(base, world_size, nodes, _devices_for(spec_list))):
                log = open(work / f"rank{rank}.log", "wb")
                procs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), str(job), str(rank)],
                    cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: killed as a whole on timeout
                ))
                log.close()
            _wait(procs, work, timeout_s)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    _kill(proc)
        per_rank = [pickle.loads((work / f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
    results = [[per_rank[r][i] for r in range(world_size)] for i in range(len(spec_list))]
    return results[0] if single else results


PRESETS = Path(__file__).resolve().parent.parent / "launcher" / "conf" / "strategy"


def preset(name: str, tasks_per_node: int) -> dict[str, Any]:
    """The strategy config file launcher/conf/strategy/NAME.yaml as StrategySpec arguments (by
    value), its one interpolation (hsdp's shard group of a node's ranks) resolved for
    ``tasks_per_node``: the presets live in one place, which the tests read too."""
    import yaml

    fields = yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
    return {k: tasks_per_node if v == "${cluster.tasks_per_node}" else v for k, v in fields.items()}


def preset_args(name: str, tasks_per_node: int, **overrides: Any) -> dict[str, Any]:
    """:func:`preset` with ``overrides``, its choices as the StrategySpec's enums."""
    from contract import spec as s

    fields = {**preset(name, tasks_per_node), **overrides}
    for key, choice in (("name", s.Strategy), ("sharding", s.Sharding), ("wrap", s.WrapPolicy)):
        if key in fields:
            fields[key] = choice(fields[key])
    return fields


STRATEGIES = sorted(p.stem for p in PRESETS.glob("*.yaml"))

# A gpt_tiny small enough that a 4-rank run of a few steps takes about a second on 2 cores.
TINY_GPT = dict(name="gpt_tiny", input="tokens", seq_len=16, vocab_size=128,
                params={"n_layer": 2, "n_head": 2, "d_model": 32})
TINY_CNN = dict(name="cnn", input="image", image_size=16, num_classes=10, params={"width": 8, "n_layer": 2})


def make_spec(out_dir: str | Path, *, strategy: str = "ddp", precision: str = "fp32", nodes: int = 1,
              world_size: int = 2, model: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
              strategy_args: dict[str, Any] | None = None,
              precision_args: dict[str, Any] | None = None, gpus_per_node: int = 0, **train: Any):
    """A RunSpec for ``run_ranks``: tiny gpt_tiny by default, tracking off, results under ``out_dir``.

    ``train`` overrides TrainSpec fields (steps, batch_size, lr, optimizer, grad_accum_steps, ...);
    ``precision_args`` PrecisionSpec fields (mode, batchnorm, given by value); ``gpus_per_node``
    > 0 runs the ranks on CUDA (one GPU each).
    """
    from contract import spec as s

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    m = dict(TINY_GPT if model is None else model)
    strat = preset_args(strategy, world_size // nodes, **(strategy_args or {}))
    d = dict(data or {})
    if "kind" in d:
        d["kind"] = s.DataKind(d["kind"])
    t = {**dict(batch_size=4, steps=5, warmup_steps=1, seed=0, optimizer="adamw", lr=1e-2), **train}
    t["optimizer"] = s.Optimizer(t["optimizer"])
    if "lr_scaling" in t:
        t["lr_scaling"] = s.LrScaling(t["lr_scaling"])
    run = s.RunSpec(
        cell=out.name, out_dir=str(out),
        strategy=s.StrategySpec(**strat),
        precision=s.PrecisionSpec(name=s.Precision(precision), **_precision_args(precision_args)),
        model=s.ModelSpec(**{**m, "input": s.InputKind(m["input"])}),
        data=s.DataSpec(**d),
        train=s.TrainSpec(nodes=nodes, **t),
        layout=s.Layout(nodes=nodes, tasks_per_node=world_size // nodes, cpus_per_task=1,
                        gpus_per_node=gpus_per_node),
        tracking_uri=None, run_id=None, collective_timeout_s=60.0,
    )
    for part in (run.strategy, run.precision, run.model, run.data, run.train):
        part.validate()
    return run


def _precision_args(args: dict[str, Any] | None) -> dict[str, Any]:
    from contract import spec as s

    out = dict(args or {})
    if "mode" in out:
        out["mode"] = s.PrecisionMode(out["mode"])
    if "batchnorm" in out:
        out["batchnorm"] = s.BatchNormUnits(out["batchnorm"])
    return out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tails(work: Path, n: int) -> str:
    parts = []
    for r in range(n):
        log = work / f"rank{r}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        parts.append(f"--- rank {r} ---\n" + "\n".join(text.splitlines()[-25:]))
    return "\n".join(parts)


def _wait(procs: list[subprocess.Popen], work: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        if any(c not in (None, 0) for c in codes):
            # One rank died outright; its peers would wait for it until the collective timeout.
            for proc in procs:
                if proc.poll() is None:
                    _kill(proc)
            raise RanksFailed(f"rank exit codes {[p.returncode for p in procs]}\n{_tails(work, len(procs))}")
        time.sleep(0.05)
    for proc in procs:
        _kill(proc)
    raise RanksTimeout(f"ranks still running after {timeout_s:.0f} s; killed\n{_tails(work, len(procs))}")


def _child(job_path: str, rank: int) -> None:
    import importlib

    job = pickle.loads(Path(job_path).read_bytes())
    main = importlib.import_module(job["entry"]).main
    results = []
    for spec, port in zip(job["specs"], job["ports"], strict=True):
        os.environ["MASTER_PORT"] = str(port)
        try:
            results.append(main(spec))
        except Exception:
            results.append({"error": traceback.format_exc()})
    out = Path(job_path).with_name(f"rank{rank}.pkl")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(results))
    tmp.rename(out)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo occasionally aborts in its thread destructors at exit
    # ("terminate called without an active exception") after the results are complete.
    os._exit(0)


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
