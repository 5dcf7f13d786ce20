"""Fit before launch: each cell's model built on the meta device (no memory, no weights), and the
bytes of parameters, gradients and optimizer state its busiest rank will hold under its strategy.

The prediction follows what the worker measures (jobs.memory.model_state_bytes, max over ranks):
FSDP2 shards every parameter along dim 0 in ``torch.chunk`` pieces over the shard group, so a rank
holds ceil(dim0 / shards) rows of it, and its gradients and optimizer state follow the shard.
AdamW keeps two fp32 moments per element plus a one-element ``step``; SGD (momentum 0.9) one buffer.

Why this is exact, not an estimate (tests/test_fit.py measures it on real gloo ranks for every
project model under ddp, fsdp, zero2, fsdp_noshard and hsdp, and agrees to the byte):

- Uneven shards: rank 0 always holds the full ceil-sized chunk of every parameter, so the busiest
  rank's sum is the sum of the per-parameter ceilings (an odd vocabulary such as GPT-2's 50257 rows
  included). The measurement counts a DTensor's local tensor, which excludes the padding FSDP2
  allocates for the short last chunk; so does the prediction.
- Tied weights (GPT's embedding and head, transformers' tie_weights): ``module.parameters()``
  yields a shared parameter once, in the meta build as in the wrapped model.
- BatchNorm running statistics are buffers, not parameters: neither side counts them.
- Gradients: the worker reads them on its first step while they exist (the step loop frees them
  after every step); every parameter of the project models gets one, sharded like the parameter.
- AdamW's ``step`` is a 0-dim fp32 tensor per parameter (4 bytes, not sharded); zero2 (grad_op)
  differs from full only in resharding after forward, which nothing here holds between steps;
  fsdp_noshard is a shard group of 1; hsdp shards over a node's tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from contract.gpus import gpu_mem_gib_of as gpu_mem_gib_of  # the one GPU table; the schema reads it here
from contract.parallel import ParallelDims
from contract.spec import InputKind, Layout, ModelSpec, Optimizer, StrategySpec

GIB = 1024**3


@dataclass(frozen=True)
class StateBytes:
    """Per rank (the busiest one): what it holds between steps."""

    params: int
    grads: int
    optimizer: int
    param_count: int  # the whole model's
    # An estimate (_activations): what autograd keeps for backward at the end of the forward;
    # None where the model's forward cannot run on fake tensors.
    activations: int | None = None
    # The first moment of backward (loss_grad_bytes): the loss's gradients over the model's output,
    # made while everything saved is still alive.
    loss_grads: int = 0
    # Not state: the bytes the strategy moves per optimizer step, by collective kind
    # (launcher/plan/traffic.py), from the same meta build.
    comm_bytes_per_step: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Model state: what the worker measures as model_state_bytes."""
        return self.params + self.grads + self.optimizer

    @property
    def peak(self) -> int:
        """Model state, the activation estimate and the loss's gradients: what must fit in the GPU's memory."""
        return self.total + (self.activations or 0) + self.loss_grads


def loss_grad_bytes(model: ModelSpec, batch_size: int, loss: str = "full", low_dtype: str | None = None,
                    compiled: bool = False) -> int:
    """The loss's gradients at the start of backward. ``loss=full`` (jobs/loss.py) takes the model's
    output in fp32, and cross-entropy's backward holds two fp32 tensors of its size at once (nll_loss's
    gradient and log-softmax's) while every saved tensor still lives. Next to a 50k vocabulary this is
    gigabytes: GPT-2 small at batch 16 x 1024 tokens, 6.6 GB. The first GPU check measured 16.5 GiB
    where model state and saved tensors made 10.3 (docs/gpu/run1). ``loss=chunked`` holds one
    gradient in the logits' dtype (computed in forward) and two fp32 tensors of one chunk's size.
    ``compiled`` (train.compile, jobs/compiling.py): the whole cross-entropy inside a compiled graph,
    whose upcast inductor fuses: its gradient is one tensor in the logits' dtype (GPT-2 small at 32 x
    1024 tokens on an H200 measured 18.60 GiB where this predicts 21.6, docs/gpu/run3).
    ``model`` as the ranks build it (its vocabulary padded: contract.tuning.resolved_model)."""
    from contract.tuning import chunk_rows, padded_vocab

    vocab = padded_vocab(model.vocab_size, model.vocab_multiple or 1)
    per_sample = model.seq_len * vocab if model.input is InputKind.tokens else model.num_classes
    logit_bytes = 2 if low_dtype else 4
    if compiled and loss != "chunked":
        return logit_bytes * batch_size * per_sample
    if loss != "chunked":
        return 2 * 4 * batch_size * per_sample
    width = vocab if model.input is InputKind.tokens else model.num_classes
    return logit_bytes * batch_size * per_sample + 2 * 4 * min(chunk_rows(width), batch_size * model.seq_len) * width


def analyse(model: ModelSpec, batch_size: int, low_dtype: str | None,
            checkpointing: bool) -> tuple[list[tuple[tuple[int, ...], int]], int | None, list[bool]]:
    """(parameter shapes, activation bytes or None, whether each parameter sits in an FSDP unit)
    from one meta-device build of the model."""
    module = meta_build(model)
    in_unit = _in_units(module)
    return _shapes(module), _activations(module, model, batch_size, low_dtype, checkpointing), in_unit


def count_flops(model: ModelSpec) -> float | None:
    """Training FLOPs of one sample (jobs.models.flops_per_sample: forward and backward) from a
    meta-device build; None for a model that cannot be counted."""
    from jobs.models import flops_per_sample

    return flops_per_sample(meta_build(model), model)


def count_buffer_bytes(model: ModelSpec) -> int:
    """Bytes of the model's buffers (BatchNorm's running statistics and counters): what DDP broadcasts
    from rank 0 before a forward when strategy.broadcast_buffers is on (launcher/plan/traffic.py)."""
    return sum(b.numel() * b.element_size() for b in meta_build(model).buffers())


def meta_build(model: ModelSpec):
    import torch

    from jobs.models import build_model

    with torch.device("meta"):
        return build_model(model)


def _in_units(module) -> list[bool]:
    """Per parameter (in ``module.parameters()`` order): inside one of the FSDP units of
    jobs.models.shard_units, or the root's own (launcher/plan/traffic.py counts them apart)."""
    from jobs.models import shard_units

    inside = {id(p) for unit in shard_units(module) for p in unit.parameters()}
    return [id(p) in inside for p in module.parameters()]


def _shapes(module) -> list[tuple[tuple[int, ...], int]]:
    return [(tuple(p.shape), p.element_size()) for p in module.parameters()]


def _activations(module, model: ModelSpec, batch_size: int, low_dtype: str | None, checkpointing: bool) -> int | None:
    """An estimate of the bytes autograd keeps for backward after one forward (and loss) of
    ``batch_size`` samples: the largest moment of a step for activations.

    Counted on a forward of fake tensors (meta storage: no memory, no compute): every tensor the
    saved-tensor hook sees, once per storage, parameters and their views excluded. A low
    ``low_dtype`` runs the forward under autocast, as the worker's default precision mode does
    (CPU autocast's op lists; CUDA's differ in detail). With activation checkpointing a unit keeps only its
    input, and one unit at a time recomputes its own: the estimate is what is saved outside the
    units, plus every unit's input, plus the largest unit's own saved tensors. Temporary buffers
    (FSDP's all-gathered parameters, allocator fragmentation) come on top. None when the forward
    cannot run on fake tensors (a model that reads a tensor's values, or asks its process group).
    """
    try:
        return _saved_bytes(module, model, batch_size, low_dtype, checkpointing)
    except Exception:  # any user model: the estimate is optional, the launch is not refused for it
        return None


def _saved_bytes(module, model: ModelSpec, batch_size: int, low_dtype: str | None, checkpointing: bool) -> int:
    """Counted on ``module``, a meta build of ``model`` (its tensors are swapped for fake ones)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jobs.loss import loss_fn
    from jobs.models import shard_units

    # Fake tensors: meta storage (no memory, no compute) that still say "cpu", so kernels are chosen
    # as on a real device (fused attention, autocast's op lists), and libraries that skip
    # data-dependent checks while tracing (transformers' is_tracing) skip them here too.
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        to_fake_cpu(module)
        if model.input is InputKind.tokens:
            x = torch.zeros(batch_size, model.seq_len, dtype=torch.long)
            y = torch.zeros(batch_size, model.seq_len, dtype=torch.long)
        else:
            x = torch.zeros(batch_size, 3, model.image_size, model.image_size)
            y = torch.zeros(batch_size, dtype=torch.long)
    param_ids = {id(p) for p in module.parameters()}
    kept: dict[int, torch.Tensor] = {}  # by storage; kept alive so that no id is reused
    per_unit: dict[int, int] = {}
    unit_inputs = 0
    running: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in param_ids and id(base) not in kept:
            kept[id(base)] = base
            if running:
                per_unit[running[-1]] = per_unit.get(running[-1], 0) + base.numel() * base.element_size()
        return t

    def enter(unit, args) -> None:
        nonlocal unit_inputs
        running.append(id(unit))
        unit_inputs += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))

    def leave(*_) -> None:  # returns None: a forward hook's value would replace the unit's output
        running.pop()

    units = shard_units(module) if checkpointing else []
    handles = [h for u in units for h in (u.register_forward_pre_hook(enter), u.register_forward_hook(leave))]
    autocast = torch.autocast("cpu", dtype=getattr(torch, low_dtype or "bfloat16"), enabled=low_dtype is not None)
    with fake, autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(module(x), y)
    for h in handles:
        h.remove()
    saved = sum(t.numel() * t.element_size() for t in kept.values())
    if not units:
        return saved
    inside = sum(per_unit.values())
    return saved - inside + unit_inputs + max(per_unit.values(), default=0)


def to_fake_cpu(module) -> None:
    """Replace a meta module's parameters and buffers with fake CPU tensors of the same shapes (inside a
    FakeTensorMode); a parameter shared by several modules (tied weights) stays shared."""
    import torch

    new: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for table, as_param in ((m._parameters, True), (m._buffers, False)):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in new:
                    empty = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    new[id(t)] = torch.nn.Parameter(empty, requires_grad=t.requires_grad) if as_param else empty
                table[name] = new[id(t)]


def shard_count(strategy: StrategySpec, layout: Layout) -> int:
    """Over how many ranks each parameter is split (contract/parallel.py)."""
    return ParallelDims.of(strategy, layout).dp_shard


def _rows_on_busiest_rank(shape: tuple[int, ...], shards: int) -> int:
    """Elements of the largest dim-0 chunk (torch.chunk: ceil-sized pieces, the first ones full)."""
    if not shape:
        return 1
    rows = math.ceil(shape[0] / shards)
    return rows * math.prod(shape[1:])


def predict(shapes: list[tuple[tuple[int, ...], int]], strategy: StrategySpec, layout: Layout,
            optimizer: Optimizer) -> StateBytes:
    shards = shard_count(strategy, layout)
    params = sum(_rows_on_busiest_rank(shape, shards) * size for shape, size in shapes)
    elements = sum(_rows_on_busiest_rank(shape, shards) for shape, _ in shapes)
    if optimizer is Optimizer.adamw:
        optim = 2 * 4 * elements + 4 * len(shapes)  # exp_avg, exp_avg_sq (fp32) and a scalar step each
    else:
        optim = 4 * elements  # momentum buffer
    return StateBytes(params=params, grads=params, optimizer=optim,
                      param_count=sum(math.prod(shape) for shape, _ in shapes))


# What to do about a cell predicted not to fit its GPU: said by the refusal and by --plan's verdict.
DOES_NOT_FIT_FIX = ("shard more (strategy=fsdp, more nodes), offload (strategy=fsdp_offload), a smaller batch_size, "
                    "activation_checkpointing=true, precision=bf16, a smaller model, or allow_oom=true to run anyway.")


def fits(state: StateBytes | None, gpu_mem_gib: float | None, gpus_per_node: int, offloaded: bool) -> bool | None:
    """Whether a GPU cell's predicted peak per rank fits its GPU's memory; None where that is not
    judged (a CPU cell, an unknown GPU memory, no prediction, or offloaded state in host memory)."""
    if not gpu_mem_gib or state is None or not gpus_per_node or offloaded:
        return None
    return state.peak <= gpu_mem_gib * GIB


def human(n_bytes: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{n_bytes:.0f} B"
