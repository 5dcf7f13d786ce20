"""A rank's run as typed objects: its place in the job (:class:`Rank`), what its steps run on
(:class:`Setup`), and both together once built (:class:`Run`). Every named step of jobs/worker.py
and the reduction of jobs/summary.py reads these instead of a dozen parameters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contract.parallel import ParallelDims

if TYPE_CHECKING:  # types only: importing torch here would cost every importer of jobs.rankrun
    import torch
    from torch.distributed import ProcessGroup

    from contract.spec import RunSpec
    from contract.tuning import Tuning
    from jobs.data import Batch
    from jobs.dist import DistEnv
    from jobs.heartbeat import Heartbeat
    from jobs.hooks import Observer
    from jobs.interference import Interference
    from jobs.loop import Trainer
    from jobs.parallel import Parallelized
    from jobs.sinks import NullSink


@dataclass
class Rank:
    """This rank in its job, fixed before anything is built: the cell, the layout, the device and
    where its records go (rank 0: JSONL and MLflow; the others: a NullSink)."""

    spec: RunSpec
    env: DistEnv
    device: torch.device
    backend: str  # the training backend (nccl, gloo)
    sink: NullSink
    heartbeat: Heartbeat
    observer: Observer
    control_group: ProcessGroup | None = None  # gloo: stop requests, health, the GPU placement check
    gpu_uuids: list[tuple[str, str]] = field(default_factory=list)  # (host, GPU UUID) per rank, CUDA only
    # The cell's parallel layout (contract/parallel.py), made once from its spec: the FSDP mesh, the
    # data sharding and the summary's reductions read it.
    dims: ParallelDims = field(init=False)

    def __post_init__(self) -> None:
        self.dims = ParallelDims.of(self.spec.strategy, self.spec.layout)


@dataclass
class Setup:
    """What the measured steps run on, built once per job."""

    par: Parallelized
    optimizer: torch.optim.Optimizer
    batches: Iterator[Batch]
    trainer: Trainer
    lr: float
    memory: dict[str, float]  # jobs.memory.setup_memory: what building and wrapping cost
    matmul: dict[str, Any]  # the device's measured matmul peak (jobs.matmul_peak.measure)
    tuning: Tuning | None = None  # the step's tuning settings as resolved on this rank (contract/tuning.py)


@dataclass
class Run:
    """A built run: the rank, its setup, the interference sampler and the step's sync point."""

    rank: Rank
    setup: Setup
    interference: Interference
    sync: Callable[[], None]  # CUDA: torch.cuda.synchronize, the end of every measured step
