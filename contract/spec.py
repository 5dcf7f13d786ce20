"""What one grid point runs: plain, picklable dataclasses (stdlib only).

These types are the single schema of the project. The launcher registers them in Hydra's
ConfigStore (values come from conf/*.yaml) and ships them, validated, to every rank through
submitit's pickle. Nothing here imports torch, Hydra or OmegaConf, so the worker side stays free
of config machinery and the launcher starts fast.

Every check that can be decided from the config alone lives in a ``validate()`` method and raises
:class:`ConfigError`, whose message names the setting, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from contract.catalog import KNOWN_MODELS
from contract.imports import import_problem


class ConfigError(ValueError):
    """A bad setting, reported as one paragraph: setting, value, why, and the fix."""

    def __init__(self, setting: str, value: Any, problem: str, fix: str) -> None:
        self.setting, self.value, self.problem, self.fix = setting, value, problem, fix
        super().__init__(f"{setting}={value!r}: {problem} Fix: {fix}")


class Strategy(enum.Enum):
    ddp = "ddp"
    fsdp = "fsdp"


class Sharding(enum.Enum):
    """FSDP sharding modes, named after what they shard (ZeRO stage in the comment)."""

    full = "full"  # ZeRO-3: parameters, gradients and optimizer state sharded
    grad_op = "grad_op"  # ZeRO-2: parameters kept after forward (reshard_after_forward=False)
    hybrid = "hybrid"  # HSDP: replicate across nodes, shard within a node (2-D mesh)
    none = "none"  # DDP-equivalent, for comparison: every rank holds everything


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


def _positive(setting: str, value: Any, fix: str) -> None:
    # NaN compares false with everything: checked apart, or lr=NaN would pass "not <= 0".
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(setting, value, "must be a positive (finite) number.", fix)


def _non_negative(setting: str, value: Any, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(setting, value, "must be zero or a positive (finite) number.", fix)


def non_finite(obj: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is a float NaN or infinity (a YAML .nan, lr=nan on the command line, a
    NaN in a spec.json): no setting of this schema means anything by one."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [k for f in dataclasses.fields(obj) for k in non_finite(getattr(obj, f.name), f"{prefix}{f.name}.")]
    if isinstance(obj, dict):
        return [k for name, v in obj.items() for k in non_finite(v, f"{prefix}{name}.")]
    if isinstance(obj, (list, tuple)):
        return [k for i, v in enumerate(obj) for k in non_finite(v, f"{prefix}{i}.")]
    return [prefix[:-1]] if isinstance(obj, float) and not math.isfinite(obj) else []


@dataclass
class StrategySpec:
    name: Strategy = Strategy.ddp
    # DDP knobs (torch.nn.parallel.DistributedDataParallel arguments, same names).
    bucket_cap_mb: float = 25.0
    # Gradients as views into the all-reduce buckets: no copy into and out of them, no second copy of
    # the gradients (free wherever DDP runs; off only when asked).
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    # FSDP2 knobs (torch.distributed.fsdp.fully_shard).
    sharding: Sharding = Sharding.full
    cpu_offload: bool = False
    # How many FSDP units ahead to all-gather in forward and backward (0 = FSDP2's default
    # implicit prefetch of the next unit only).
    prefetch: int = 0
    wrap: WrapPolicy = WrapPolicy.block
    # Whether each FSDP unit frees its gathered parameters after forward (FSDP2's
    # reshard_after_forward). None: auto, i.e. not where resharding frees nothing (a shard degree of
    # 1, e.g. one rank) and not under sharding=grad_op; contract/tuning.py resolves and checks it.
    reshard_after_forward: bool | None = None

    def validate(self) -> None:
        _positive("strategy.bucket_cap_mb", self.bucket_cap_mb, "use a bucket size in MiB such as 25.")
        _non_negative("strategy.prefetch", self.prefetch, "use 0 (FSDP's default), 1 or 2.")
        if self.name is Strategy.ddp and self.sharding is not Sharding.full:
            raise ConfigError(
                "strategy.sharding", self.sharding.value,
                "sharding applies to FSDP only; DDP replicates everything.",
                "pick an FSDP strategy (strategy=fsdp, zero2, hsdp, fsdp_noshard) or drop the override.",
            )
        if self.name is Strategy.ddp and self.cpu_offload:
            raise ConfigError(
                "strategy.cpu_offload", True, "DDP cannot offload parameters to the CPU.",
                "use strategy=fsdp_offload (FSDP full shard with CPU offload).",
            )

    @property
    def label(self) -> str:
        if self.name is Strategy.ddp:
            return "ddp"
        base = {Sharding.full: "fsdp", Sharding.grad_op: "zero2", Sharding.hybrid: "hsdp",
                Sharding.none: "fsdp_noshard"}[self.sharding]
        return base + ("+offload" if self.cpu_offload else "")


@dataclass
class PrecisionSpec:
    """The compute precision, applied the same way under DDP and FSDP unless ``mode`` says otherwise.

    ``mode=autocast`` (default, DDP and FSDP): fp32 parameters and optimizer, ``torch.autocast`` to
    ``name`` around forward and loss; FSDP all-gathers fp32 parameters. ``mode=params`` (FSDP only):
    parameters are all-gathered and used in ``param_dtype`` (default: ``name``), gradients reduced
    in ``reduce_dtype``; pure low-precision compute with fp32 sharded master weights.
    """

    name: Precision = Precision.fp32
    mode: PrecisionMode = PrecisionMode.autocast
    # FSDP mixed-precision policy (mode=params); None derives it from `name` (params in the compute
    # dtype, gradient reduction in fp32, which is what keeps bf16 training numerically safe).
    param_dtype: Precision | None = None  # a dtype: the same three names
    reduce_dtype: Precision | None = Precision.fp32
    # BatchNorm under FSDP with mode=params (see BatchNormUnits).
    batchnorm: BatchNormUnits = BatchNormUnits.unit

    def validate(self) -> None:
        if self.name is Precision.fp32 and self.param_dtype not in (None, Precision.fp32):
            raise ConfigError(
                "precision.param_dtype", self.param_dtype.value,
                "a low-precision parameter dtype contradicts precision=fp32.",
                "use precision=bf16 or precision=fp16, or drop the override.",
            )
        if PrecisionMode(self.mode) is PrecisionMode.autocast and self.param_dtype not in (None, Precision.fp32):
            raise ConfigError(
                "precision.param_dtype", self.param_dtype.value,
                "casting parameters is precision.mode=params; under mode=autocast parameters stay fp32.",
                "add precision.mode=params (FSDP strategies only), or drop the param_dtype override.",
            )


@dataclass(frozen=True)
class PrecisionPlan:
    """What a precision setting means for one strategy (dtype names; None = fp32 / off).

    ``autocast``: the dtype of ``torch.autocast`` around forward and loss (fp32 master weights,
    per-op casts, norms and softmax in fp32). ``param_dtype`` / ``reduce_dtype``: FSDP2's
    MixedPrecisionPolicy (parameters all-gathered and used in that dtype; gradients reduced in
    ``reduce_dtype``). ``grad_scaler``: fp16 loss scaling.
    """

    mode: str
    autocast: str | None
    param_dtype: str | None
    reduce_dtype: str | None
    grad_scaler: bool


def precision_plan(strategy: Strategy, precision: PrecisionSpec) -> PrecisionPlan:
    """The same numerics for DDP and FSDP by default (``precision.mode=autocast``).

    ``mode=params`` (FSDP only) casts the parameters themselves (pure low-precision compute,
    half the all-gather bytes); DDP has no public equivalent (its ``_MixedPrecision`` is private
    and CUDA-only), so it is refused there rather than silently run as something else.
    """
    name = precision.name
    mode = PrecisionMode(precision.mode)
    if name is Precision.fp32:
        return PrecisionPlan(mode.value, None, None, None, False)
    low = name.value
    reduce = precision.reduce_dtype.value if precision.reduce_dtype is not None else None
    if mode is PrecisionMode.autocast:
        # FSDP keeps fp32 parameters (and fp32 all-gathers); gradients are fp32, so an fp32
        # reduce_dtype is a no-op and a low one (bf16 reduce-scatter) is honoured.
        fsdp_reduce = None if reduce in (None, "fp32") else reduce
        return PrecisionPlan(mode.value, low, None, fsdp_reduce if strategy is Strategy.fsdp else None,
                             name is Precision.fp16)
    if strategy is not Strategy.fsdp:
        raise ValueError(
            "precision.mode=params with strategy=ddp: DDP cannot run low-precision parameters over fp32 master "
            "weights (its mixed precision is private and CUDA-only). Fix: use precision.mode=autocast (the default) "
            "to compare DDP with FSDP, or run mode=params with an FSDP strategy only.")
    param = precision.param_dtype.value if precision.param_dtype is not None else low
    return PrecisionPlan(mode.value, None, param, reduce, name is Precision.fp16)


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


@dataclass
class ModelSpec:
    # A name from jobs.models.REGISTRY; `hf` (a Hugging Face transformers model built from a
    # config, see below); or any importable model through `_target_`.
    name: str = "gpt_tiny"
    # Hydra's convention: the dotted path of an nn.Module class, or of a function returning one,
    # called with `params` as keyword arguments; dicts with their own `_target_` inside `params`
    # are instantiated first, recursively (hydra.utils.instantiate's semantics, without Hydra).
    # Its input is described by the fields below.
    _target_: str | None = None
    target: str | None = None  # alias of `_target_`
    input: InputKind = InputKind.tokens
    seq_len: int = 128
    vocab_size: int = 50257
    image_size: int = 224
    num_classes: int = 1000
    params: dict[str, Any] = field(default_factory=dict)
    # model=hf: the architecture, as transformers.AutoConfig.for_model(arch, **config) takes it
    # (gpt2, llama, bert, qwen2, mistral, ...), or a directory holding a config.json instead.
    arch: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    config_path: str | None = None
    # model=hf: a local directory written by save_pretrained; its weights are loaded (no hub access).
    pretrained_path: str | None = None
    head: LMHead = LMHead.auto
    # The project's GPT models: the embedding and output rows padded up to a multiple of this
    # (50257 -> 50304 for 64); padded ids never occur in the data nor count in the loss. None:
    # the device's default (contract/tuning.py: 64 on CUDA).
    vocab_multiple: int | None = None

    @property
    def target_path(self) -> str | None:
        """The dotted path to build, from `_target_` or its alias `target` (None: a named model)."""
        return self._target_ or self.target

    @property
    def is_hf(self) -> bool:
        return self.name == "hf" and not self.target_path

    def validate(self) -> None:
        for name in ("seq_len", "vocab_size", "image_size", "num_classes"):
            _positive(f"model.{name}", getattr(self, name), f"set model.{name} to a positive integer.")
        if self._target_ and self.target and self._target_ != self.target:
            raise ConfigError("model.target", self.target, f"contradicts model._target_={self._target_!r} "
                              "(model.target is an alias of model._target_).", "set only one of the two.")
        target = self.target_path
        setting = "model._target_" if self._target_ else "model.target"
        if self.name == "custom" and target in (None, "???"):
            raise ConfigError("model.target", target, "model=custom builds the class named by model._target_ "
                              "(alias model.target), and none is given; it must be importable on the nodes.",
                              "set model._target_=package.module.Class (e.g. torchvision.models.resnet50 where torchvision "
                              "is installed).")
        if target is not None:
            module = target.rpartition(".")[0]
            if target == "???" or not module:
                raise ConfigError(setting, target, "is not a dotted class path.",
                                  f"set {setting}=package.module.Class for an installed package "
                                  "(e.g. mypackage.models.MyNet).")
            problem = import_problem(module)
            if problem:
                raise ConfigError(setting, target, f"does not import: {problem}.",
                                  "install that package where the launcher and the ranks run, or name a class of a "
                                  "package installed there.")
        elif self.name == "hf":
            self._validate_hf()
        elif self.name not in KNOWN_MODELS:
            raise ConfigError("model.name", self.name, "is not a model this project builds.",
                              f"use one of {', '.join(KNOWN_MODELS)}, model=hf with model.arch, "
                              "or model=custom with model._target_.")
        else:
            self._validate_named()

    def _validate_named(self) -> None:
        """A built-in model: model.config is model=hf's and would be dropped; its params are layer
        counts and sizes (at least 1; d_ff 0 means 4 x d_model) and a dropout in [0, 1)."""
        if self.config:
            key = next(iter(self.config))
            raise ConfigError(f"model.config.{key}", self.config[key], f"model.config is read by model=hf only, and "
                              f"model={self.name} is a built-in model: it would be dropped without a word.",
                              "set its sizes through model.params (e.g. model.params.n_layer=4), or use model=hf "
                              "with model.arch.")
        for key, value in self.params.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key == "dropout":
                if not 0 <= value < 1:
                    raise ConfigError(f"model.params.{key}", value, "is not a dropout probability.",
                                      "use a value in [0, 1), e.g. model.params.dropout=0.1.")
            elif not isinstance(value, int) or value < (0 if key == "d_ff" else 1):
                raise ConfigError(f"model.params.{key}", value, f"is a count or a size of model={self.name}: a whole "
                                  f"number of at least {0 if key == 'd_ff' else 1}.",
                                  f"set model.params.{key} to a positive integer, or drop it for the model's default.")

    def _validate_hf(self) -> None:
        """Cheap model=hf checks (no import, no torch: the launcher runs them at composition);
        jobs.models.hf_checks does those that import transformers, before submission."""
        import importlib.util
        import os

        if importlib.util.find_spec(HF_PACKAGE) is None:
            raise ConfigError("model", "hf", f"builds Hugging Face models and needs the {HF_PACKAGE} package, "
                              "which is not installed here (nor, likely, on the nodes).",
                              f"{HF_INSTALL} (where the launcher and the ranks run).")
        if self.input is not InputKind.tokens:
            raise ConfigError("model.input", self.input.value, "model=hf builds language models, which take tokens.",
                              "set model.input=tokens.")
        sources = [s for s in ("arch", "config_path", "pretrained_path") if getattr(self, s)]
        if not sources:
            raise ConfigError("model.arch", self.arch, "model=hf needs an architecture: model.arch (a name), "
                              "model.config_path or model.pretrained_path (a directory with a config.json).",
                              "set model.arch=gpt2 (or llama, bert, qwen2, mistral, ...).")
        if len(sources) > 1:
            given = " and ".join(f"model.{s}" for s in sources)
            unset = " ".join(f"model.{s}=null" for s in sources if s != sources[-1])
            raise ConfigError(f"model.{sources[-1]}", getattr(self, sources[-1]), f"{given} both name the "
                              "architecture; model=hf takes one of model.arch, model.config_path and "
                              "model.pretrained_path.",
                              f"add {unset}" + (" 'model.config={}'" if self.config else "")
                              + " (the shipped model=hf sets model.arch and a tiny model.config).")
        if "model_type" in self.config:
            raise ConfigError("model.config.model_type", self.config["model_type"], "the architecture is "
                              "model.arch: model.config holds the settings of its config class.",
                              f"set model.arch={self.config['model_type']} and drop model.config.model_type.")
        if self.config and not self.arch:
            raise ConfigError("model.config", dict(self.config), f"model.config overrides apply to model.arch; with "
                              f"model.{sources[0]} the directory's config.json is used as is.",
                              "add 'model.config={}', and edit the config.json instead.")
        for path_setting in ("config_path", "pretrained_path"):
            path = getattr(self, path_setting)
            if path and not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"model.{path_setting}", path, "holds no config.json (a local directory "
                                  "written by save_pretrained is expected; nothing is downloaded).",
                                  "give the absolute path of such a directory that every node can read.")
        vocab = self.config.get("vocab_size")
        if vocab is not None and vocab != self.vocab_size:
            raise ConfigError("model.config.vocab_size", vocab, f"differs from model.vocab_size={self.vocab_size}, "
                              "the vocabulary the data is drawn from.",
                              f"set model.vocab_size={vocab} and drop model.config.vocab_size (it follows "
                              "model.vocab_size).")
        for key in HF_POSITION_KEYS:
            positions = self.config.get(key)
            if positions is not None and positions < self.seq_len:
                raise ConfigError(f"model.config.{key}", positions, f"is below model.seq_len={self.seq_len}: "
                                  "the model has no position for the later tokens.",
                                  f"raise model.config.{key} to at least {self.seq_len}, or drop it (it follows "
                                  "model.seq_len), or lower model.seq_len.")


# The layout of a token file (nanoGPT's train.bin): flat uint16 token ids.
@dataclass
class DataSpec:
    kind: DataKind = DataKind.synthetic
    # token_file: a flat uint16 token file; image_folder: a directory <path>/<class>/<image>.
    path: str | None = None
    num_workers: int = 0  # DataLoader worker processes per rank (0: load in the training process)
    pin_memory: bool = True  # applied only when the ranks train on CUDA
    prefetch_factor: int = 2  # batches each worker loads ahead; applied only with num_workers > 0

    def validate(self) -> None:
        import os

        _non_negative("data.num_workers", self.num_workers, "use 0 (load in the training process) or more.")
        _positive("data.prefetch_factor", self.prefetch_factor, "use 2 (PyTorch's default).")
        if self.kind is DataKind.synthetic:
            return
        if not self.path:
            raise ConfigError("data.path", self.path, f"data.kind={self.kind.value} reads files.",
                              "set data.path to the dataset, or use data=synthetic.")
        # Checked where the launcher runs: the ranks read the same path (a shared filesystem on
        # a cluster), and a missing dataset found by every rank after queueing wastes the allocation.
        want_dir = self.kind is DataKind.image_folder
        if not (os.path.isdir(self.path) if want_dir else os.path.isfile(self.path)):
            what = "a directory of class subdirectories" if want_dir else "a flat uint16 token file"
            raise ConfigError("data.path", self.path, f"data.kind={self.kind.value} needs {what}, and there is none "
                              "at this path.", "give the absolute path of an existing dataset that every node can "
                              "read (a shared filesystem), or use data=synthetic.")


@dataclass
class TrainSpec:
    """The top-level settings of a grid point (``nodes=2 batch_size=16 steps=30``)."""

    nodes: int = 1
    batch_size: int = 8  # per device (per rank), per micro-step
    steps: int = 30  # total optimizer steps, warm-up included
    warmup_steps: int = 10  # excluded from every measurement
    repeats: int = 1  # measured windows after warm-up; mean and coefficient of variation
    grad_accum_steps: int = 1
    seed: int = 0
    optimizer: Optimizer = Optimizer.adamw
    lr: float = 1e-4
    lr_scaling: LrScaling = LrScaling.none
    activation_checkpointing: bool = False
    # torch.compile of the wrapped model; None: the device's default (contract/tuning.py). Its
    # compile time falls in the warm-up and is reported as compile_time_s.
    compile: bool | None = None
    sync_batchnorm: bool = False
    # The step's tuning settings, each with a device default (contract/tuning.py resolves and checks
    # them; the resolved values are the run's tuning.* tags).
    optimizer_impl: OptimizerImpl = OptimizerImpl.auto
    channels_last: bool | None = None  # image models: input and weights channels-last
    cudnn_benchmark: bool | None = None  # torch.backends.cudnn.benchmark (CUDA only)
    loss: LossImpl = LossImpl.auto
    step_timing: StepTiming = StepTiming.auto
    # Extra steps after the measured window, run under the profiler to measure communication
    # time (jobs/comm.py); not part of any throughput figure. 0 turns the probe off.
    comm_probe_steps: int = 3
    # Extra warm-up steps allowed while step times still fall at the end of the warm-up
    # (contract.stats.still_falling); the measured window keeps its length, so up to this many more
    # steps run in total. 0 keeps the warm-up exactly warmup_steps long.
    warmup_extend_max: int = 5
    # Extra forward+backward passes per rank after the window, without gradient communication,
    # timed to name a straggler (jobs.loop.local_step_times); 0 turns them off.
    local_probe_steps: int = 3

    def validate(self) -> None:
        for name, fix in (
            ("nodes", "use nodes=1 or more."),
            ("batch_size", "set batch_size to the per-device batch, e.g. batch_size=8."),
            ("steps", "set steps above warmup_steps, e.g. steps=30."),
            ("repeats", "use repeats=1 or more."),
            ("grad_accum_steps", "use grad_accum_steps=1 (no accumulation) or more."),
            ("lr", "use a positive learning rate such as lr=1e-4."),
        ):
            _positive(name, getattr(self, name), fix)
        _non_negative("warmup_steps", self.warmup_steps, "use warmup_steps=0 or more.")
        _non_negative("comm_probe_steps", self.comm_probe_steps, "use 0 (no probe) or a few steps, e.g. 3.")
        _non_negative("local_probe_steps", self.local_probe_steps, "use 0 (no probe) or a few steps, e.g. 3.")
        _non_negative("warmup_extend_max", self.warmup_extend_max,
                      "use 0 (fixed warm-up) or a cap on extra warm-up steps, e.g. 5.")
        if self.warmup_steps >= self.steps:
            raise ConfigError(
                "warmup_steps", self.warmup_steps,
                f"must be below steps={self.steps}, or nothing is measured.",
                f"lower warmup_steps or raise steps (e.g. steps={self.warmup_steps + 20}).",
            )
        measured = self.steps - self.warmup_steps
        if measured < self.repeats:
            raise ConfigError(
                "repeats", self.repeats,
                f"the {measured} measured steps cannot be split into {self.repeats} windows.",
                f"raise steps to at least {self.warmup_steps + self.repeats} or lower repeats.",
            )


@dataclass
class CheckpointSpec:
    # Save on a stop request (preemption warning USR2, requeue/cancel SIGTERM) and resume from it.
    enabled: bool = True
    # Also save every N steps (0: only on stop requests); bounds the work lost to a hard kill.
    every_steps: int = 0

    def validate(self) -> None:
        _non_negative("checkpoint.every_steps", self.every_steps, "use 0 (only on stop requests) or e.g. 50.")


@dataclass
class Layout:
    """The resources one grid point runs on, as the launcher planned them."""

    nodes: int = 1
    tasks_per_node: int = 1
    # 0: CPU ranks on gloo. N > 0: CUDA ranks on NCCL, one GPU each (jobs.dist.choose_device);
    # the worker follows this, never torch.cuda.is_available() alone.
    gpus_per_node: int = 0
    cpus_per_task: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def validate(self) -> None:
        _positive("layout.nodes", self.nodes, "use nodes=1 or more.")
        _positive("layout.tasks_per_node", self.tasks_per_node, "use one task per rank, e.g. 1.")
        _non_negative("layout.gpus_per_node", self.gpus_per_node, "use 0 for CPU ranks or the GPUs per node.")
        _positive("layout.cpus_per_task", self.cpus_per_task, "use 1 or more.")


@dataclass
class RunSpec:
    """Everything one grid point's ranks need, shipped to every rank."""

    cell: str  # human name of the grid point, e.g. "strategy=fsdp,nodes=2"
    out_dir: str  # this point's directory: metrics.jsonl, result.json, checkpoints
    strategy: StrategySpec
    precision: PrecisionSpec
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    layout: Layout
    tracking_uri: str | None = None
    run_id: str | None = None  # MLflow child run created by the launcher; rank 0 logs to it
    # Emulate `layout.nodes` nodes with local processes (the local cluster): node rank and
    # local rank are derived from the global rank as on a real cluster.
    emulate_nodes: bool = False
    # A collective that waits longer than this fails the job instead of hanging it; a rank
    # without step progress for this long ends itself (jobs/heartbeat.py).
    collective_timeout_s: float = 300.0
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    tags: dict[str, str] = field(default_factory=dict)
    # The price of the resources this cell runs on (the cluster's, filled in by the launcher):
    # per device-hour (a GPU) or, when that is not set, per node-hour. With either, the summary
    # gets cost_per_1m_samples (and cost_per_1m_tokens for token models).
    cost_per_device_hour: float | None = None
    cost_per_node_hour: float | None = None

    def validate(self) -> None:
        """The checks a spec gets where it is read (``python -m jobs``), as the launcher's config got
        them where it was written: a spec.json edited by hand or written by another tool is refused
        naming the setting, before any rank starts."""
        bad = non_finite(self)
        if bad:
            value: Any = self
            for part in bad[0].split("."):
                if isinstance(value, list):
                    value = value[int(part)]
                elif isinstance(value, dict):
                    value = value[part]
                else:
                    value = getattr(value, part)
            raise ConfigError(bad[0], value, "is NaN or infinite.", f"give {bad[0]} a finite number.")
        TrainSpec.validate(self.train)
        self.strategy.validate()
        self.precision.validate()
        self.model.validate()
        self.data.validate()
        self.checkpoint.validate()
        self.layout.validate()
        _positive("collective_timeout_s", self.collective_timeout_s, "use e.g. collective_timeout_s=300.")
        for name in ("cost_per_device_hour", "cost_per_node_hour"):
            if getattr(self, name) is not None:
                _non_negative(name, getattr(self, name), "give the price per hour, or drop it.")
