"""Fit before launch, beyond model state (tests/test_fit.py): the activation estimate against the
tensors a real CPU forward saves, the GPU memory a cell is checked against (named GPU types,
literal nvidia-smi and sinfo output), and a refused cell through the real --plan."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.spec import InputKind, ModelSpec
from jobs.loop import loss_fn
from jobs.models import build_model
from launcher.__main__ import main
from launcher.cluster.onemachine import parse_gpu_query
from launcher.cluster.slurm.resources import parse_sinfo
from launcher.plan import fit


def real_saved_bytes(spec: ModelSpec, batch_size: int) -> int:
    """What a real CPU forward and loss keep for backward: each storage once, parameters excluded
    (counted by storage address, which the meta estimate cannot use)."""
    torch.manual_seed(0)
    module = build_model(spec)
    if spec.input is InputKind.tokens:
        x = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len))
        y = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len))
    else:
        x = torch.randn(batch_size, 3, spec.image_size, spec.image_size)
        y = torch.randint(0, spec.num_classes, (batch_size,))
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(module(x), y)
    assert torch.isfinite(loss)
    return sum(storages.values())


def activation_estimate(spec: ModelSpec, batch_size: int, low_dtype: str | None, checkpointing: bool) -> int | None:
    """The launcher's estimate, from the analysis preflight runs (fit.analyse)."""
    return fit.analyse(spec, batch_size, low_dtype, checkpointing)[1]


@pytest.mark.parametrize("spec, batch_size", [
    (ModelSpec(name="gpt_tiny", seq_len=64, vocab_size=512), 4),
    (ModelSpec(name="mlp", input=InputKind.image, image_size=16, num_classes=10), 8),
    (ModelSpec(name="cnn", input=InputKind.image, image_size=32, num_classes=10), 4),
    (ModelSpec(name="resnet18", input=InputKind.image, image_size=64, num_classes=10), 2),
    # a transformers model, whose forward skips its data-dependent checks on fake tensors
    (ModelSpec(name="hf", arch="gpt2", seq_len=64, vocab_size=1000,
               config={"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 64}), 4),
])
def test_activation_estimate_on_meta_matches_a_real_forward(spec, batch_size):
    estimate = activation_estimate(spec, batch_size, None, checkpointing=False)
    measured = real_saved_bytes(spec, batch_size)
    assert measured > 0 and abs(estimate - measured) / measured < 0.05, (estimate, measured)


def test_activation_estimate_scales_with_batch_and_shrinks_with_checkpointing_and_low_precision():
    spec = ModelSpec(name="gpt_tiny", seq_len=64, vocab_size=512)
    one, four = (activation_estimate(spec, b, None, False) for b in (1, 4))
    assert four == pytest.approx(4 * one, rel=0.02)
    checkpointed = activation_estimate(spec, 4, None, True)
    assert checkpointed < 0.7 * four  # only block inputs and one block's own tensors stay
    # Under autocast the matmul inputs are saved as bf16 copies; norms and the loss stay fp32.
    assert activation_estimate(spec, 4, "bfloat16", False) < 0.9 * four


@pytest.mark.parametrize("name, gib", [
    ("h100", 79.6), ("NVIDIA H100 80GB HBM3", 79.6), ("NVIDIA H100 NVL", 93.6), ("h200", 140.4),
    ("NVIDIA A100-SXM4-80GB", 80.0), ("a100_40g", 40.0), ("a100", None), ("v100", None), ("Tesla V100-SXM2-32GB", 32.0),
    ("NVIDIA L4", 22.5), ("NVIDIA L40S", 45.0), ("NVIDIA A10G", 22.5), ("Tesla T4", 15.0), ("rtx8000", None),
])
def test_gpu_memory_of_named_gpu_models(name, gib):
    assert fit.gpu_mem_gib_of(name) == gib


def test_nvidia_smi_memory_query_is_parsed():
    text = "NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n"  # --query-gpu=name,memory.total
    assert parse_gpu_query(text) == [("NVIDIA H100 80GB HBM3", 81559 / 1024)] * 2
    assert parse_gpu_query("") == []


def test_sinfo_gres_gives_each_partitions_gpu_types():
    text = ("gpu*|16|2-00:00:00|96|1024000|gpu:h100:8(S:0-1)\n"
            "gpu*|4|2-00:00:00|64|512000|gpu:a100_80g:4(S:0),nvme:1\n"
            "cpu|32|1-00:00:00|128|256000|(null)\n"
            "debug|2|30:00|8|16000|gpu:2\n")
    parts = parse_sinfo(text)
    assert parts["gpu"]["gpu_types"] == {"h100", "a100_80g"} and parts["gpu"]["nodes"] == 20
    assert parts["gpu"]["cpus"] == 64 and parts["gpu"]["mem_mb"] == 512000 and parts["gpu"]["default"]
    assert parts["cpu"]["gpu_types"] == set() and parts["debug"]["gpu_types"] == set()


needs_slurm = pytest.mark.skipif(not os.environ.get("SLURM_CONF") or not shutil.which("srun"),
                                 reason="needs the Slurm test cluster: run the tests with scripts/test")


@needs_slurm
def test_a_cell_too_big_for_its_gpu_type_is_refused_before_submission(tmp_path, capsys):
    """gpt2-xl at batch 8 on A10Gs (22.5 GiB): DDP's model state alone (25 GiB) does not fit; FSDP over
    8 ranks holds 3 GiB of state but about 39 GiB of activations; with activation checkpointing it
    fits. Refused with the figures and the fixes, once per configuration (not per run), beside what
    the test cluster's GPU-less nodes cannot give; allow_oom=true drops the fit refusal; nothing is
    created."""
    # A real run: --plan answers the what-if instead (tests/test_declared.py).
    args = ["-m", "cluster=slurm", "cluster.gpus_per_node=8", "cluster.tasks_per_node=8",
            "cluster.gpu_type=a10g", "model=gpt2-xl", "batch_size=8", f"output_root={tmp_path / 'out'}"]
    assert main([*args, "strategy=ddp,fsdp"]) == 2
    err = capsys.readouterr().err
    assert "[strategy=ddp] predicted" in err and "[strategy=fsdp] predicted" in err and "22.5 GiB" in err
    assert "run=" not in err  # the 3 runs of a configuration share one message
    fsdp = next(line for line in err.splitlines() if line.startswith("[strategy=fsdp] predicted"))
    assert "activations about 39" in fsdp and "activation_checkpointing=true" in fsdp and "allow_oom=true" in fsdp
    # The test cluster's nodes have no GPUs: that refusal stays, the fit refusal goes.
    assert "8 a10g GPUs per node (cluster.gpus_per_node): no node of partition" in err
    for fixed in (["strategy=fsdp", "activation_checkpointing=true"], ["strategy=ddp", "allow_oom=true"]):
        assert main([*args, *fixed]) == 2
        err = capsys.readouterr().err
        assert "GPUs per node" in err and "predicted" not in err, err
    assert not (tmp_path / "out").exists()


@needs_slurm
def test_the_sbatch_script_asks_for_the_gpu_type(tmp_path):
    """cluster.gpu_type reaches sbatch as --gpus-per-node=<type>:<n> (what --plan prints)."""
    from launcher import preview
    from launcher.plan import grid, planner

    points, swept = grid.expand(["cluster=slurm", "cluster.gpus_per_node=8", "cluster.tasks_per_node=8",
                                 "cluster.gpu_type=a10g", "runs=1", f"output_root={tmp_path}"], False)
    cells = planner.plan(grid.compose(points, swept))
    assert "#SBATCH --gpus-per-node=a10g:8" in preview.render(cells, {}, max_array_size=1000)


def _plan_imports_torch(cache: Path, *overrides: str) -> bool:
    """Run --plan in a fresh interpreter with ``cache`` as XDG_CACHE_HOME; did it import torch?"""
    code = ("import sys; from launcher.__main__ import main; "
            f"assert main(['--plan', '-m', *{list(overrides)!r}]) == 0; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XDG_CACHE_HOME": str(cache)}, check=True).stdout
    return out.strip().splitlines()[-1] == "True"


def test_the_fit_analysis_is_cached_between_launches_except_for_user_code(tmp_path):
    """A grid checked before is checked again without importing torch; another batch size is a new
    analysis; a dotted-path model (a user's code, whose changes the key cannot see) never is cached."""
    cache = tmp_path / "cache"
    grid = ("strategy=ddp,fsdp", "batch_size=4", f"output_root={tmp_path / 'out'}")
    assert _plan_imports_torch(cache, *grid)
    assert list((cache / "ddp-fsdp-bench" / "fit").glob("*.json"))
    assert not _plan_imports_torch(cache, *grid)
    assert _plan_imports_torch(cache, "strategy=ddp,fsdp", "batch_size=2", f"output_root={tmp_path / 'out'}")
    user = ("model=custom", "model._target_=torch.nn.Embedding", "model.input=tokens", "model.seq_len=8",
            "model.vocab_size=16", "+model.params.num_embeddings=16", "+model.params.embedding_dim=16",
            f"output_root={tmp_path / 'out'}")
    assert _plan_imports_torch(cache, *user) and _plan_imports_torch(cache, *user)
    assert not (tmp_path / "out").exists()


# What the first GPU check measured on an H200 (docs/gpu/run1, torch.cuda.max_memory_allocated over
# the measured window, one rank): the fit check's predicted peak must hold them, within 10%.
GPU_RUN1_PEAK_GIB = [
    (ModelSpec(name="gpt2-small", seq_len=1024, vocab_size=50257), 16, "bfloat16", 16.51),
    (ModelSpec(name="resnet50", input=InputKind.image, image_size=224, num_classes=1000), 128, None, 11.01),
    (ModelSpec(name="resnet50", input=InputKind.image, image_size=224, num_classes=1000), 128, "bfloat16", 6.07),
]


@pytest.mark.parametrize("spec, batch_size, low_dtype, measured_gib", GPU_RUN1_PEAK_GIB)
def test_predicted_peak_holds_what_the_gpu_measured(spec, batch_size, low_dtype, measured_gib):
    # Before the loss's gradients were counted, GPT-2 small's prediction was 10.3 GiB (0.62x).
    from contract.spec import Layout, Optimizer, StrategySpec

    shapes, activations, _ = fit.analyse(spec, batch_size, low_dtype, checkpointing=False)
    state = fit.predict(shapes, StrategySpec(), Layout(nodes=1, tasks_per_node=1, gpus_per_node=1), Optimizer.adamw)
    peak_gib = dataclasses.replace(state, activations=activations,
                                   loss_grads=fit.loss_grad_bytes(spec, batch_size)).peak / fit.GIB
    assert 0.9 <= measured_gib / peak_gib <= 1.1, (peak_gib, measured_gib)


def test_the_compiled_loss_is_predicted_as_one_gradient_in_the_logits_dtype():
    # The second GPU check (docs/gpu/run3): GPT-2 small, 32 x 1024 tokens, bf16, compiled (DDP, the whole
    # cross-entropy inside the graph), one H200: 18.60 GiB measured. Uncompiled, the loss holds two fp32
    # copies of the logits; compiled, inductor fuses the upcast.
    from contract.spec import Layout, Optimizer, StrategySpec

    spec = ModelSpec(name="gpt2-small", seq_len=1024, vocab_size=50257, vocab_multiple=64)
    shapes, activations, _ = fit.analyse(spec, 32, "bfloat16", checkpointing=False)
    state = fit.predict(shapes, StrategySpec(), Layout(nodes=1, tasks_per_node=1, gpus_per_node=1), Optimizer.adamw)
    compiled = fit.loss_grad_bytes(spec, 32, "full", "bfloat16", compiled=True)
    assert compiled == 2 * 32 * 1024 * 50304 and compiled * 4 == fit.loss_grad_bytes(spec, 32, "full", "bfloat16")
    peak_gib = dataclasses.replace(state, activations=activations, loss_grads=compiled).peak / fit.GIB
    assert 0.8 <= 18.60 / peak_gib <= 1.1, peak_gib

