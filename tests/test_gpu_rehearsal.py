"""The CUDA path rehearsed on CPU: every branch the CPU build of torch can execute, executed.

No GPU runs here. CUDA is a stateful fake (tests/fake_cuda.py: torch.cuda's queries, fake tensors on
device "cuda", the `fake` process-group backend for 8- and 16-rank jobs), and the real project code
runs on it: the builders, ``jobs.parallel.parallelize`` (fully_shard, materialisation, sharded
initialisation), the data pipeline's device copies, ``jobs.dist.resolve_device``, the placement
check and tests/test_gpu.py's own rank setup.

The matrix: every shipped model (launcher/conf/model/*.yaml, the project's bert-tiny, a user
``_target_`` model, tiny transformers bert and llama) x every strategy (ddp, fsdp, zero2,
fsdp_noshard, hsdp, fsdp_offload) x every precision (fp32, bf16, fp16, and bf16 with
precision.mode=params under FSDP; fp16 autocast, which wraps exactly as bf16 autocast, under ddp,
fsdp and offload only; resnet101, resnet50's blocks 33 times, in bf16 params mode only). Depths are cut to 2 layers where a model takes the setting (the
code path per block is the same; the widths, vocabularies and head counts are the shipped ones).

What each cell checks: after materialisation every parameter (its local shard under FSDP) is on
``cuda:0``, or on the CPU and pinned under offload; every buffer is on ``cuda:0`` (R1); every random
draw of the initialisation ran on the generator DDP's eager build draws from (R6); parameters are
stored in fp32 under every precision; FSDP's mesh, placements, resharding and offload policy are the
strategy's; each FSDP unit's MixedPrecisionPolicy is the precision mode's for its module kind
(BatchNorm fp32 under params mode); the autocast dtype and the GradScaler's device; the first input
batch is on ``cuda:0`` in the model's input dtype.

What it cannot check, because torch cannot execute it on a CPU build (each would abort the process,
not raise): the forward and backward passes (the CPU build cannot create autograd metadata for a
CUDA tensor, and FSDP's forward needs CUDA streams), DDP's reducer (stood in for by a recording
fake, whose arguments are pinned), NCCL, numerics. tests/test_gpu.py runs those on a GPU.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from contract.parallel import ParallelDims
from contract.spec import (
    DataSpec,
    InputKind,
    Layout,
    ModelSpec,
    Precision,
    PrecisionMode,
    PrecisionSpec,
    Strategy,
    StrategySpec,
)
from jobs import dist, memory, models, parallel
from tests import fake_cuda, ranks

REPO = Path(__file__).resolve().parent.parent
CUDA0 = torch.device("cuda", 0)
GPUS_PER_NODE = 8


# ---- the matrix's axes ----------------------------------------------------------------------

def _shipped_models() -> dict[str, dict[str, Any]]:
    """launcher/conf/model/*.yaml as ModelSpec arguments, depth cut to 2 where the model takes it."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "launcher/conf/model").glob("*.yaml")):
        conf = {k: v for k, v in yaml.safe_load(path.read_text()).items() if v is not None}
        if conf["name"] == "custom":  # target: ??? in the file: a user model stands in
            conf = dict(USER_MODEL)
        elif conf["name"].startswith(("gpt2", "gpt_tiny", "bert")):
            conf["params"] = {"n_layer": 2}
        out[path.stem] = conf
    return out


USER_MODEL = dict(name="custom", _target_="tests.test_gpu_path.ConstructorInitLM", input="tokens", seq_len=16,
                  vocab_size=128, params={"vocab_size": 128})
TINY_HF = dict(name="hf", input="tokens", seq_len=32, vocab_size=256,
               config={"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                       "intermediate_size": 64})
MODELS = {
    **_shipped_models(),
    "bert-tiny": dict(name="bert-tiny", input="tokens", seq_len=128, vocab_size=30522),
    # Buffers of their own: BERT's position and token-type ids, llama's rotary inv_freq.
    "hf-bert": dict(TINY_HF, arch="bert"),
    "hf-llama": dict(TINY_HF, arch="llama", config={**TINY_HF["config"], "num_key_value_heads": 2}),
}

STRATEGIES = {name: ranks.preset_args(name, GPUS_PER_NODE) for name in ranks.STRATEGIES}  # conf/strategy/*.yaml
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def model_spec(name: str) -> ModelSpec:
    conf = dict(MODELS[name])
    return ModelSpec(**{**conf, "input": InputKind(conf["input"])})


def layout(strategy: str) -> tuple[int, int]:
    """(nodes, ranks per node): one box of 8, and HSDP across 2 nodes of 8."""
    return (2, GPUS_PER_NODE) if strategy == "hsdp" else (1, GPUS_PER_NODE)


# ---- running one cell -----------------------------------------------------------------------

class RecordingDDP(nn.Module):
    """Stands in for DistributedDataParallel, whose C++ reducer registers autograd hooks on the
    parameters: on fake CUDA tensors that aborts the CPU build. Records what it was given."""

    made: list[dict[str, Any]] = []

    def __init__(self, module: nn.Module, device_ids=None, **kwargs: Any) -> None:
        super().__init__()
        self.module = module
        RecordingDDP.made.append({"device_ids": device_ids, **kwargs})

    def no_sync(self):  # pragma: no cover - never entered here
        raise AssertionError("not run in the rehearsal")


@pytest.fixture
def cuda(monkeypatch):
    """One rank's view of a node of 8 GPUs, as cuda:0 current."""
    import inspect

    state = fake_cuda.install(monkeypatch, visible=GPUS_PER_NODE)
    real_mesh = parallel.fsdp_mesh

    def mesh_of_real_tensors(*args, **kwargs):
        # DeviceMesh reads its rank table's values, which fake tensors do not have.
        with state.real():
            return real_mesh(*args, **kwargs)

    monkeypatch.setattr(parallel, "fsdp_mesh", mesh_of_real_tensors)
    real_ddp = torch.nn.parallel.DistributedDataParallel
    RecordingDDP.__init__.__signature__ = inspect.signature(real_ddp.__init__)  # type: ignore[attr-defined]
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", RecordingDDP)
    RecordingDDP.made = []
    torch.cuda.set_device(0)
    return state


def run_cell(cuda: fake_cuda.FakeCuda, model: str, strategy: str, precision: str, mode: str = "autocast"):
    """Build and wrap one cell on fake CUDA tensors, as jobs.worker.set_up does; returns the
    wrapped model, its Parallelized, and the non-meta random draws of its initialisation."""
    spec = model_spec(model)
    strat = StrategySpec(**STRATEGIES[strategy])
    prec = PrecisionSpec(name=Precision(precision), mode=PrecisionMode(mode))
    nodes, per_node = layout(strategy)
    cuda.recorder.draws.clear()
    with fake_cuda.fake_world(nodes * per_node), cuda.tensors():
        torch.manual_seed(0)
        built = models.build_for(spec, CUDA0, sharded=strat.name is Strategy.fsdp)
        par = parallel.parallelize(built, strat, prec, device=CUDA0,
                                   dims=ParallelDims.of(strat, Layout(nodes=nodes, tasks_per_node=per_node)))
        draws = [d for _, d in cuda.recorder.draws if d is not None and d.type != "meta"]
        x, y = next(iter(_batches(spec)))  # synthetic data: drawn on the host, then copied to the device
    return built, par, draws, (x, y)


def _batches(spec: ModelSpec):
    from jobs.data import input_batches

    return input_batches(DataSpec(), spec, batch_size=2, accum_steps=1, seed=0, rank=0, world_size=1, device=CUDA0)


# ---- the matrix -----------------------------------------------------------------------------

FSDP_MODES = [("fp32", "autocast"), ("bf16", "autocast"), ("fp16", "autocast"), ("bf16", "params")]


# fully_shard moves an eagerly built model's parameters to the device with `param.data = ...`,
# which on the CPU build aborts the process for a CUDA tensor (autograd metadata): not run here.
EAGER_SHARDED = pytest.mark.skip(reason="a _target_ model is built eagerly and fully_shard moves its parameters "
                                 "to CUDA with `.data =`, which aborts the CPU build; its build is checked in "
                                 "test_user_model_is_built_on_the_host_for_every_strategy, its sharding on gloo "
                                 "in tests/test_gpu_path.py::test_user_model_starts_from_the_same_weights_under_ddp_and_fsdp")
CELLS = [pytest.param(m, s, marks=[EAGER_SHARDED] if not models.replays_init(model_spec(m)) and s != "ddp" else [],
                      id=f"{m}-{s}")
         for m in MODELS for s in STRATEGIES]


@pytest.mark.parametrize("model, strategy", CELLS)
def test_cell_places_and_types_every_tensor_as_the_cuda_path_needs(cuda, model, strategy):
    spec = model_spec(model)
    # Draws come from the generator DDP's eager build uses: the device's, or the host's for a
    # user model (built eagerly on the host under every strategy: R4).
    draw_device = CUDA0 if models.replays_init(spec) else torch.device("cpu")
    param_device = torch.device("cpu") if strategy == "fsdp_offload" else CUDA0
    modes = FSDP_MODES if strategy != "ddp" else FSDP_MODES[:3]
    if strategy in ("zero2", "fsdp_noshard", "hsdp"):
        # fp16 autocast wraps exactly as bf16 autocast (no parameter dtype; jobs.parallel.precision_plan,
        # pinned in tests/test_gpu_path.py): its GradScaler is checked under ddp, fsdp and offload.
        modes = [m for m in modes if m != ("fp16", "autocast")]
    if model == "resnet101":  # resnet50's blocks, 33 instead of 16: its other modes run on resnet50
        modes = modes[-1:]
    for precision, mode in modes:
        built, par, draws, (x, y) = run_cell(cuda, model, strategy, precision, mode)
        where = f"{model} {strategy} {precision} {mode}"
        assert draws and set(draws) == {draw_device}, (where, set(draws))
        check_placement(built, strategy, param_device, where)
        check_precision(built, par, strategy, precision, mode, where)
        assert x.device == CUDA0 and y.device == CUDA0, where
        assert x.dtype == (torch.long if spec.input is InputKind.tokens else torch.float32), where


def check_placement(built: nn.Module, strategy: str, param_device: torch.device, where: str) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    for name, buffer in built.named_buffers():
        assert buffer.device == CUDA0, (where, name, buffer.device)  # R1: read by the forward on the device
    for name, param in built.named_parameters():
        assert param.dtype == torch.float32, (where, name, param.dtype)  # fp32 master weights, every mode
        if strategy == "ddp":
            assert not isinstance(param, DTensor) and param.device == CUDA0, (where, name)
            continue
        assert isinstance(param, DTensor), (where, name)
        local = param._local_tensor
        assert local.device == param_device, (where, name, local.device)
        if strategy == "fsdp_offload":
            assert local.is_pinned(), (where, name)  # CPUOffloadPolicy pins (fake: recorded)
        mesh = param.device_mesh
        expected = {"hsdp": ((2, GPUS_PER_NODE), (Replicate(), Shard(0))),
                    "fsdp_noshard": ((GPUS_PER_NODE, 1), (Replicate(), Shard(0)))}.get(
            strategy, ((GPUS_PER_NODE,), (Shard(0),)))
        assert (tuple(mesh.shape), tuple(param.placements)) == expected, (where, name)
        assert mesh.device_type == "cuda", where
    if strategy == "ddp":
        made = RecordingDDP.made[-1]
        assert made["device_ids"] == [0], where  # DDP's one device: this rank's


def check_precision(built: nn.Module, par, strategy: str, precision: str, mode: str, where: str) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    low = LOW.get(precision)
    assert par.autocast_dtype == (low if mode == "autocast" else None), where
    if precision == "fp16":
        assert isinstance(par.scaler, torch.amp.GradScaler) and par.scaler._device == "cuda", where
        assert par.scaler.is_enabled(), where
        # G3: under offload the scale lives on the host with the gradients (no racing D2H copies);
        # otherwise it starts lazily on the loss's device.
        scale = par.scaler._scale
        assert (scale.device.type == "cpu") if strategy == "fsdp_offload" else scale is None, where
    else:
        assert par.scaler is None, where
    if strategy == "ddp":
        return
    units = [m for m in built.modules() if isinstance(m, FSDPModule)]
    assert units and units[0] is built, where  # the root and its blocks are FSDP units
    for unit in units:
        state = unit._get_fsdp_state()
        group = state._fsdp_param_group
        if group is None:
            continue
        policy = group.mp_policy
        kind = type(unit).__bases__[-1].__name__  # fully_shard made it FSDP<Kind>(FSDPModule, Kind)
        if mode == "params" and isinstance(unit, nn.modules.batchnorm._BatchNorm):
            assert policy.param_dtype == torch.float32 and policy.output_dtype == low, (where, kind)
        elif mode == "params":
            assert policy.param_dtype == low and policy.reduce_dtype == torch.float32, (where, kind, policy)
        else:
            assert policy.param_dtype is None, (where, kind, policy)
        offload = isinstance(group.offload_policy, CPUOffloadPolicy)
        assert offload == (strategy == "fsdp_offload"), where
        if unit is not built:  # zero2 keeps a unit's parameters gathered after forward; the others reshard
            assert (group.post_forward_mesh_info is None) == (strategy == "zero2"), (where, kind)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_user_model_is_built_on_the_host_for_every_strategy(cuda, strategy):
    # R4: the constructor is the initialisation; every strategy runs it on the host, from the
    # seeded CPU generator (the same numbers for DDP, FSDP and offload), then DDP moves the model.
    sharded = STRATEGIES[strategy]["name"] is Strategy.fsdp
    with cuda.tensors():
        built = models.build_for(model_spec("custom"), CUDA0, sharded=sharded)
    draws = {d for _, d in cuda.recorder.draws if d is not None}
    assert draws == {torch.device("cpu")}
    assert {p.device for p in built.parameters()} == {torch.device("cpu") if sharded else CUDA0}


def test_ddp_refuses_params_mode_before_building_anything(cuda):
    with pytest.raises(ValueError, match="precision.mode=params with strategy=ddp"):
        run_cell(cuda, "gpt_tiny", "ddp", "bf16", "params")


# ---- R1 and R6 named, with what failed before -------------------------------------------------

def test_offload_keeps_buffers_on_the_device_and_draws_from_its_generator(cuda):
    # Before: materialised with to_empty(device="cpu"), BatchNorm's running statistics stayed on
    # the host (the first forward fails: "Expected all tensors to be on the same device") and the
    # initial weights came from the CPU generator while DDP and FSDP draw from the CUDA one.
    built, _, draws, _ = run_cell(cuda, "cnn", "fsdp_offload", "bf16")
    norms = parallel.batchnorms(built)
    assert norms and all(bn.running_mean.device == CUDA0 and bn.running_var.device == CUDA0 for bn in norms)
    assert all(p._local_tensor.device.type == "cpu" for p in built.parameters())
    assert draws and set(draws) == {CUDA0}


# ---- the other CUDA branches of setup: memory figures, bf16 refusal ----------------------------

def test_memory_figures_read_the_device_allocator_on_cuda(cuda):
    from jobs import memory

    memory.reset_peak_memory(CUDA0)
    assert cuda.calls[-1] == "reset_peak_memory_stats:0"
    cuda.peak_bytes = {"allocated": 3 * memory.GIB, "reserved": 5 * memory.GIB}  # what the setup used
    setup = memory.setup_memory(CUDA0, memory.current_rss_bytes())
    window = memory.peak_memory(CUDA0)
    assert setup["setup_peak_mem_allocated_gib"] == 3
    assert (window["peak_mem_allocated_gib"], window["peak_mem_reserved_gib"]) == (3, 5)
    assert window["peak_rss_gib"] > 0  # host memory on GPU ranks too (offload lives there)


def test_bf16_is_refused_on_a_gpu_before_ampere(cuda, monkeypatch, tmp_path):
    from jobs.worker import refuse_unsupported

    spec = ranks.make_spec(tmp_path, precision="bf16", gpus_per_node=1, world_size=1)
    refuse_unsupported(spec, CUDA0)  # the fake is an H100: 9.0
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    with pytest.raises(ValueError, match="Ampere"):
        refuse_unsupported(spec, CUDA0)


# ---- shard slices without tensor arithmetic -------------------------------------------------

@pytest.mark.parametrize("shape", [(10, 3), (7,), (3, 5), (1, 4), (64, 2)])
def test_shard_slices_equal_torchs_own(shape):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from jobs.shards import local_slices

    for world, mesh_shape, placements in ((8, (8,), (Shard(0),)), (16, (2, 8), (Replicate(), Shard(0))),
                                          (8, (8, 1), (Replicate(), Shard(0)))):
        for rank in (0, 3, world - 1):
            with fake_cuda.fake_world(world, rank=rank):
                from torch.distributed.device_mesh import init_device_mesh

                mesh = init_device_mesh("cpu", mesh_shape)
                local, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
                assert local_slices(shape, mesh, placements) == tuple(
                    slice(o, o + n) for o, n in zip(offset, local, strict=True)), (shape, mesh_shape, rank)


# ---- every tensor written by the deferred initialisation ------------------------------------

@pytest.mark.parametrize("model", [m for m in MODELS if models.replays_init(model_spec(m))])
def test_deferred_init_writes_every_tensor(model):
    # Models built on meta and initialised after sharding (every one but a _target_ model) must
    # have every parameter and buffer written by init_weights: memory poisoned with NaN (integers
    # with their minimum) before it, nothing of the poison left after it. Real CPU tensors, with a
    # small vocabulary (the path does not depend on it).
    conf = dict(MODELS[model])
    if conf["input"] == "tokens":
        conf["vocab_size"] = 256
    spec = ModelSpec(**{**conf, "input": InputKind(conf["input"])})
    with torch.device("meta"):
        built = models.build_model(spec)
    built.to_empty(device="cpu")
    with torch.no_grad():
        for tensor in [*built.parameters(), *built.buffers()]:
            tensor.fill_(float("nan") if tensor.is_floating_point() else torch.iinfo(tensor.dtype).min)
        models.init_weights(built)
    for name, tensor in [*built.named_parameters(), *built.named_buffers()]:
        poisoned = torch.isnan(tensor) if tensor.is_floating_point() else tensor == torch.iinfo(tensor.dtype).min
        assert not poisoned.any(), f"{model}: init_weights leaves {name} unwritten"


# ---- device, backend and visible devices: 1 GPU, one box of 8, 2 nodes x 8 --------------------

def _slurm_env(rank: int, nodes: int, per_node: int) -> dict[str, str]:
    """A Slurm task's variables, as its backend translates them for the rank (launcher/cluster/slurm/ranks.py)."""
    from launcher.cluster.slurm.ranks import torchrun_env

    return torchrun_env({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(nodes * per_node), "SLURM_LOCALID": str(rank % per_node),
            "SLURM_NODEID": str(rank // per_node), "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": f"gpu[1-{nodes}]", "SLURMD_NODENAME": f"gpu{rank // per_node + 1}"})


def _local_env(task: dict[str, str]) -> dict[str, str]:
    """A local task's variables, as its backend translates them (launcher/cluster/local/ranks.py)."""
    from launcher.cluster.local.ranks import torchrun_env

    return torchrun_env(task)


def _torchrun_env(rank: int, world: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}


LAYOUTS = {
    # name: (ranks, gpus_per_node, environment of rank r, GPUs of its node that rank r sees)
    "1 GPU (submitit sets CUDA_VISIBLE_DEVICES=0)": (1, 1, lambda r: _slurm_env(r, 1, 1), lambda r: [0]),
    "8 GPUs, one box, torchrun": (8, 8, lambda r: _torchrun_env(r, 8), lambda r: list(range(8))),
    "8 GPUs, one box, cluster=local": (
        8, 8, lambda r: _local_env({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": str(r),
                                    "SUBMITIT_LOCAL_NTASKS": "8", "SUBMITIT_LOCAL_JOB_ID": "77"}),
        lambda r: list(range(8))),
    "2 nodes x 8, per-task binding": (16, 8, lambda r: _slurm_env(r, 2, 8), lambda r: [r % 8]),
    "2 nodes x 8, the node's 8 visible": (16, 8, lambda r: _slurm_env(r, 2, 8), lambda r: list(range(8))),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_device_backend_and_metric_names_per_layout(monkeypatch, name):
    from jobs.dist import DistEnv, machine_slot, resolve_device
    from tests.test_gpu_figures import FakeNvml

    world, gpus_per_node, environ, visible = LAYOUTS[name]
    placements, prefixes = [], []
    for rank in range(world):
        env = DistEnv.detect(environ(rank))
        state = fake_cuda.install(monkeypatch, visible=visible(rank), node=env.node_rank)
        device, backend = resolve_device(gpus_per_node, env)
        assert device.type == "cuda" and backend == "nccl", name
        assert state.set_device_calls == [device.index], name  # made current before the process group
        assert dist.backend_for(device.type) == "cpu:gloo,cuda:nccl"
        uuid = dist.gpu_uuid(device)
        placements.append((env.hostname if "local" not in name else "box", uuid))
        # The node's NVML: every GPU by UUID -> its index (what nvidia-smi shows).
        nvml = FakeNvml(indices={dist.nvml_uuid(fake_cuda.bare_uuid(i, env.node_rank)): i for i in range(8)})
        from jobs.interference import GpuSampler

        sampler = GpuSampler(nvml, uuid, fallback_index=device.index or 0)
        prefixes.append(f"node{env.node_rank}/gpu{sampler.device_index}")
        slot = machine_slot(env)
        assert slot[1] == (world if "local" in name else min(world, gpus_per_node)), name
    dist.check_unique_gpus(placements)  # no two ranks on one GPU
    assert len(set(prefixes)) == world, prefixes  # R7: one system-metrics name per GPU


def test_a_count_that_fits_no_rule_is_refused_with_the_fix(monkeypatch):
    from jobs.dist import DistEnv, resolve_device

    fake_cuda.install(monkeypatch, visible=4)
    with pytest.raises(RuntimeError, match="sees 4 CUDA devices.*Fix:"):
        resolve_device(8, DistEnv.detect(_slurm_env(3, 2, 8)))


# ---- tests/test_gpu.py's own setup on boxes of 1, 2 and 8 GPUs ------------------------------------

@pytest.mark.parametrize("n_gpus", [1, 2, 8])
def test_gpu_test_module_sets_up_its_ranks_on_any_box(monkeypatch, tmp_path, n_gpus):
    # R2: the children of tests/ranks.py saw every GPU of the box, and the worker (rightly) refuses
    # "sees 8 CUDA devices" for a 1-rank job: every GPU test failed on a box with more GPUs than
    # ranks. Here the module is imported on a fake box of n GPUs and each of its rank setups is
    # driven through ranks.rank_environments and jobs.dist.resolve_device.
    from jobs.dist import DistEnv, resolve_device

    fake_cuda.install(monkeypatch, visible=n_gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_tests = importlib.reload(importlib.import_module("tests.test_gpu"))
    try:
        assert gpu_tests.N_GPUS == n_gpus
        assert gpu_tests.two_gpus.mark.args[0] == (n_gpus < 2)  # the 2-GPU tests run where they can
        jobs = [(k, gpu_tests.gpu_spec(tmp_path / k, **v)) for k, v in gpu_tests.MATRIX.items()]
        if n_gpus >= 2:
            jobs.append(("two-ranks", gpu_tests.gpu_spec(tmp_path / "two", world_size=2)))
        duplicate = gpu_tests.gpu_spec(tmp_path / "dup", world_size=2)  # runs on a 1-GPU box only
        devices = ranks.parent_visible_devices({}, torch.cuda.device_count())
        for name, spec in [*jobs, ("duplicate", duplicate)]:
            world = spec.layout.tasks_per_node * spec.layout.nodes
            base = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29400"}
            placements = []
            for child in ranks.rank_environments(base, world, spec.layout.nodes, devices):
                seen = [int(d) for d in child["CUDA_VISIBLE_DEVICES"].split(",")]
                fake_cuda.install(monkeypatch, visible=seen)
                device, _ = resolve_device(spec.layout.gpus_per_node, DistEnv.detect(child))
                placements.append(("box", dist.gpu_uuid(device)))
            if name == "duplicate" and n_gpus == 1:
                with pytest.raises(RuntimeError, match="share GPU"):
                    dist.check_unique_gpus(placements)
            elif name != "duplicate":
                dist.check_unique_gpus(placements)
                tag = ",".join(f"{host}/{uuid}" for host, uuid in placements)
                assert tag.count("GPU-") == world, name  # test_gpu.py's UUID assertion holds (R3)
    finally:
        monkeypatch.undo()
        importlib.reload(gpu_tests)


# ---- GPU review 3, G2: the straggler probe where the unsharded gradients do not fit ---------------

@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_the_straggler_probe_needs_room_for_the_unsharded_gradients(cuda, strategy):
    """Under FSDP a probe pass holds the whole model's gradients unsharded: with less free GPU memory
    than that the probe is skipped (agreed by every rank); DDP's gradients are whole anyway."""
    spec = model_spec("gpt2-small")
    strat = StrategySpec(**STRATEGIES[strategy])
    prec = PrecisionSpec(name=Precision.bf16, mode=PrecisionMode.autocast)
    with fake_cuda.fake_world(GPUS_PER_NODE), cuda.tensors():
        built = models.build_for(spec, CUDA0, sharded=strat.name is Strategy.fsdp)
        par = parallel.parallelize(built, strat, prec, device=CUDA0,
                                   dims=ParallelDims.of(strat, Layout(tasks_per_node=GPUS_PER_NODE)))
        full_bytes = sum(p.numel() * p.element_size() for p in par.model.parameters())
        cuda.free_bytes = 2 * full_bytes
        assert memory.room_for_unsynced_grads(par.model, CUDA0)
        cuda.free_bytes = full_bytes // 2
        assert memory.room_for_unsynced_grads(par.model, CUDA0) is (strategy == "ddp")
