"""The one record of a cell (one launch of one grid point), from planning to its last status.

Planning fills in what the cell is: its name and directory, its own resolved configuration, cluster
settings and layout. The sweep document (``launcher/state.py``) keeps the same record in
``sweep.json``, and the commands that follow the cell fill in what became of it: job, MLflow run,
status, failure, restarts. There is no second record to convert into: a later command reads back
what planning wrote.

The resolved configuration is the one field that ``sweep.json`` does not keep (each cell's
``spec.json`` and ``config.yaml`` do): it is large, and the commands that read a document back never
need it whole.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from contract.codec import TRANSIENT
from contract.spec import Layout
from launcher.plan import fit
from launcher.plan.clusterschema import ClusterConfig
from launcher.plan.schema import Config

_RUN = re.compile(r" run=\d+$")


def configuration(cell_name: str) -> str:
    """A cell's grid point: its name without ``run=N`` (the runs of one grid point share it)."""
    return _RUN.sub("", cell_name)


class CellStatus(str, enum.Enum):
    planned = "planned"  # in the document, not submitted yet
    pending = "pending"  # submitted, waiting in the queue (or requeued)
    running = "running"
    done = "done"  # the job ended and left a result
    failed = "failed"
    cancelled = "cancelled"
    lost = "lost"  # submitted, but neither the queue nor accounting knows the job any more

    @property
    def terminal(self) -> bool:
        return self in (CellStatus.done, CellStatus.failed, CellStatus.cancelled, CellStatus.lost)


# The statuses of cells that run again: with --resubmit-failed, or when the same sweep is run again.
RUN_AGAIN = (CellStatus.failed, CellStatus.cancelled, CellStatus.lost)


class NotPlannedHere(RuntimeError):
    """A cell read back from sweep.json was asked for its whole resolved configuration."""


@dataclass
class Cell:
    # What the cell is (planning).
    index: int
    name: str  # e.g. "strategy=fsdp nodes=2"
    dirname: str  # e.g. "01-strategy_fsdp-nodes_2"
    overrides: list[str]
    strategy: str
    precision: str
    model: str
    cluster: ClusterConfig  # this cell's own resolved cluster settings (the same object as config.cluster)
    layout: Layout  # nodes, tasks and cores it runs on
    run: int = 1  # which independent launch of its grid point (1..runs)
    # The placement the backend chose to spread its grid point's runs, as the settings it set
    # ("nodelist=node2" or "exclude=node1,node3" on Slurm: launcher/cluster/slurm/spread.py); None:
    # the cluster chooses, or the user's settings.
    placed: str | None = None
    predicted_state_bytes: int | None = None  # per rank, before launch (launcher/plan/fit.py)
    predicted_activation_bytes: int | None = None  # per rank, an estimate (launcher/plan/fit.py, analyse)
    # cluster.timeout_min=auto: what this cell's limit rests on (launcher/forecast/timelimit.py); None:
    # the limit the user set.
    time_asked: str | None = None
    # Bytes per optimizer step by collective kind, the strategy's theory (launcher/plan/traffic.py).
    predicted_comm_bytes: dict[str, int] = field(default_factory=dict)
    # What became of it (submission and the commands that follow it).
    job_id: str | None = None
    run_id: str | None = None
    status: CellStatus = CellStatus.planned
    error: str | None = None
    failure_class: str | None = None
    interference: str | None = None  # what else its measurement saw (launcher/cluster/colocation.py)
    time_used_s: float | None = None  # its job's wall time as its backend saw it (sacct's on Slurm)
    resubmits: int = 0
    submitted_at: float | None = None  # epoch seconds of the latest submission
    # Slurm's requeues of the current job (node failure, preemption), from its accounting records,
    # and what ended each earlier start ("NODE_FAIL on node[1-2]").
    restarts: int = 0
    history: list[str] = field(default_factory=list)
    # The whole resolved configuration, in the process that planned the cell; not in sweep.json.
    resolved: Config | None = field(default=None, repr=False, compare=False, metadata=TRANSIENT)

    @property
    def config(self) -> Config:
        """The cell's resolved configuration, as planned by this process."""
        if self.resolved is None:
            raise NotPlannedHere(f"cell {self.name} was read back from sweep.json, which keeps its cluster settings "
                                 f"and layout but not its whole configuration: read its spec.json or config.yaml")
        return self.resolved

    def fits(self, state: fit.StateBytes | None) -> bool | None:
        """Whether its predicted peak per rank fits its GPU's memory (None: not judged, fit.fits)."""
        return fit.fits(state, self.cluster.gpu_mem_gib, self.layout.gpus_per_node, self.config.strategy.cpu_offload)

    @property
    def nodes(self) -> int:
        return self.layout.nodes

    @property
    def world_size(self) -> int:
        return self.layout.world_size
