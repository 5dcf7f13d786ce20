"""The interface every backend offers: what the rest of the launcher asks of a cluster.

A backend is named in the sweep document (``SweepState.cluster``) and found with
:func:`launcher.cluster.backends.backend_for`; adding one is adding a folder beside slurm/ and
local/ whose ``backend`` module subclasses :class:`Backend` (never another backend: what the
one-machine backends share is launcher/cluster/onemachine.py's), and one line in the registry or
an entry point (docs/backends.md, which names every abstract method here: tests/test_backends.py).
No code outside a backend's folder compares backend names or rewrites a node setting
(tests/test_house.py): what differs is asked of the backend.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contract import cell_run, records
from launcher.plan.cell import Cell
from launcher.state import REPRODUCE_FILE, SweepState, this_process

if TYPE_CHECKING:
    from contract.fabric import ProbeSpec
    from contract.health import NodeProbeSpec
    from contract.spec import Layout
    from launcher.cluster.interrupt import Interrupts
    from launcher.plan.clusterschema import ClusterConfig

# {job id: (start s, end s, hosts)} of jobs whose start and end the cluster recorded.
JobTimes = dict[str, tuple[float, float, list[str]]]

CANCELLED_BY_LAUNCHER = "cancelled by launcher.status --cancel"


@dataclass(frozen=True)
class Allocation:
    """Where and when one cell's job held its hosts: the evidence of co-location."""

    cell: int
    hosts: frozenset[str]
    start_s: float  # epoch seconds
    end_s: float


@dataclass
class Resolved:
    """Settings a cell left open that its cluster decides, found by a resource check (None: the cell
    keeps its own). The check only returns them; the caller applies them (:meth:`apply`)."""

    cpus_per_task: int | None = None  # a GPU rank's share of its node's cores
    mem_gb: float | None = None  # ... and of its node's memory
    gpu_mem_gib: float | None = None  # what its GPU type holds: the fit check measures against it
    # The backend's own settings that place this run of its grid point apart from its other runs
    # (Slurm: {"nodelist": "node2"}, launcher/cluster/slurm/spread.py): set on a settings object of
    # the cell's own (the runs of a grid point share one until then), and said as its ``placed``.
    placement: dict[str, str] = field(default_factory=dict)

    def apply(self, cell: Cell) -> None:
        if self.placement:
            cell.cluster = dataclasses.replace(cell.cluster, **self.placement)  # type: ignore[arg-type]
            cell.placed = " ".join(f"{key}={value}" for key, value in self.placement.items())
        if self.cpus_per_task is not None:
            cell.layout.cpus_per_task = self.cpus_per_task
        if self.mem_gb is not None:
            cell.cluster.mem_gb = self.mem_gb
        if self.gpu_mem_gib is not None:
            cell.cluster.gpu_mem_gib = self.gpu_mem_gib


@dataclass
class ResourceCheck:
    """What a backend's resource check found, changing nothing: the settings it resolved per cell
    index, what the cluster cannot give (each with its fix), and what looks wrong but may run."""

    resolved: dict[int, Resolved] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def apply(self, cells: Sequence[Cell]) -> None:
        for cell in cells:
            if cell.index in self.resolved:
                self.resolved[cell.index].apply(cell)


@dataclass(frozen=True)
class Wording:
    """How the sweep's messages (launcher/sweep.py, launcher/commands/status.py) name a backend's things."""

    where: str  # where submitted jobs wait and run: "still running in Slurm"
    scheduler: str  # who queues, requeues and ends jobs: "requeued by Slurm"
    submitter: str  # what accepts or refuses a submission: "sbatch refused some cells"


class Backend(ABC):
    name: str
    words: Wording
    # Whether the launcher runs each cell to its end before the next starts (and so waits anyway).
    runs_cells_in_foreground: bool
    # Whether the ranks log into their MLflow run themselves (so the runs exist before submission).
    ranks_log_to_tracking: bool

    def submit(self, state: SweepState, cells: Sequence[Cell], *,
               after_each_cell: Callable[[Cell], None] | None = None,
               interrupts: Interrupts | None = None, after: Sequence[str] = ()) -> None:
        """The one submission path for every run, resume and resubmission of cells; the state is
        saved as jobs get ids. ``after_each_cell`` is called after each cell a foreground backend ran
        (tracking, progress); ``interrupts`` are the signal handlers of the caller, if it has any;
        ``after``: jobs the cells start after (the fabric probes: no cell measures one)."""
        for cell in cells:
            for stale in state.cell_dir(cell).glob("error-rank*.txt"):
                stale.unlink()  # a new attempt: the previous attempt's errors must not be read as this one's
            set_aside_finished_records(state.cell_dir(cell))
            write_reproduce(state.cell_dir(cell), self.rank_launch(cell), model_path(cell))
        state.submitter = this_process()  # while it lives, a planned cell is still to be submitted
        self._start(state, cells, after_each_cell, interrupts, after)

    @abstractmethod
    def _start(self, state: SweepState, cells: Sequence[Cell], after_each_cell: Callable[[Cell], None] | None,
               interrupts: Interrupts | None, after: Sequence[str]) -> None:
        """Hand ``cells`` to the cluster, each with its own settings, to start after the jobs ``after``."""

    @abstractmethod
    def start_probe(self, state: SweepState, cell: Cell, spec: ProbeSpec) -> tuple[str | None, str | None]:
        """Start the fabric probe (jobs/fabric.py) on ``cell``'s shape, submitted as the cell would be:
        (its job id, or None; why it did not start or failed, or None). A foreground backend returns
        once it has ended; its result is then in ``spec.out_dir``."""

    def run_health(self, folder: Path, cluster: ClusterConfig, layout: Layout, spec: NodeProbeSpec,
                   nodes: Sequence[str]) -> tuple[str | None, str | None]:
        """The node health probe (jobs/nodeprobe.py), one task per node of ``layout`` on ``nodes`` (some
        of :meth:`health_nodes`; one machine: its emulated nodes), with ``cluster``'s other settings,
        run to its end: (its job id, or None; why it failed, or None). Its result is then in
        ``spec.out_dir``. A backend that cannot run it says so here."""
        return None, f"the {self.name} backend has no node health probe"

    def health_nodes(self, cluster: ClusterConfig, whole_pool: bool = False) -> list[str]:
        """The nodes a health probe of ``cluster`` covers, those its settings keep out left out: the
        nodes it names, else (or with ``whole_pool``: a sweep's probe) its pool's nodes that take jobs."""
        return []

    @abstractmethod
    def excluding(self, cell: Cell, nodes: Collection[str]) -> None:
        """Keep ``nodes`` (judged slow: health=auto) out of ``cell``, beside those its settings keep
        out already, on a settings object of its own; a placement that holds one is dropped (and
        ``cell.placed`` with it). Only a backend rewrites its node settings. A backend whose settings
        cannot keep nodes out (``excludes_nodes`` False: health=auto is refused) changes nothing."""

    @abstractmethod
    def placing_apart(self, cell: Cell, used: Collection[str], seen: Collection[str]) -> None:
        """``cell``, a later run of a grid point copied from its latest run (runs=auto), placed away
        from the nodes its grid point's runs ran on (``used``) where the nodes known to run jobs
        (``seen``) leave enough others; the placement copied with it is cleared, the user's own kept."""

    @abstractmethod
    def nodes_fingerprint(self, cells: Sequence[Cell]) -> str:
        """What names the nodes ``cells`` would run on: a fabric kept for other nodes is measured again."""

    @abstractmethod
    def check_resources(self, cells: Sequence[Cell]) -> ResourceCheck:
        """What the cluster cannot give ``cells``, each with its fix, found before anything is created
        or submitted, and the settings it resolves for them (``cluster.gpu_mem_gib`` where the cluster
        tells it: the fit check reads it). Pure: the cells are left as they were; the caller applies."""

    @abstractmethod
    def max_array_size(self, cells: Sequence[Cell]) -> int | None:
        """The most cells one submission may hold (None: no limit)."""

    @abstractmethod
    def describe_submission(self, cells: Sequence[Cell], folder: Path, max_array_size: int | None) -> list[str]:
        """How ``cells`` would be submitted (``--plan``), as lines; nothing is submitted or written."""

    @abstractmethod
    def update_cells(self, state: SweepState, cells: Sequence[Cell]) -> JobTimes:
        """Move each submitted cell to the state its job is in now; the jobs' start, end and hosts
        where the cluster recorded them (the co-location check reads them)."""

    @abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Ask the cluster to stop these jobs (their ranks get their signal, then their grace)."""

    @abstractmethod
    def allocations(self, state: SweepState, cells: Sequence[Cell], times: JobTimes | None) -> list[Allocation]:
        """Where and when each finished cell ran; ``times`` when the caller has read them already."""

    @abstractmethod
    def job_tags(self, cell: Cell) -> dict[str, str]:
        """The MLflow tags that name a cell's job in the cluster's own tools."""

    @abstractmethod
    def noise_floor_key(self, cluster: ClusterConfig) -> str:
        """Where a measured noise floor holds for cells of ``cluster`` (launcher.report.noisefloor):
        the fabric record, the health ledger and the forecasts are kept by it too."""

    def rank_launch(self, cell: Cell) -> str:
        """How to start ``cell``'s ranks by hand, the command before its spec.json (reproduce.sh:
        :func:`write_reproduce`): ``python -m jobs`` under torchrun on one machine, the default; a
        backend whose ranks run elsewhere says how (Slurm: srun, its variables translated first)."""
        return torchrun_launch(cell.cluster, cell.world_size)

    def worker_tracking_uri(self, state: SweepState) -> str | None:
        """The MLflow store the ranks log to, None when the launcher logs for them."""
        return state.tracking_uri if self.ranks_log_to_tracking else None

    def creates_runs_in_background(self, cell_count: int) -> bool:
        """Whether the sweep's MLflow runs are created by a background process, not inline."""
        return False


def torchrun_launch(cluster: ClusterConfig, ranks: int) -> str:
    """torchrun on this machine, ``ranks`` processes of ``python -m jobs``: the command before a spec
    file (a cell's spec.json, a probe's probe-spec.json), as launcher/cluster/processes.py runs it."""
    return (f"{cluster.python_command()} -m torch.distributed.run --standalone --nnodes 1 "
            f"--nproc-per-node {ranks} -m jobs")


def set_aside_finished_records(cell_dir: Path) -> Path | None:
    """A cell run again after an attempt that measured to its end (a diverged run resubmitted, say):
    that attempt's records (metrics.jsonl) moved to ``metrics.attempt-<n>.jsonl``, so the new attempt's records
    are one run's (the record reader refuses two summaries in one file). An attempt that stopped
    before its summary (preempted, killed) keeps its records: the resume reads its logged steps."""
    path = cell_dir / cell_run.METRICS_FILE
    if not any(r.get("kind") == "summary" for r in records.read_records(path)):
        return None
    n = 1 + len(list(cell_dir.glob("metrics.attempt-*.jsonl")))
    aside = cell_dir / f"metrics.attempt-{n}.jsonl"
    os.replace(path, aside)
    return aside


def model_path(cell: Cell) -> str | None:
    """The folder a ``model._target_``'s package was imported from where it is not installed with the
    interpreter (a checkout, a PYTHONPATH entry): what a rank needs on its path, as reproduce.sh
    gives it. None for the project's models, an installed package, or a cell not planned here."""
    import importlib.util
    import sys
    import sysconfig

    if cell.resolved is None or not cell.config.model.target_path:
        return None
    top = cell.config.model.target_path.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    origin = found.origin if found and found.origin else None
    if origin is None and found is not None and found.submodule_search_locations:
        origin = next(iter(found.submodule_search_locations), None)
    if origin is None:
        return None
    folder = Path(origin).parent.parent if Path(origin).name == "__init__.py" else Path(origin).parent
    installed = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                               sysconfig.get_paths()["stdlib"], sys.prefix)}
    folder = folder.resolve()
    return None if any(folder == p or p in folder.parents for p in installed) else str(folder)


def write_reproduce(cell_dir: Path, launch: str, python_path: str | None = None) -> Path:
    """``reproduce.sh`` in the cell's directory: its ranks again by hand, from its spec.json, with no
    pickle and no sweep (``python -m jobs``); results go to ``reproduced/`` beside it (or the
    directory given), never over the sweep's, and no MLflow run is touched. A directory given that
    is a cell's own (``sh reproduce.sh .`` in it, or another cell's) is refused before any rank
    starts, exit 2, here and again by ``python -m jobs --out`` itself."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    path = cell_dir / REPRODUCE_FILE
    path.write_text("#!/bin/sh\n# This cell's ranks again, by hand: sh reproduce.sh [OUT_DIR] (default: reproduced/ "
                    "beside this file;\n# never a cell's own directory, whose result.json and metrics.jsonl are "
                    "the sweep's figures)\n"
                    f"cell={shlex.quote(str(cell_dir.resolve()))}\n"
                    'out="${1:-$cell/reproduced}"\n'
                    'if [ -e "$out/spec.json" ] || { [ -d "$out" ] && [ "$(cd "$out" && pwd -P)" = "$(cd "$cell" && '
                    'pwd -P)" ]; }; then\n'
                    '    echo "error: reproduce.sh: $out is a cell\'s own directory: its result.json and metrics.jsonl '
                    'are the sweep\'s figures, never written over. Fix: sh reproduce.sh (writes to $cell/reproduced), '
                    'or give a directory of its own. Nothing was run." >&2\n'
                    "    exit 2\nfi\n"
                    + (f"# The model's package (model._target_), imported from outside the installed packages:\n"
                       f"PYTHONPATH={shlex.quote(python_path)}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
                       if python_path else "")
                    + f'exec {launch} "$cell/spec.json" --out "$out"\n')
    path.chmod(0o755)
    return path


def alive(pid: str | None) -> bool:
    """Whether process ``pid`` of this host still lives (a zombie does not)."""
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # it exists, under another user
    except (OSError, ValueError):
        return False
    try:  # a zombie (dead, its parent gone or not reaping) still answers signal 0
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
