"""The GPU path's decisions, pinned on CPU: peak FLOPs by device name, MFU bounds, device and
backend choice, duplicate GPUs, precision plans, DDP's buffer flag, RNG state, and the memory
of a sharded setup. (tests/test_gpu.py runs the same paths on a GPU; they skip here.)"""

import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from contract.spec import (
    BatchNormUnits,
    ConfigError,
    Precision,
    PrecisionMode,
    PrecisionSpec,
    Strategy,
    StrategySpec,
)
from jobs import checkpoint, dist, parallel, peaks, summary
from tests.ranks import make_spec, run_ranks

T = 1e12

# ---- H1 / M4: peak FLOP/s by the names torch.cuda.get_device_name() reports --------------------

BF16_PEAKS = [
    ("NVIDIA H100 80GB HBM3", 989.4),  # SXM5: no "SXM" in the name
    ("NVIDIA H100 PCIe", 756),
    ("NVIDIA H100 NVL", 835),
    ("NVIDIA H800", 989.4),
    ("NVIDIA H800 PCIe", 756),
    ("NVIDIA H200", 989.4),
    ("NVIDIA H200 NVL", 835),
    ("NVIDIA GH200 480GB", 989.4),
    ("NVIDIA H20", 148),
    ("NVIDIA B200", 2250),
    ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100-SXM4-40GB", 312),
    ("NVIDIA A100-PCIE-40GB", 312),
    ("NVIDIA A100 80GB PCIe", 312),
    ("NVIDIA A800-SXM4-80GB", 312),
    ("NVIDIA A10G", 125),
    ("NVIDIA A10", 125),
    ("NVIDIA A30", 165),
    ("NVIDIA L40S", 362.05),
    ("NVIDIA L40", 181),
    ("NVIDIA L4", 121),
    ("AMD Instinct MI300X", 1307.4),
]


@pytest.mark.parametrize("name, tflops", BF16_PEAKS)
def test_bf16_peak_by_real_device_name(name, tflops):
    assert peaks.peak_flops_for(name, "bf16") == pytest.approx(tflops * T)


@pytest.mark.parametrize("name, tflops", [
    ("Tesla V100-SXM2-32GB", 125), ("Tesla V100-SXM2-16GB", 125), ("Tesla V100-PCIE-16GB", 112),
    ("Tesla V100S-PCIE-32GB", 130), ("Tesla T4", 65), ("NVIDIA H100 80GB HBM3", 989.4),
])
def test_fp16_peak_by_real_device_name(name, tflops):
    assert peaks.peak_flops_for(name, "fp16") == pytest.approx(tflops * T)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000", "Quadro RTX 8000", "cpu",
                                  "x86_64", "", "NVIDIA Graphics Device"])
def test_unknown_device_gets_no_peak_never_another_gpus(name):
    for precision in ("fp32", "bf16", "fp16"):
        assert peaks.peak_flops_for(name, precision) is None
        assert peaks.peak_flops_for(name, precision, "tf32") is None


def test_no_bf16_peak_on_pre_ampere():
    assert peaks.peak_flops_for("Tesla V100-SXM2-32GB", "bf16") is None
    assert peaks.peak_flops_for("Tesla T4", "bf16") is None


@pytest.mark.parametrize("matmul, cudnn, precision, has_conv, math_mode", [
    (False, True, "highest", True, "tf32"),  # PyTorch's defaults, a CNN: cuDNN convolutions use TF32
    (False, True, "highest", False, "fp32"),  # PyTorch's defaults, a transformer: fp32 matmuls
    (True, True, "highest", False, "tf32"),
    (False, False, "high", False, "tf32"),  # set_float32_matmul_precision("high") allows TF32
    (False, False, "medium", True, "tf32"),
    (False, False, "highest", True, "fp32"),
])
def test_fp32_math_follows_the_tf32_settings(matmul, cudnn, precision, has_conv, math_mode):
    assert peaks.fp32_math(matmul, cudnn, precision, has_conv) == math_mode


def test_fp32_peak_is_picked_from_the_math_mode():
    assert peaks.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp32", "fp32") == pytest.approx(19.5 * T)
    assert peaks.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp32", "tf32") == pytest.approx(156 * T)
    assert peaks.peak_flops_for("NVIDIA H100 80GB HBM3", "fp32", "tf32") == pytest.approx(494.7 * T)
    # No TF32 units: fp32 math whatever the flags say.
    assert peaks.peak_flops_for("Tesla V100-SXM2-32GB", "fp32", "tf32") == pytest.approx(15.7 * T)
    # A device without a listed TF32 figure gets none rather than the (lower) fp32 one.
    assert peaks.peak_flops_for("NVIDIA B200", "fp32", "tf32") is None


def test_precision_settings_are_recorded():
    import torch

    settings = peaks.precision_settings(torch)
    assert set(settings) == {"cuda_matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"}
    assert settings["float32_matmul_precision"] == torch.get_float32_matmul_precision()


def test_mfu_above_one_is_never_reported():
    value, reason = peaks.mfu_checked(6e9, 100.0, 1e12)
    assert value == pytest.approx(0.6) and reason is None
    value, reason = peaks.mfu_checked(6e9, 1000.0, 1e12)  # 6 PFLOP/s on a 1 PFLOP/s device
    assert value is None and "exceeds 1" in reason
    assert peaks.mfu(6e9, 1000.0, 1e12) is None
    assert peaks.mfu_checked(None, 1.0, 1e12) == (None, "no FLOP count for this model")
    assert peaks.mfu_checked(1e9, 1.0, None)[1].startswith("no peak")


# ---- H3: the device follows the configuration -----------------------------------------------------

@pytest.mark.parametrize("gpus, local_rank, local_world, visible, expected", [
    (0, 0, 1, 0, ("cpu", "gloo")),
    (0, 3, 4, 8, ("cpu", "gloo")),  # a GPU host running a CPU cell: still CPU
    (1, 0, 1, 1, ("cuda:0", "nccl")),
    (8, 5, 8, 1, ("cuda:0", "nccl")),  # Slurm binds one GPU per task
    (8, 5, 8, 8, ("cuda:5", "nccl")),  # the whole node visible (torchrun, local runs)
    (2, 1, 2, 2, ("cuda:1", "nccl")),  # cluster=local cluster.gpus_per_node=2
    (4, 0, 4, 4, ("cuda:0", "nccl")),
])
def test_choose_device(gpus, local_rank, local_world, visible, expected):
    assert dist.choose_device(gpus, local_rank, local_world, visible) == expected


@pytest.mark.parametrize("gpus, local_rank, local_world, visible, message", [
    (1, 0, 1, 0, "sees no CUDA device"),
    (4, 1, 4, 2, "sees 2 CUDA devices"),
    (2, 0, 2, 8, "CUDA_VISIBLE_DEVICES=0,1"),
])
def test_choose_device_fails_fast_with_the_count_and_the_fix(gpus, local_rank, local_world, visible, message):
    with pytest.raises(RuntimeError, match="Fix:") as info:
        dist.choose_device(gpus, local_rank, local_world, visible)
    assert message in str(info.value)


@pytest.mark.parametrize("env, slot", [
    (dict(rank=3, world_size=4, local_rank=1, local_world_size=2, machine_rank=3, machine_ranks=4), (3, 4)),  # emulated
    (dict(rank=3, world_size=4, local_rank=1, local_world_size=2, source="slurm"), (1, 2)),
    (dict(rank=5, world_size=16, local_rank=5, local_world_size=8, source="torchrun"), (5, 8)),
    (dict(), (0, 1)),
])
def test_machine_slot_on_emulated_and_real_nodes(env, slot):
    from jobs.dist import DistEnv, machine_slot

    assert machine_slot(DistEnv(**env)) == slot
    # cluster=local nodes=2 cluster.tasks_per_node=2 cluster.gpus_per_node=2: 4 GPUs visible, rank 3 on cuda:3.
    if "machine_rank" in env:
        assert dist.choose_device(2, *machine_slot(DistEnv(**env)), 4) == ("cuda:3", "nccl")


def test_placements_carry_the_uuid_as_nvml_writes_it(monkeypatch, tmp_path):
    # R3: torch prints a device UUID as bare hex (PyTorch's _CUuuid.__str__); NVML and nvidia-smi
    # write "GPU-<hex>", and tests/test_gpu.py counts "GPU-" in the gpu_uuids tag. CUDA is a
    # stateful fake (tests/fake_cuda.py); the gather runs on a real one-rank gloo group.
    import torch.distributed as tdist

    from jobs.dist import DistEnv, check_gpu_placement
    from tests import fake_cuda

    fake_cuda.install(monkeypatch, visible=[2])
    bare = str(torch.cuda.get_device_properties(0).uuid)
    assert bare == fake_cuda.bare_uuid(2) and not bare.startswith("GPU-")
    assert dist.gpu_uuid(torch.device("cuda", 0)) == f"GPU-{bare}"
    assert dist.nvml_uuid(f"GPU-{bare}") == f"GPU-{bare}" and dist.nvml_uuid("MIG-x") == "MIG-x"
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        placements = check_gpu_placement(DistEnv(hostname="h"), torch.device("cuda", 0))
    finally:
        tdist.destroy_process_group()
    assert placements == [("h", f"GPU-{bare}")]
    tag = ",".join(f"{host}/{uuid}" for host, uuid in placements)  # as jobs.summary.run_tags writes it
    assert tag.count("GPU-") == 1  # tests/test_gpu.py's own assertion


def test_duplicate_gpus_from_literal_placements():
    assert dist.duplicate_gpus([("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a")]) == []
    assert dist.duplicate_gpus([("n1", "GPU-a"), ("n1", "GPU-a"), ("n1", "GPU-b"), ("n1", "GPU-a")]) == [
        "ranks [0, 1, 3] share GPU GPU-a on n1"]
    with pytest.raises(RuntimeError, match="ranks \\[0, 1\\] share GPU GPU-x on h.*Fix:"):
        dist.check_unique_gpus([("h", "GPU-x"), ("h", "GPU-x")])
    dist.check_unique_gpus([("h", "GPU-x"), ("h", "GPU-y")])


# ---- H4: process-group backend ---------------------------------------------------------------

def test_cuda_ranks_get_gloo_for_cpu_tensors_and_nccl_for_cuda():
    assert dist.backend_for("cuda") == "cpu:gloo,cuda:nccl"
    assert dist.backend_for("cpu") == "gloo"


def test_init_process_group_takes_device_id_and_a_per_device_backend_string():
    import inspect

    import torch.distributed as tdist
    from torch.distributed import Backend

    assert "device_id" in inspect.signature(tdist.init_process_group).parameters
    config = Backend("cpu:gloo,cuda:nccl")  # parsed by torch, not only by us
    assert "gloo" in str(config) and "nccl" in str(config)


def test_gloo_interface_note():
    assert dist.gloo_interface_problem("127.0.1.1", 2, {}).startswith("this host's name resolves to 127.0.1.1")
    assert "GLOO_SOCKET_IFNAME" in dist.gloo_interface_problem("127.0.0.1", 2, {})
    assert dist.gloo_interface_problem("127.0.1.1", 1, {}) is None  # one node: loopback is right
    assert dist.gloo_interface_problem("127.0.1.1", 2, {"GLOO_SOCKET_IFNAME": "eth0"}) is None
    assert dist.gloo_interface_problem("10.0.0.5", 4, {}) is None


# ---- M3: one precision semantics for DDP and FSDP -----------------------------------------------

def _prec(name, mode="autocast", **kw):
    return PrecisionSpec(name=Precision(name), mode=PrecisionMode(mode), **kw)


@pytest.mark.parametrize("strategy, spec, expected", [
    (Strategy.ddp, _prec("fp32"), ("autocast", None, None, None, False)),
    (Strategy.fsdp, _prec("fp32"), ("autocast", None, None, None, False)),
    (Strategy.ddp, _prec("bf16"), ("autocast", "bf16", None, None, False)),
    (Strategy.fsdp, _prec("bf16"), ("autocast", "bf16", None, None, False)),  # same as DDP
    (Strategy.ddp, _prec("fp16"), ("autocast", "fp16", None, None, True)),
    (Strategy.fsdp, _prec("fp16"), ("autocast", "fp16", None, None, True)),
    (Strategy.fsdp, _prec("bf16", reduce_dtype=Precision.bf16), ("autocast", "bf16", None, "bf16", False)),
    (Strategy.fsdp, _prec("bf16", "params"), ("params", None, "bf16", "fp32", False)),
    (Strategy.fsdp, _prec("fp16", "params"), ("params", None, "fp16", "fp32", True)),
    (Strategy.fsdp, _prec("bf16", "params", param_dtype=Precision.bf16, reduce_dtype=None),
     ("params", None, "bf16", None, False)),
])
def test_precision_plan(strategy, spec, expected):
    plan = parallel.precision_plan(strategy, spec)
    assert (plan.mode, plan.autocast, plan.param_dtype, plan.reduce_dtype, plan.grad_scaler) == expected


def test_params_mode_is_refused_for_ddp_with_the_fix():
    with pytest.raises(ValueError, match="precision.mode=params with strategy=ddp.*Fix: use precision.mode=autocast"):
        parallel.precision_plan(Strategy.ddp, _prec("bf16", "params"))


def test_param_dtype_needs_params_mode():
    with pytest.raises(ConfigError, match="precision.mode=params"):
        _prec("bf16", param_dtype=Precision.bf16).validate()
    _prec("bf16", "params", param_dtype=Precision.bf16).validate()
    _prec("bf16", param_dtype=Precision.fp32).validate()
    assert PrecisionSpec().mode is PrecisionMode.autocast and PrecisionSpec().batchnorm is BatchNormUnits.unit


def test_plain_grad_scaler_serves_fsdp():
    import torch

    assert type(parallel.make_grad_scaler("cpu")) is torch.amp.GradScaler


@pytest.mark.parametrize("capability, refused", [((7, 0), True), ((7, 5), True), ((8, 0), False), ((9, 0), False),
                                                 (None, False)])
def test_bf16_refused_before_ampere(capability, refused):
    problem = parallel.bf16_refusal("Tesla V100-SXM2-32GB", capability)
    assert (problem is not None) == refused
    if refused:
        assert "Ampere" in problem and "Fix: use precision=fp16" in problem


# ---- DDP's buffer flag: the name the installed torch takes without a warning ----------------------

def test_ddp_buffer_flag_matches_the_installed_torch():
    def old_init(self, module, device_ids=None, broadcast_buffers=True):
        pass

    def new_init(self, module, broadcast_buffers=None, forward_sync_buffers=None):
        pass

    assert parallel.ddp_buffer_kwargs(False, old_init) == {"broadcast_buffers": False}
    assert parallel.ddp_buffer_kwargs(False, new_init) == {"forward_sync_buffers": False}


def test_apply_ddp_raises_no_deprecation_warning(tmp_path):
    import torch
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            for flag in (True, False):
                parallel.apply_ddp(torch.nn.Linear(2, 2), torch.device("cpu"), bucket_cap_mb=25,
                                   gradient_as_bucket_view=False, static_graph=False, find_unused_parameters=False,
                                   broadcast_buffers=flag)
    finally:
        tdist.destroy_process_group()


# ---- low items: CUDA RNG in checkpoints, skipped fp16 steps, per-step reductions -------------------

def test_rng_state_round_trip_on_cpu():
    import torch

    cpu = torch.device("cpu")
    state = checkpoint.rng_state(cpu)
    assert set(state) == {"cpu"}  # no CUDA stream on a CPU rank
    first = torch.rand(3)
    checkpoint.restore_rng(state, cpu)
    assert torch.equal(torch.rand(3), first)
    checkpoint.restore_rng(state["cpu"], cpu)  # the format of checkpoints written before
    assert torch.equal(torch.rand(3), first)


def test_skipped_steps_split_by_window():
    history = {"measured": [False, False, True, True, True], "skipped": [True, False, False, True, False]}
    assert summary.skipped_steps(history) == {"fp16_skipped_steps": 1, "fp16_skipped_steps_warmup": 1}
    assert summary.skipped_steps({"measured": [True]}) == {"fp16_skipped_steps": 0, "fp16_skipped_steps_warmup": 0}


def test_skipped_flags_read_once_across_a_restart():
    import torch

    from jobs.schedule import History

    h = History.from_portable({"steps": [0, 1], "step_time_s": [1, 1], "data_time_s": [0, 0], "losses": [1, 1],
                               "measured": [False, True], "skipped": [True, False]})
    h.trace.skipped += [torch.tensor(True), torch.tensor(False)]
    assert h.skipped() == [True, False, True, False]


def test_step_records_and_mean_losses():
    r0 = {"steps": [0, 1, 2], "losses": [3.0, 2.0, 1.0], "step_time_s": [0.1, 0.2, 0.3]}
    r1 = {"steps": [0, 1, 2], "losses": [5.0, 4.0, 3.0], "step_time_s": [0.3, 0.1, 0.3]}
    assert summary.step_records([r0, r1], 1, 3) == [
        {"step": 1, "loss": 3.0, "step_time_ms": pytest.approx(200.0)},
        {"step": 2, "loss": 2.0, "step_time_ms": pytest.approx(300.0)}]
    assert summary.mean_losses([r0, r1], 3) == [4.0, 3.0, 2.0]
    partial = {"steps": [2], "losses": [9.0], "step_time_s": [0.1]}
    assert summary.mean_losses([r0, partial], 3) == r0["losses"]


def test_summary_reduces_memcpy_and_fp16_figures_as_the_worst_rank():
    base = {"step_time_s": [0.1], "data_time_s": [0.0]}
    s = summary.summarize([{**base, "memcpy_time_ms": 1.0, "fp16_skipped_steps": 0, "peak_rss_gib": 1.0},
                           {**base, "memcpy_time_ms": 3.0, "fp16_skipped_steps": 2, "peak_rss_gib": 2.0}],
                          samples_per_step=1, tokens_per_sample=1, repeats=1)
    assert s["memcpy_time_ms"] == 3.0 and s["fp16_skipped_steps"] == 2 and s["peak_rss_gib"] == 2.0


# ---- M6: the watchdog is paused before the communication probe --------------------------------

def test_watchdog_paused_before_the_probe(monkeypatch):
    from types import SimpleNamespace

    from jobs import anatomy, worker
    from jobs.dist import DistEnv
    from jobs.hooks import Observer
    from jobs.rankrun import Rank, Run

    events = []

    class FakeHeartbeat:
        def pause(self):
            events.append("pause")

    def fake_probe(run_steps, trainer, n_steps, on_gpu, world_size):
        events.append(("probe", n_steps, on_gpu))
        return {"comm_time_ms": 1.0}

    import torch

    def run_on(env, steps=3):
        from contract.spec import Layout, StrategySpec

        spec = SimpleNamespace(train=SimpleNamespace(comm_probe_steps=steps), strategy=StrategySpec(), layout=Layout())
        rank = Rank(spec, env, torch.device("cpu"), "gloo", None, FakeHeartbeat(), Observer())
        return Run(rank, SimpleNamespace(trainer=None, batches=None), None, lambda: None)

    monkeypatch.setattr(anatomy, "probe", fake_probe)
    out = worker.communication_probe(run_on(DistEnv(world_size=2)))
    assert out == {"comm_time_ms": 1.0} and events == ["pause", ("probe", 3, False)]
    # One rank too (the anatomy shows where a wrapper's time goes); comm_probe_steps=0 turns it off.
    assert worker.communication_probe(run_on(DistEnv())) == {"comm_time_ms": 1.0}
    assert worker.communication_probe(run_on(DistEnv(), steps=0)) == {}


# ---- M1: built on meta, sharded, then materialised ----------------------------------------------

# 16 layers of d_model 1024 (201M parameters, 805 MB in fp32) and a tiny vocabulary: the largest
# single parameter (the MLP's 4096x1024) is 16 MB, so a sharded setup's transient full draws are
# small. Large against the ~75 MB that the first meta-device build costs once (torch's meta
# registrations are imported then), which both strategies pay.
BIG = dict(name="gpt_tiny", input="tokens", seq_len=8, vocab_size=64,
           params={"n_layer": 16, "n_head": 8, "d_model": 1024})


@pytest.mark.slow
def test_fsdp_setup_never_holds_the_unsharded_model(tmp_path):
    import torch

    from contract.spec import InputKind, ModelSpec
    from jobs.models import build_model, param_count

    with torch.device("meta"):
        full = 4 * param_count(build_model(ModelSpec(**{**BIG, "input": InputKind.tokens})))
    # One step, no probes: setup is what this test measures (a 200M-parameter step takes seconds on 2 cores).
    common = dict(model=BIG, batch_size=1, steps=1, warmup_steps=0, optimizer="sgd", comm_probe_steps=0,
                  local_probe_steps=0, warmup_extend_max=0)
    # Separate processes: memory one run frees stays resident and would hide the next run's growth.
    fsdp, ddp = (run_ranks(make_spec(tmp_path / s, strategy=s, **common), world_size=2, timeout_s=240)[0]
                 for s in ("fsdp", "ddp"))
    for r in (fsdp, ddp):
        assert "error" not in r, r.get("error")
    gib = 1024**3
    # Sharded parameters: half the model per rank.
    assert fsdp["summary"]["param_bytes"] == pytest.approx(full / 2, rel=0.01)
    # Host memory grown during setup (build, shard, materialise, init): about the shard, well below
    # the unsharded model; DDP, which holds it all, shows the measure sees a full model.
    assert fsdp["summary"]["setup_rss_growth_gib"] * gib < 0.75 * full, (fsdp["summary"], full)
    assert ddp["summary"]["setup_rss_growth_gib"] * gib > 0.9 * full, (ddp["summary"], full)
    # And the same initial weights as DDP's eager build: the first losses agree.
    assert math.isclose(fsdp["losses"][0], ddp["losses"][0], rel_tol=1e-5)


def test_strategy_spec_still_default_ddp():
    assert StrategySpec().name is Strategy.ddp


@pytest.mark.slow
def test_resume_from_a_periodic_checkpoint_repeats_the_uninterrupted_steps(tmp_path):
    # Steps 0-5 with a checkpoint at step 3; the same spec run again resumes from it (model,
    # optimizer, data position and RNG streams in the new {"cpu": ..., "cuda": ...} format).
    common = dict(strategy="fsdp", steps=6, warmup_steps=1, lr=3e-3, comm_probe_steps=0)
    spec = make_spec(tmp_path / "run", **common)
    spec.checkpoint.every_steps = 3
    first = run_ranks(spec, world_size=2)[0]
    assert "error" not in first, first.get("error")
    assert first["tags"]["checkpoints_in_window"] == "1"  # G10: its peaks include the save at step 3
    again = run_ranks(spec, world_size=2)[0]
    assert "error" not in again, again.get("error")
    assert again["tags"]["resumed_from_step"] == "3"
    assert again["losses"][3:] == pytest.approx(first["losses"][3:], rel=1e-5)



# ---- R4: a user's model starts from the same weights under DDP and FSDP -------------------------

class ConstructorInitLM(nn.Module):
    """A user's model (``model._target_``) whose constructor initialises tensors that no
    ``reset_parameters()`` reaches: nn.MultiheadAttention's in-projection (it has only the private
    ``_reset_parameters``), a raw nn.Parameter drawn in ``__init__``, and a custom init of a Linear
    (which Linear.reset_parameters would overwrite with its default)."""

    def __init__(self, vocab_size: int = 128, d_model: int = 32, n_head: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.offset = nn.Parameter(0.5 * torch.randn(d_model))
        self.attn = nn.MultiheadAttention(d_model, n_head, batch_first=True)
        self.head = nn.Linear(d_model, vocab_size)
        nn.init.normal_(self.head.weight, std=0.5)

    def forward(self, x):
        h = self.embed(x) + self.offset
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.head(h)


USER_MODEL = dict(name="custom", _target_=f"{__name__}.ConstructorInitLM", input="tokens", seq_len=16,
                  vocab_size=128, params={"vocab_size": 128})


@pytest.mark.slow
def test_user_model_starts_from_the_same_weights_under_ddp_and_fsdp(tmp_path):
    # One rank, fp32, the same seed: nothing but the initial weights can make the first losses differ.
    common = dict(model=USER_MODEL, world_size=1, steps=2, warmup_steps=1, comm_probe_steps=0)
    runs = run_ranks([make_spec(tmp_path / s, strategy=s, **common) for s in ("ddp", "fsdp", "zero2")],
                     world_size=1, timeout_s=120)
    ddp, fsdp, zero2 = (r[0] for r in runs)
    for r in (ddp, fsdp, zero2):
        assert "error" not in r, r.get("error")
    print(f"first loss: ddp {ddp['losses'][0]!r}, fsdp {fsdp['losses'][0]!r}, zero2 {zero2['losses'][0]!r}")
    assert math.isfinite(ddp["losses"][0])
    assert fsdp["losses"][0] == pytest.approx(ddp["losses"][0], rel=1e-6)
    assert zero2["losses"][0] == pytest.approx(ddp["losses"][0], rel=1e-6)


# ---- GPU review 3 (G1-G10): found by a third reading, pinned here -----------------------------------

def test_losses_after_a_resume_stack_only_the_device_tensors(monkeypatch):
    """G1: restored losses are floats, new ones device tensors. On CUDA, torch.stack refuses a CPU
    tensor made from a float beside CUDA ones, so only the tensors may be stacked (the fake tensor
    mode cannot show this: it accepts the mix)."""
    import torch

    from jobs.schedule import History

    h = History.from_portable({"steps": [0, 1], "step_time_s": [1, 1], "data_time_s": [0, 0], "losses": [3.0, 2.5],
                               "measured": [False, True], "skipped": []})
    new = [torch.tensor(2.0), torch.tensor(1.5)]
    h.trace.losses += new
    stacked = []
    real_stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda xs, *a, **k: stacked.append(len(xs)) or real_stack(xs, *a, **k))
    assert h.losses() == [3.0, 2.5, 2.0, 1.5]
    assert stacked == [len(new)]  # one read, of the device tensors alone


_PROBE_SCRIPT = """
import os, socket, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", rank=0, world_size=1)
from jobs import memory, models, parallel
from jobs.loop import Trainer, local_step_times
from contract.spec import ModelSpec, Precision, PrecisionSpec, Strategy, StrategySpec
with torch.device("meta"):
    m = models.build_model(ModelSpec(name="gpt_tiny", seq_len=16, vocab_size=128,
                                     params={"n_layer": 2, "n_head": 2, "d_model": 32}))
par = parallel.parallelize(m, StrategySpec(name=Strategy.fsdp), PrecisionSpec(name=Precision.fp32),
                           device=torch.device("cpu"))
tr = Trainer(par.model, torch.optim.AdamW(par.model.parameters()), accum_steps=1, autocast_dtype=None,
             device=torch.device("cpu"), no_sync=par.no_sync)
x = torch.randint(0, 128, (4, 16))
times = local_step_times(tr, iter([(x, x)] * 10), 2, lambda: None)
held = sum((p._unsharded_param.grad is not None) + (p.unsharded_accumulated_grad is not None)
           for p in memory._fsdp_params(par.model))
print(len(times), len(list(memory._fsdp_params(par.model))), held)
dist.destroy_process_group()
"""


def test_the_straggler_probe_leaves_no_unsharded_gradient_under_fsdp():
    """G2: a backward under FSDP2's no_sync keeps every gradient unsharded until a synced backward
    that the probe never runs; left there, each rank holds world-size times its sharded gradients."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    timed, fsdp_params, held = map(int, out.stdout.split())
    assert timed == 2 and fsdp_params > 0 and held == 0


def test_an_fp16_resume_goes_on_at_the_loss_scale_it_had_reached(tmp_path):
    """G4: the GradScaler's scale and growth tracker are part of the checkpoint. A checkpoint whose
    scale had backed off to 8 resumes at 8 (and counts on from its tracker), not at init_scale
    65536, whose back-off would skip steps the uninterrupted run did not."""
    spec = make_spec(tmp_path / "run", strategy="fsdp", precision="fp16", world_size=1, steps=7, warmup_steps=1,
                     comm_probe_steps=0)
    spec.checkpoint.every_steps = 3
    assert "error" not in run_ranks(spec, world_size=1)[0]
    saved = tmp_path / "run" / "checkpoint" / "step-000006" / "rank0.pt"
    state = torch.load(saved, weights_only=False)
    assert state["scaler"]["scale"] == 65536.0 and state["scaler"]["_growth_tracker"] == 6
    state["scaler"]["scale"] = 8.0  # as if overflows had backed it off
    torch.save(state, saved)
    spec.train.steps = 10
    again = run_ranks(spec, world_size=1)[0]
    assert "error" not in again and again["tags"]["resumed_from_step"] == "6"
    scaler = torch.load(tmp_path / "run" / "checkpoint" / "step-000009" / "rank0.pt", weights_only=False)["scaler"]
    assert scaler["scale"] == 8.0 and scaler["_growth_tracker"] == 9


def test_the_cuda_image_and_the_cluster_install_carry_nvml():
    """G8: without the gpu extra (nvidia-ml-py) every GPU run from the image misses energy, GPU
    interference and system metrics."""
    root = Path(__file__).resolve().parent.parent
    assert '"nvidia-ml-py' in (root / "pyproject.toml").read_text()
    image = (root / "docker" / "Dockerfile.cuda").read_text()
    assert "[hf,gpu]" in image and 'python -c "import pynvml"' in image
    install = (root / "docs" / "install.md").read_text()
    assert "'ddp-fsdp-bench[hf,gpu] @ git+" in install and "whl[hf,gpu]'" in install


_TF32_SCRIPT = """
import sys, torch
from jobs import matmul_peak, peaks, summary
if sys.argv[1] != "default":
    torch.set_float32_matmul_precision(sys.argv[1])
before = torch.get_float32_matmul_precision()
for allowed in (True, False):
    with matmul_peak.matmul_tf32(torch, allowed):
        inside = peaks.precision_settings(torch)
        assert inside["cuda_matmul_allow_tf32"] == str(allowed), (allowed, inside)
    assert peaks.precision_settings(torch)["float32_matmul_precision"] == before
    assert torch.get_float32_matmul_precision() == before
print("ok")
"""


@pytest.mark.parametrize("user_setting", ["default", "highest", "high", "medium"])
def test_timing_in_tf32_and_back_never_breaks_the_precision_api(user_setting):
    """G7: writing the legacy allow_tf32 flag after set_float32_matmul_precision made torch refuse to
    read the precision ("mix of the legacy and new APIs"), failing the job after it had measured.
    A fresh process each: these are process-wide settings."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _TF32_SCRIPT, user_setting], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-800:]


def test_the_rank_harness_gives_a_cuda_2d_mesh_spec_fresh_processes(monkeypatch, tmp_path):
    """G6: several specs in one rank process crash (SIGSEGV) when a later one splits its world group
    (a CUDA 2-D mesh on torch 2.9+), so run_ranks starts fresh ranks for each spec then."""
    from tests import ranks

    cuda_hsdp = make_spec(tmp_path / "a", strategy="hsdp", nodes=2, world_size=2, gpus_per_node=1)
    plain = make_spec(tmp_path / "b", strategy="fsdp", world_size=2)
    assert ranks.splits_the_world_group(cuda_hsdp) and not ranks.splits_the_world_group(plain)
    assert not ranks.splits_the_world_group(make_spec(tmp_path / "c", strategy="hsdp", nodes=2, world_size=2))
    calls = []
    real = ranks.run_ranks

    def recording(specs, world_size, **kw):
        calls.append(len(specs) if isinstance(specs, list) else 1)
        return real(specs, world_size, **kw) if isinstance(specs, list) else [{"ran": specs.out_dir}]

    monkeypatch.setattr(ranks, "run_ranks", recording)
    assert ranks.run_ranks([cuda_hsdp, plain], world_size=2, nodes=2) == [[{"ran": cuda_hsdp.out_dir}],
                                                                          [{"ran": plain.out_dir}]]
    assert calls == [2, 1, 1]


# ---- the first GPU check (docs/gpu/run1): what it found, pinned on CPU ---------------------------

def test_every_nvml_function_named_in_the_code_exists_in_pynvml():
    # The first GPU check failed on an NVML function that does not exist (the enforced power limit
    # under a name mixed from two real ones; pynvml's is nvmlDeviceGetEnforcedPowerLimit). Names
    # reach NVML as attributes and as strings (getattr),
    # and the tests' stateful NVML stand-in answers to the same names: every one must be pynvml's.
    pynvml = pytest.importorskip("pynvml", reason="pip install nvidia-ml-py (the dev extra has it)")
    import re

    repo = Path(__file__).resolve().parent.parent
    sources = [p for d in ("contract", "jobs", "launcher", "bench", "tests") for p in (repo / d).rglob("*.py")]
    named = {m for p in sources for m in re.findall(r"\bnvml[A-Z][A-Za-z]*\b", p.read_text())}
    assert "nvmlDeviceGetTotalEnergyConsumption" in named  # the search sees the code's names
    assert sorted(n for n in named if not hasattr(pynvml, n)) == []
