"""The step's tuning settings (contract/tuning.py): every value honoured or refused, on CPU for real and
on the GPU path by resolution (tests/test_gpu_rehearsal.py runs the CUDA branch on fake CUDA)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contract.spec import (
    ConfigError,
    InputKind,
    LossImpl,
    ModelSpec,
    Optimizer,
    OptimizerImpl,
    Sharding,
    StepTiming,
    Strategy,
    StrategySpec,
    TrainSpec,
)
from contract.tuning import padded_vocab, resolve, resolved_model
from jobs.loss import loss_fn
from launcher.plan.grid import SweepError
from tests.ranks import make_spec, run_ranks
from tests.test_config import one
from tests.test_gpu_rehearsal import cuda as fake_gpu  # noqa: F401 (the fake-CUDA fixture, under this name)

GPT2 = ModelSpec(name="gpt2-small", seq_len=1024, vocab_size=50257)
IMAGE = ModelSpec(name="cnn", input=InputKind.image, image_size=32, num_classes=10)
DDP, FSDP = StrategySpec(), StrategySpec(name=Strategy.fsdp)


def _resolve(train=None, strategy=DDP, model=GPT2, *, cuda: bool, world_size: int = 1):
    return resolve(train or TrainSpec(), strategy, model, cuda=cuda, world_size=world_size, tasks_per_node=world_size)


def test_gpu_defaults_are_a_tuned_loops_and_cpu_defaults_what_measured_fastest():
    gpu = _resolve(strategy=FSDP, cuda=True)
    assert (gpu.optimizer_impl, gpu.compile, gpu.loss, gpu.step_timing, gpu.vocab_multiple) == (
        "fused", True, "full", "events", 64)  # compiled: the whole loss, fused by inductor
    assert gpu.reshard_after_forward is False  # one rank: resharding frees nothing
    assert _resolve(strategy=FSDP, cuda=True, world_size=2).reshard_after_forward is True
    assert _resolve(model=IMAGE, cuda=True).channels_last and _resolve(model=IMAGE, cuda=True).cudnn_benchmark
    cpu = _resolve(model=IMAGE, cuda=False)
    assert (cpu.optimizer_impl, cpu.cudnn_benchmark, cpu.step_timing, cpu.reshard_after_forward) == (
        "fused", False, "sync", None)
    # SGD has no fused kernel for DTensor parameters: foreach under FSDP, fused elsewhere.
    sgd = TrainSpec(optimizer=Optimizer.sgd)
    assert _resolve(sgd, FSDP, cuda=True).optimizer_impl == "foreach"
    assert _resolve(sgd, DDP, cuda=True).optimizer_impl == "fused"
    assert gpu.tags()["tuning.reshard_after_forward"] == "false"
    assert cpu.tags()["tuning.reshard_after_forward"] == "-"


@pytest.mark.parametrize("train, strategy, model, setting", [
    (TrainSpec(cudnn_benchmark=True), DDP, IMAGE, "cudnn_benchmark"),
    (TrainSpec(step_timing=StepTiming.events), DDP, GPT2, "step_timing"),
    (TrainSpec(channels_last=True), DDP, GPT2, "channels_last"),
    (TrainSpec(), DDP, dataclasses.replace(IMAGE, vocab_multiple=64), "model.vocab_multiple"),
    (TrainSpec(), DDP, dataclasses.replace(GPT2, vocab_multiple=0), "model.vocab_multiple"),
    (TrainSpec(), StrategySpec(reshard_after_forward=False), GPT2, "strategy.reshard_after_forward"),
    (TrainSpec(), StrategySpec(name=Strategy.fsdp, sharding=Sharding.grad_op, reshard_after_forward=True), GPT2,
     "strategy.reshard_after_forward"),
    (TrainSpec(), StrategySpec(name=Strategy.fsdp, reshard_after_forward=False), GPT2, "strategy.reshard_after_forward"),
    (TrainSpec(optimizer=Optimizer.sgd, optimizer_impl=OptimizerImpl.fused), FSDP, GPT2, "optimizer_impl"),
])
def test_values_the_device_cannot_run_are_refused_naming_the_setting(train, strategy, model, setting):
    with pytest.raises(ConfigError) as err:
        _resolve(train, strategy, model, cuda=False, world_size=2)
    assert err.value.setting == setting and "Fix:" in str(err.value)


def test_the_launcher_refuses_them_before_anything_is_created():
    for overrides, setting in ((["step_timing=events"], "step_timing='events'"),
                               (["model=cnn", "cudnn_benchmark=true"], "cudnn_benchmark=True"),
                               (["strategy.reshard_after_forward=false"], "strategy.reshard_after_forward=False"),
                               (["model=gpt_tiny", "channels_last=true"], "channels_last=True")):
        with pytest.raises(SweepError, match=setting):
            one(*overrides)
    cfg = one("model=gpt2-small", "cluster=slurm", "cluster.gpus_per_node=1", "compile=false", "loss=full")
    assert (cfg.tuning().compile, cfg.tuning().loss, cfg.tuning().vocab_multiple) == (False, "full", 64)


def test_the_padded_vocabulary_is_what_the_ranks_build_and_the_plan_counts():
    from launcher.plan import fit

    assert padded_vocab(50257, 64) == 50304
    on_gpu = resolved_model(dataclasses.replace(GPT2, name="gpt_tiny", seq_len=16), cuda=True)
    assert on_gpu.vocab_multiple == 64
    shapes, _, _ = fit.analyse(on_gpu, batch_size=1, low_dtype=None, checkpointing=False)
    assert (50304, 128) in [dims for dims, _ in shapes]
    assert fit.count_flops(on_gpu) > fit.count_flops(dataclasses.replace(on_gpu, vocab_multiple=1))
    # The chunked loss's gradient is one tensor in the logits' dtype, not two fp32 copies.
    gpt2 = resolved_model(GPT2, cuda=True)
    assert fit.loss_grad_bytes(gpt2, 16, "full") == 2 * 4 * 16 * 1024 * 50304
    assert fit.loss_grad_bytes(gpt2, 16, "chunked", "bf16") < fit.loss_grad_bytes(gpt2, 16, "full") / 3


def test_the_chunked_loss_equals_the_fp32_loss_and_ignores_padded_columns():
    torch.manual_seed(0)
    logits = torch.randn(3, 50, 70, dtype=torch.bfloat16)
    targets = torch.randint(0, 60, (3, 50))
    grads = []
    for chunked in (False, True):
        x = logits.clone().requires_grad_()
        loss = loss_fn(x, targets, vocab=60, chunked=chunked)
        (2 * loss).backward()
        grads.append((loss.detach(), x.grad))
    (full, g_full), (chunk, g_chunk) = grads
    assert chunk.dtype == torch.float32 and g_chunk.dtype == torch.bfloat16
    assert torch.allclose(full, chunk, rtol=1e-5)
    assert torch.allclose(g_full.float(), g_chunk.float(), atol=1e-3)
    assert g_chunk[..., 60:].abs().max() == 0  # padded columns: in no softmax, no gradient
    reference = torch.nn.functional.cross_entropy(logits[..., :60].float().flatten(0, 1), targets.flatten())
    assert torch.allclose(chunk, reference, rtol=1e-5)
    # Many chunks (rows per chunk from the chunk budget): the same loss.
    import contract.tuning as tuning

    original = tuning.LOSS_CHUNK_BYTES
    tuning.LOSS_CHUNK_BYTES = 4 * 70 * 7  # 7 rows per chunk
    try:
        assert torch.allclose(loss_fn(logits, targets, vocab=60, chunked=True), reference, rtol=1e-5)
    finally:
        tuning.LOSS_CHUNK_BYTES = original


def test_real_ranks_honour_every_setting_and_tag_what_they_resolved(tmp_path):
    """One rank each (gloo): FSDP with fused AdamW on DTensor parameters, a padded vocabulary, the chunked
    loss, no reshard at one rank; a channels-last CNN under DDP and FSDP; SGD foreach under FSDP."""
    specs = [
        make_spec(tmp_path / "gpt", strategy="fsdp", world_size=1, model={**_tiny(), "vocab_multiple": 64},
                  optimizer_impl=OptimizerImpl.fused, loss=LossImpl.chunked),
        make_spec(tmp_path / "cnn-ddp", world_size=1, model=_cnn(), channels_last=True),
        make_spec(tmp_path / "cnn-fsdp", strategy="fsdp", world_size=1, model=_cnn(), channels_last=True,
                  optimizer="sgd"),
    ]
    results = run_ranks(specs, 1, timeout_s=240)
    tags = []
    for per_rank in results:
        assert "error" not in per_rank[0], per_rank[0].get("error")
        tags.append({k: v for k, v in per_rank[0]["tags"].items() if k.startswith("tuning.")})
    assert tags[0]["tuning.optimizer_impl"] == "fused" and tags[0]["tuning.vocab_multiple"] == "64"
    assert tags[0]["tuning.loss"] == "chunked" and tags[0]["tuning.reshard_after_forward"] == "false"
    assert tags[1]["tuning.channels_last"] == tags[2]["tuning.channels_last"] == "true"
    assert tags[2]["tuning.optimizer_impl"] == "foreach"
    assert all(t["tuning.step_timing"] == "sync" and t["tuning.compile"] == "false" for t in tags)


def _tiny() -> dict:
    from tests.ranks import TINY_GPT

    return dict(TINY_GPT)


def _cnn() -> dict:
    from tests.ranks import TINY_CNN

    return dict(TINY_CNN)


# ---- the CUDA branch, rehearsed on fake CUDA (tests/fake_cuda.py; forward and backward cannot run) ----

def test_the_gpu_defaults_build_on_fake_cuda(fake_gpu):  # noqa: F811
    """GPT-2's vocabulary padded to 50304, FSDP at one rank not resharding, fused AdamW on DTensor parameters,
    a channels-last ResNet under DDP with a channels-last input, bf16 parameters (precision.mode=params)."""
    from contract.spec import DataSpec, Precision, PrecisionMode, PrecisionSpec
    from jobs import models, parallel
    from jobs.data import input_batches
    from tests import fake_cuda
    from tests.test_gpu_rehearsal import CUDA0

    gpt = ModelSpec(name="gpt_tiny", seq_len=16, vocab_size=50257)
    tuning = _resolve(strategy=FSDP, model=gpt, cuda=True)
    bf16 = PrecisionSpec(name=Precision.bf16, mode=PrecisionMode.params)
    with fake_cuda.fake_world(1), fake_gpu.tensors():
        built = models.build_for(resolved_model(gpt, cuda=True), CUDA0, sharded=True)
        par = parallel.parallelize(built, FSDP, bf16, device=CUDA0, reshard_after_forward=tuning.reshard_after_forward)
        optimizer, impl = parallel.optimizer_for(par.model, "adamw", 1e-4, tuning.optimizer_impl, auto=True)
    assert built.wte.weight.shape[0] == 50304 and impl == "fused" and optimizer.defaults["fused"] is True
    assert par.plan.param_dtype == "bf16"
    states = [m._get_fsdp_state() for m in built.modules() if hasattr(m, "_get_fsdp_state")]
    assert states and all(s._fsdp_param_group is None or s._fsdp_param_group.post_forward_mesh_info is None
                          for s in states)  # reshard_after_forward=False everywhere
    resnet = ModelSpec(name="resnet18", input=InputKind.image, image_size=32, num_classes=10)
    image = _resolve(model=resnet, cuda=True)
    assert image.channels_last and image.cudnn_benchmark
    with fake_cuda.fake_world(1), fake_gpu.tensors():
        built = models.build_for(resnet, CUDA0, sharded=False)
        parallel.parallelize(built, DDP, PrecisionSpec(), device=CUDA0, channels_last=True)
        x, _ = next(input_batches(DataSpec(), resnet, batch_size=2, accum_steps=1, seed=0, rank=0, world_size=1,
                                  device=CUDA0, channels_last=True))
    assert built.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.device.type == "cuda"


def test_event_timing_queues_no_sync_inside_the_window_and_reads_after(fake_gpu):  # noqa: F811
    """step_timing=events: a CUDA event pair per step, nothing synchronised by the loop; the times are read
    when asked (fake CUDA: each interval is 1 ms)."""
    from jobs.loop import EventTime, StepTrace, read_times, run_steps

    class Stepper:
        events, last_skipped = True, None

        def step(self, batches):
            return torch.zeros(()), 0.0

    synced: list[int] = []
    trace = StepTrace()
    run_steps(Stepper(), iter(()), 3, lambda: synced.append(1), trace)  # type: ignore[arg-type]
    assert synced == [] and all(isinstance(t, EventTime) for t in trace.step_time_s)
    assert read_times(trace.step_time_s) == [0.001] * 3 and trace.step_time_s == [0.001] * 3


def test_compile_time_is_the_warm_ups_time_above_the_steady_steps_and_how_measured_names_the_tuning():
    from jobs.summary import compile_time_s
    from launcher.report.markdown import _tuning_text

    history = {"step_time_s": [30.0, 2.0, 1.1, 1.0, 1.0, 1.2], "measured": [False, False, False, True, True, True]}
    assert compile_time_s(history) == pytest.approx(29.0 + 1.0 + 0.1)  # above the measured median, 1.0 s
    rows = [{"tuning.compile": "true", "tuning.optimizer_impl": "fused", "compile_time_s": 41.2},
            {"tuning.compile": "true", "tuning.optimizer_impl": "foreach", "compile_time_s": 43.0}]
    text = _tuning_text(rows)
    assert "compile true, optimizer_impl fused/foreach" in text and "41.2-43.0 s per run" in text
    assert "not recorded" in _tuning_text([{"cell": "old"}])
