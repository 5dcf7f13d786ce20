"""What one grid point runs: plain, picklable dataclasses (stdlib only).

These types are the single schema of the project. The launcher registers them in Hydra's
ConfigStore (values come from conf/*.yaml) and ships them, validated, to every rank through
submitit's pickle. Nothing here imports torch, Hydra or OmegaConf, so the worker side stays free
of config machinery and the launcher starts fast.

Every check that can be decided from the config alone lives in a ``validate()`` method and raises
:class:`ConfigError`, whose message names the setting, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The choices and the errors are their own modules (contract/choices.py, contract/errors.py) and the
# model's spec too (contract/modelspec.py); they are named here as well, so that a caller imports
# the whole schema from one place.
from contract.choices import (
    HF_INSTALL,
    HF_PACKAGE,
    HF_POSITION_KEYS,
    BatchNormUnits,
    DataKind,
    InputKind,
    LMHead,
    LossImpl,
    LrScaling,
    Optimizer,
    OptimizerImpl,
    Precision,
    PrecisionMode,
    Sharding,
    StepTiming,
    Strategy,
    WrapPolicy,
)
from contract.errors import ConfigError, non_finite, non_negative, positive
from contract.modelspec import ModelSpec
from contract.parallel import Layout

__all__ = [
    "HF_INSTALL", "HF_PACKAGE", "HF_POSITION_KEYS", "BatchNormUnits", "CheckpointSpec", "ConfigError", "DataKind",
    "DataSpec", "InputKind", "LMHead", "Layout", "LossImpl", "LrScaling", "ModelSpec", "Optimizer", "OptimizerImpl",
    "Precision", "PrecisionMode", "PrecisionPlan", "PrecisionSpec", "RunSpec", "Sharding", "StepTiming", "Strategy",
    "StrategySpec", "TrainSpec", "WrapPolicy", "non_finite", "precision_plan", "DEGREES", "REST",
]


# The degrees a strategy sets, in the order a rank's coordinates are laid out (outermost first); -1
# is "the ranks the others leave" (contract/parallel.py resolves it against the cell's ranks).
DEGREES = ("dp_replicate", "dp_shard", "tp")
REST = -1

# What each retired sharding mode is as degrees (the preset that sets them, and the degrees).
_LAYOUT_MODES = {
    Sharding.hybrid: "strategy=hsdp (strategy.dp_replicate=-1 strategy.dp_shard=<ranks per node>)",
    Sharding.none: "strategy=fsdp_noshard (strategy.dp_replicate=-1 strategy.dp_shard=1)",
}


@dataclass
class StrategySpec:
    """How a cell's ranks split the model and the data: the parallel degrees (torchtitan's
    ParallelismConfig), and the wrapper that applies the data-parallel ones with its options.

    The names ddp, fsdp, zero2, hsdp, fsdp_noshard and fsdp_offload are presets
    (launcher/conf/strategy/NAME.yaml), each setting these fields; nothing else reads a name."""

    name: Strategy = Strategy.ddp  # the wrapper: ddp (replicate only) or fsdp (FSDP2, on a device mesh)
    # The preset file that set the fields (launcher/conf/strategy/NAME.yaml; "" in code): a name for
    # people, and a promise the layout is checked against (strategy=hsdp: shard groups within a node,
    # replicated across nodes, contract/parallel.py).
    preset: str = ""
    # The degrees: replicas that all-reduce their gradients, ranks one parameter is split over
    # (FSDP's shard group), and the tensor-parallel group (ranks that read the same batch; each model
    # family declares its plan beside its shard units, and it is not yet run). -1: the ranks the
    # others leave; at most one degree is -1. Unset (None, in code only: every preset sets them), a
    # data-parallel degree is the wrapper's whole-world one (:meth:`degrees`).
    dp_replicate: int | None = None
    dp_shard: int | None = None
    tp: int = 1
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
        positive("strategy.bucket_cap_mb", self.bucket_cap_mb, "use a bucket size in MiB such as 25.")
        non_negative("strategy.prefetch", self.prefetch, "use 0 (FSDP's default), 1 or 2.")
        self._validate_degrees()
        if self.name is Strategy.ddp and self.sharding is not Sharding.full:
            raise ConfigError(
                "strategy.sharding", self.sharding.value,
                "sharding applies to FSDP only; DDP replicates everything.",
                "pick an FSDP strategy (strategy=fsdp, zero2, hsdp, fsdp_noshard) or drop the override.",
            )
        if self.sharding in _LAYOUT_MODES:
            raise ConfigError("strategy.sharding", self.sharding.value, "which ranks share a parameter is said by "
                              "the degrees strategy.dp_replicate and strategy.dp_shard, not by a sharding mode.",
                              f"use {_LAYOUT_MODES[self.sharding]}.")
        if self.name is Strategy.ddp and self.cpu_offload:
            raise ConfigError(
                "strategy.cpu_offload", True, "DDP cannot offload parameters to the CPU.",
                "use strategy=fsdp_offload (FSDP full shard with CPU offload).",
            )

    def degrees(self) -> dict[str, int]:
        """Each degree as set (-1: the ranks the others leave); an unset data-parallel degree as the
        wrapper's whole-world layout: every rank a replica under DDP, one shard group of every rank
        under FSDP (torchtitan's defaults)."""
        whole = {"dp_replicate": REST, "dp_shard": 1} if self.name is Strategy.ddp else {"dp_replicate": 1, "dp_shard": REST}
        return {d: whole[d] if getattr(self, d) is None else getattr(self, d) for d in DEGREES}

    def _validate_degrees(self) -> None:
        """The checks the degrees need no layout for; those against the cell's ranks are
        contract/parallel.py's."""
        degrees = self.degrees()
        for degree in DEGREES:
            value = degrees[degree]
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != REST):
                raise ConfigError(f"strategy.{degree}", value, "a degree is a number of ranks, or -1 for the ranks "
                                  "the other degrees leave.", f"use strategy.{degree}=1 or more, or -1.")
        rest = [d for d in DEGREES if degrees[d] == REST]
        if len(rest) > 1:
            raise ConfigError(f"strategy.{rest[1]}", REST, f"strategy.{rest[0]}=-1 already takes the ranks the "
                              "other degrees leave; only one degree can.",
                              f"set strategy.{rest[1]} to a number of ranks (1: none).")
        if self.name is Strategy.ddp and degrees["dp_shard"] != 1:
            raise ConfigError("strategy.dp_shard", degrees["dp_shard"], "DDP replicates whole parameters; splitting them "
                              "over a shard group is FSDP's.", "use strategy=fsdp (or hsdp), or strategy.dp_shard=1.")
        if self.tp != 1:
            raise ConfigError("strategy.tp", self.tp, "tensor parallelism is declared (each model family's plan, "
                              "jobs/models/units.py tp_plan) but not yet run.", "use strategy.tp=1.")

    @property
    def label(self) -> str:
        """The strategy as the report names it, read from the wrapper and the degrees."""
        degrees = self.degrees()
        if self.name is Strategy.ddp:
            base = "ddp"
        elif degrees["dp_shard"] == 1:
            base = "fsdp_noshard"  # FSDP2 replicating only
        elif degrees["dp_replicate"] != 1:
            base = "hsdp"
        else:
            base = "zero2" if self.sharding is Sharding.grad_op else "fsdp"
        return base + ("+offload" if self.cpu_offload else "") + (f"+tp{self.tp}" if self.tp != 1 else "")


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

        non_negative("data.num_workers", self.num_workers, "use 0 (load in the training process) or more.")
        positive("data.prefetch_factor", self.prefetch_factor, "use 2 (PyTorch's default).")
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
    steps: int = 25  # total optimizer steps, warm-up included
    # Excluded from every measurement; extended one step at a time while step times still fall
    # (warmup_extend_max), so a short default costs nothing where the first steps are slow.
    warmup_steps: int = 5
    repeats: int = 1  # windows of the measured steps, for the within-run spread (throughput_cv) only
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
            positive(name, getattr(self, name), fix)
        non_negative("warmup_steps", self.warmup_steps, "use warmup_steps=0 or more.")
        non_negative("comm_probe_steps", self.comm_probe_steps, "use 0 (no probe) or a few steps, e.g. 3.")
        non_negative("local_probe_steps", self.local_probe_steps, "use 0 (no probe) or a few steps, e.g. 3.")
        non_negative("warmup_extend_max", self.warmup_extend_max,
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
        non_negative("checkpoint.every_steps", self.every_steps, "use 0 (only on stop requests) or e.g. 50.")


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
        positive("collective_timeout_s", self.collective_timeout_s, "use e.g. collective_timeout_s=300.")
        for name in ("cost_per_device_hour", "cost_per_node_hour"):
            if getattr(self, name) is not None:
                non_negative(name, getattr(self, name), "give the price per hour, or drop it.")
