"""The step's tuning settings, resolved for a device: each ``auto`` (``null``) to the device's default,
each value the device cannot run refused (standard library only).

The launcher calls :func:`resolve` before submission, where the device follows from
``cluster.gpus_per_node``; every rank calls it again on the device it really got, so a RunSpec built
by hand gets the same answers. What needs torch to decide (fused optimizers on this torch) is checked
on the rank; the C++ compiler that torch.compile needs for CPU ranks is looked for before launch
(:func:`missing_compiler`, launcher/preflight.py), where the ranks run on this machine.

GPU defaults are a tuned training loop's (torchtitan, llm.c): fused AdamW, channels-last with
cuDNN autotuning, torch.compile (the loss inside it), a vocabulary padded to 64, a loss that never
upcasts the whole logits (compiled: fused by inductor; eager: chunked), step timing by CUDA events. CPU defaults are what measured fastest on CPU
(docs/performance.md, "The step's tuning settings on CPU").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from contract.catalog import GPT_SIZES, padded_vocab
from contract.choices import InputKind, LossImpl, Optimizer, OptimizerImpl, Sharding, StepTiming, Strategy
from contract.errors import ConfigError
from contract.parallel import Layout, ParallelDims

if TYPE_CHECKING:
    from contract.spec import ModelSpec, StrategySpec, TrainSpec

__all__ = ["padded_vocab"]  # contract/catalog.py's, named here beside the vocabulary multiple

GPU_VOCAB_MULTIPLE = 64  # 50257 -> 50304: tensor-core friendly rows (nanoGPT, llm.c)

# What measured fastest on CPU (docs/performance.md): gpt_tiny and cnn, one rank, 2 cores. The
# optimizer: fused where torch has the kernel, on CPU as on CUDA (AdamW's step 2-6x faster there).
CPU_COMPILE = False
CPU_LOSS = LossImpl.full
CPU_CHANNELS_LAST = False
CPU_VOCAB_MULTIPLE = 1

# loss=chunked: rows per chunk, so that one chunk's fp32 logits take about this much memory.
LOSS_CHUNK_BYTES = 64 * 2**20


def chunk_rows(width: int) -> int:
    """Rows of a ``width``-wide logits matrix per chunk of the chunked loss (jobs/loss.py)."""
    return max(1, LOSS_CHUNK_BYTES // (4 * width))


@dataclass(frozen=True)
class Tuning:
    """The resolved settings of one cell on one device (no ``auto`` left)."""

    optimizer_impl: str  # fused | foreach | for_loop
    channels_last: bool
    cudnn_benchmark: bool
    compile: bool
    reshard_after_forward: bool | None  # None under DDP (nothing to reshard)
    vocab_multiple: int  # 1: not padded
    loss: str  # full | chunked
    step_timing: str  # sync | events

    def tags(self) -> dict[str, str]:
        """The run's ``tuning.*`` tags (the report's *How measured* reads them)."""
        return {f"tuning.{k}": _word(v) for k, v in asdict(self).items()}


def _word(value: object) -> str:
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def shard_degree(strategy: StrategySpec, world_size: int, tasks_per_node: int) -> int:
    """Over how many ranks FSDP shards each parameter (1: nothing is sharded; 0 under DDP): the
    parallel layout's shard degree (contract/parallel.py)."""
    if strategy.name is Strategy.ddp:
        return 0
    layout = Layout(nodes=max(1, world_size // tasks_per_node), tasks_per_node=tasks_per_node)
    return ParallelDims.of(strategy, layout).dp_shard


def pads_vocabulary(model: ModelSpec) -> bool:
    """Whether ``model.vocab_multiple`` can apply: the project's GPT models, built by this project."""
    return model.name in GPT_SIZES and not model.target_path


def resolved_model(model: ModelSpec, *, cuda: bool) -> ModelSpec:
    """``model`` with its vocabulary multiple resolved for the device: what the ranks build, so that the
    fit, the traffic and the FLOPs count the padded rows too."""
    import dataclasses

    return dataclasses.replace(model, vocab_multiple=_vocab_multiple(model, cuda))


def resolve(train: TrainSpec, strategy: StrategySpec, model: ModelSpec, *, cuda: bool, world_size: int,
            tasks_per_node: int) -> Tuning:
    """Each setting resolved for ``cuda`` (else CPU), or :class:`ConfigError` naming the fix."""
    device = "CUDA" if cuda else "CPU"
    image = model.input is InputKind.image
    compiled = train.compile if train.compile is not None else (True if cuda else CPU_COMPILE)
    return Tuning(
        optimizer_impl=_optimizer_impl(train, strategy),
        channels_last=_channels_last(train.channels_last, image, cuda),
        cudnn_benchmark=_cuda_only("cudnn_benchmark", train.cudnn_benchmark, cuda, device,
                                   "cuDNN's autotuner picks convolution kernels on NVIDIA GPUs"),
        compile=compiled,
        reshard_after_forward=reshards_after_forward(strategy, shard_degree(strategy, world_size, tasks_per_node)),
        vocab_multiple=_vocab_multiple(model, cuda),
        loss=_loss(train.loss, image, cuda, compiled),
        step_timing=_step_timing(train.step_timing, cuda),
    )


def _loss(value: LossImpl, image: bool, cuda: bool, compiled: bool) -> str:
    value = LossImpl(value)
    if value is not LossImpl.auto:
        return value.value
    if image:  # a classifier's logits are small: nothing to chunk
        return LossImpl.full.value
    if compiled:
        # Compiled with the model (jobs/compiling.py), the whole cross-entropy is fused by inductor: the
        # upcast happens inside its kernels, so no fp32 copy of the logits is made, and no chunk loop
        # unrolls into a hundred small graphs' worth of kernels.
        return LossImpl.full.value
    return (LossImpl.chunked if cuda else CPU_LOSS).value


def _optimizer_impl(train: TrainSpec, strategy: StrategySpec) -> str:
    impl = OptimizerImpl(train.optimizer_impl)
    sharded = strategy.name is Strategy.fsdp
    sgd = Optimizer(train.optimizer) is Optimizer.sgd
    if impl is OptimizerImpl.fused and sgd and sharded:
        raise ConfigError("optimizer_impl", "fused", "fused SGD has no kernel for FSDP's sharded (DTensor) "
                          "parameters in torch (fused AdamW has).",
                          "use optimizer_impl=foreach (or auto) with SGD under FSDP, or optimizer=adamw.")
    if impl is not OptimizerImpl.auto:
        return impl.value
    # Fused where torch has the kernel, on CUDA and CPU alike: AdamW everywhere (DTensor too), SGD on
    # plain tensors. A torch without the CPU kernel (before 2.4) steps foreach (jobs/parallel.py).
    return (OptimizerImpl.foreach if sgd and sharded else OptimizerImpl.fused).value


def _channels_last(value: bool | None, image: bool, cuda: bool) -> bool:
    if value and not image:
        raise ConfigError("channels_last", True, "channels-last is a memory format of 4-D image tensors; this "
                          "model takes tokens.", "drop channels_last (or set channels_last=null).")
    if value is not None:
        return value
    return image and (cuda or CPU_CHANNELS_LAST)


def _cuda_only(setting: str, value: bool | None, cuda: bool, device: str, why: str) -> bool:
    if value and not cuda:
        raise ConfigError(setting, True, f"{why}; these ranks run on the {device}.",
                          f"drop {setting} (null: on for GPU ranks) or run on GPU nodes (cluster.gpus_per_node>0).")
    return cuda if value is None else value


def reshards_after_forward(strategy: StrategySpec, degree: int) -> bool | None:
    """Whether FSDP's units reshard after forward at this shard ``degree`` (None under DDP), or
    :class:`ConfigError` for a contradiction."""
    value = strategy.reshard_after_forward
    if strategy.name is Strategy.ddp:
        if value is not None:
            raise ConfigError("strategy.reshard_after_forward", value, "is FSDP's; DDP keeps every parameter "
                              "whole and reshards nothing.", "drop it, or use an FSDP strategy (strategy=fsdp).")
        return None
    if strategy.sharding is Sharding.grad_op:
        if value:
            raise ConfigError("strategy.reshard_after_forward", True, "contradicts strategy.sharding=grad_op "
                              "(ZeRO-2: parameters kept gathered after forward).",
                              "use strategy=fsdp (full sharding reshards after forward), or drop the override.")
        return False
    if value is False and degree > 1:
        raise ConfigError("strategy.reshard_after_forward", False, f"with strategy.sharding="
                          f"{Sharding(strategy.sharding).value} over {degree} ranks is ZeRO-2, which has its own name.",
                          "use strategy=zero2 (strategy.sharding=grad_op), or drop the override.")
    if value is not None:
        return value
    # Resharding frees memory only where a parameter is split over several ranks.
    return degree > 1


def _vocab_multiple(model: ModelSpec, cuda: bool) -> int:
    value = model.vocab_multiple
    if value is None:
        return (GPU_VOCAB_MULTIPLE if cuda else CPU_VOCAB_MULTIPLE) if pads_vocabulary(model) else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("model.vocab_multiple", value, "must be a positive integer.",
                          "use model.vocab_multiple=64 (or null for the device's default).")
    if value > 1 and not pads_vocabulary(model):
        raise ConfigError("model.vocab_multiple", value, f"pads the vocabulary of the project's GPT models "
                          f"({', '.join(GPT_SIZES)}); model={model.name} builds its own embedding.",
                          "drop model.vocab_multiple (or set it to null).")
    return value


def _step_timing(value: StepTiming, cuda: bool) -> str:
    value = StepTiming(value)
    if value is StepTiming.events and not cuda:
        raise ConfigError("step_timing", "events", "times steps with CUDA events; these ranks run on the CPU.",
                          "use step_timing=sync (or auto: events on GPU ranks, wall clock on CPU).")
    if value is StepTiming.auto:
        return (StepTiming.events if cuda else StepTiming.sync).value
    return value.value


def missing_compiler(environ: Mapping[str, str] | None = None) -> str | None:
    """Why torch.compile could not build a CPU rank's kernels with ``environ`` (this process's
    environment by default), or None. Inductor compiles the C++ it generates with ``$CXX``, else
    ``g++``, found on ``PATH`` (torch/_inductor/config.py ``cpp.cxx``; it installs one from conda only
    where TORCH_INDUCTOR_INSTALL_GXX is set): without one, a compiled cell fails inside its ranks."""
    env = os.environ if environ is None else environ
    if env.get("TORCH_INDUCTOR_INSTALL_GXX"):
        return None
    cxx = env.get("CXX") or "g++"
    if shutil.which(cxx, path=env.get("PATH", os.defpath)) is not None:
        return None
    named = f"CXX={cxx}" if env.get("CXX") else "g++ (CXX is not set)"
    return (f"torch.compile builds a CPU rank's kernels with a C++ compiler, and {named} is not found on PATH "
            f"here")
