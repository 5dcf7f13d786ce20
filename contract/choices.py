"""The choices of the settings (standard library only): each enumerated value a config may take,
with what it means. contract/spec.py and contract/modelspec.py type their fields with them; a module
that needs a choice and not the spec imports it from here."""

from __future__ import annotations

import enum


class Strategy(enum.Enum):
    """The wrapper that applies a cell's data-parallel degrees (StrategySpec's dp_replicate, dp_shard)."""

    ddp = "ddp"  # torch's DistributedDataParallel: replicates only
    fsdp = "fsdp"  # FSDP2's fully_shard on a device mesh: shards, and replicates across shard groups


class Sharding(enum.Enum):
    """What an FSDP unit keeps after forward, named after the ZeRO stage. Which ranks share a
    parameter is not a sharding mode but the degrees (StrategySpec.dp_replicate, dp_shard)."""

    full = "full"  # ZeRO-3: parameters, gradients and optimizer state sharded
    grad_op = "grad_op"  # ZeRO-2: parameters kept after forward (reshard_after_forward=False)
    # The two layouts that were sharding modes before the degrees, refused naming the degrees that
    # say them (StrategySpec.validate): HSDP, and FSDP2 replicating only.
    hybrid = "hybrid"
    none = "none"


class WrapPolicy(enum.Enum):
    block = "block"  # one FSDP unit per block (transformer layer / ResNet stage block)
    model = "model"  # one FSDP unit for the whole model


class Precision(enum.Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"


class PrecisionMode(enum.Enum):
    """How a low precision is applied; the same for DDP and FSDP by default (see PrecisionSpec)."""

    autocast = "autocast"  # fp32 parameters, torch.autocast per op (norms, softmax, loss in fp32)
    params = "params"  # FSDP only: parameters cast to the low dtype for compute (MixedPrecisionPolicy)


class BatchNormUnits(enum.Enum):
    """BatchNorm under FSDP with low-precision parameters (mode=params): it must stay fp32."""

    unit = "unit"  # each BatchNorm its own fp32 FSDP unit; input cast up, output cast back
    grouped = "grouped"  # all BatchNorms in one fp32 unit, inputs left in the low dtype (no casts)



class InputKind(enum.Enum):
    tokens = "tokens"  # int64 [batch, seq_len] in, next-token targets out
    image = "image"  # float [batch, 3, size, size] in, class index out


class DataKind(enum.Enum):
    synthetic = "synthetic"
    image_folder = "image_folder"
    token_file = "token_file"


class Optimizer(enum.Enum):
    sgd = "sgd"
    adamw = "adamw"


class OptimizerImpl(enum.Enum):
    """How the optimizer steps over the parameters (torch.optim's ``fused`` / ``foreach`` flags)."""

    auto = "auto"  # the device's default (contract/tuning.py)
    fused = "fused"  # one kernel over all parameters (fused=True)
    foreach = "foreach"  # a few multi-tensor kernels (foreach=True)
    for_loop = "for_loop"  # one kernel sequence per parameter (foreach=False, fused=False)


class LossImpl(enum.Enum):
    auto = "auto"  # the device's default (contract/tuning.py)
    full = "full"  # cross-entropy over an fp32 copy of the whole logits
    chunked = "chunked"  # fp32 per chunk of rows; the gradient written in the logits' dtype (jobs/loss.py)


class StepTiming(enum.Enum):
    auto = "auto"  # events on CUDA, sync on CPU
    sync = "sync"  # wall clock, the device synchronised after every step (a no-op on CPU)
    events = "events"  # CUDA events around each step, read after the window (CUDA only)


class LrScaling(enum.Enum):
    none = "none"
    linear = "linear"
    sqrt = "sqrt"


class LMHead(enum.Enum):
    """Which Hugging Face language-model head ``model=hf`` builds (``model.head``)."""

    auto = "auto"  # masked_lm for encoder-only architectures (bert, roberta, ...), else causal_lm
    causal_lm = "causal_lm"  # AutoModelForCausalLM: decoders (gpt2, llama, qwen2, mistral, ...)
    masked_lm = "masked_lm"  # AutoModelForMaskedLM: encoders (bert, roberta, ...)


# The importable package model=hf needs, and the command that installs it (the `hf` extra).
HF_PACKAGE = "transformers"
HF_INSTALL = "pip install 'ddp-fsdp-bench[hf]'"
# Keys of model.config that must agree with model.vocab_size and model.seq_len.
HF_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")

