"""The sweep document: one typed, versioned JSON file (``sweep.json``) plus a ``spec.json`` per cell.

Later commands (status, wait, cancel, resubmit, resume, report) need nothing else: every cell
carries its own resolved cluster settings and layout, so a resubmission can never fall back to
another cell's settings. No pickles: a class that moves between modules does not break an old
sweep, and a document from another version is either read or refused with what to do.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import cell_run, records
from contract.codec import from_plain, to_plain
from contract.spec import RunSpec
from launcher.cluster import registry
from launcher.plan.cell import Cell, CellStatus

STATE_FILE = "sweep.json"
SPEC_FILE = "spec.json"
# Written into each cell's directory at submission (launcher/cluster/base.py): the command that runs
# its ranks again by hand.
REPRODUCE_FILE = "reproduce.sh"
# The MLflow ids, one file each, written by whichever process creates the runs (the launcher, or
# `launcher.sync` in the background for a large sweep): no two processes ever write one file, and
# every load of the document adopts them.
RUNS_FILE = "mlflow.json"
# What the MLflow store has been told: {"runs": {run id: its cell's signature}, "closed": the outcome
# the parent run was closed with, "reported": the outcome a report written in the background shows}.
# Written only by whichever process settles the runs (launcher/finish.py, in the background for
# launcher.status), each change under a lock of its own, never by status itself.
SETTLED_FILE = "mlflow-settled.json"
# 1: sweep.json + spec.pkl + cluster.pkl (one cluster config for the whole sweep).
# 2: this document; each cell has its own cluster config and a spec.json.
VERSION = 2


class StateError(records.RecordError):
    """A sweep directory that cannot be read; the message says what to do."""


# The one cell status -> MLflow run status table, and its inverse for reports read from MLflow.
MLFLOW_STATUS = {
    CellStatus.planned: "SCHEDULED", CellStatus.pending: "SCHEDULED", CellStatus.running: "RUNNING",
    CellStatus.done: "FINISHED", CellStatus.failed: "FAILED", CellStatus.cancelled: "KILLED",
    CellStatus.lost: "FAILED",
}
FROM_MLFLOW = {"FINISHED": CellStatus.done, "FAILED": CellStatus.failed, "KILLED": CellStatus.cancelled,
               "RUNNING": CellStatus.running, "SCHEDULED": CellStatus.pending}


DOCUMENT_FIX = ("restore sweep.json from a copy of the sweep directory, or run the grid again into a new "
                "sweep_dir (each cell's directory keeps its own records).")


def read_json(path: Path, what: str, fix: str, shape: type | None = None) -> Any:
    """The JSON in ``path`` (contract/records.py, read_document); a file that cannot be read, is cut
    short, is not text or is not JSON of ``shape`` raises StateError naming the file, what it holds and
    ``fix``."""
    try:
        return records.read_document(path, what, fix, shape or object)
    except records.RecordError as exc:
        raise StateError(str(exc)) from None


def this_process() -> str:
    """``host:pid`` of this process, as :attr:`SweepState.submitter` records it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def signature(cell: Cell) -> str:
    """What a cell's MLflow run shows of it: a run whose cell's signature is the one recorded in
    SETTLED_FILE agrees with it, and is not asked again."""
    return json.dumps([cell.status.value, cell.job_id, cell.error, cell.failure_class, cell.restarts, cell.history,
                       cell.interference])


@dataclass
class Round:
    """One round of a ``runs=auto`` sweep: the runs it added and why."""

    number: int  # 1: the first runs_min runs of every configuration
    runs: int  # runs per configuration it brings the open ones to
    cells: list[int]  # the indices of the cells it added
    started_s: float  # epoch seconds
    open: list[str] = field(default_factory=list)  # the comparisons still open when it was added


@dataclass
class Design:
    """How a ``runs=auto`` sweep adds runs (launcher/decide.py): the planned looks follow from
    runs_min and runs_max (launcher/report/sequential.py); rounds are what happened."""

    runs_min: int
    runs_max: int
    budget_min: float | None  # wall time of the whole sweep, rounds included (None: no limit)
    baseline: str | None  # a sweep directory whose cells this sweep's are compared with
    started_s: float
    rounds: list[Round] = field(default_factory=list)
    stopped: str | None = None  # why no further round comes (None: decided after the running one)
    cells_max: int | None = None  # limits.cells: no round starts that would pass it (None: a sweep from before it)


@dataclass
class Pruned:
    """A configuration of a ``cells=auto`` sweep that was not run (launcher/forecast/search.py): its
    forecast and interval, and the measured configuration that beat it (None: left undecided by a budget)."""

    name: str
    model: str
    world_size: int
    nodes: int
    forecast: float | None  # samples/s
    low: float | None
    high: float | None
    beaten_by: str | None = None
    beaten_at: float | None = None  # the measured samples/s that beat it
    why: str = ""
    run_id: str | None = None  # its MLflow run, tagged forecast


@dataclass
class SearchRound:
    """One round of a ``cells=auto`` sweep: the configurations it ran, each with why."""

    number: int  # 1: the pilot
    configurations: list[str]
    why: list[str]
    started_s: float


@dataclass
class Search:
    """How a ``cells=auto`` sweep searches its grid (launcher/forecast/search.py): the grid's cells not
    run yet (their specs are written, their directories hold nothing else), its rounds, and once it
    has stopped, the configurations it did not run and why."""

    cells_max: int | None
    budget_min: float | None
    started_s: float
    grid: int  # configurations in the full grid
    waiting: list[Cell] = field(default_factory=list)
    rounds: list[SearchRound] = field(default_factory=list)
    # Each configuration run after the pilot, forecast (samples/s) before it ran: set against its
    # measurement, the errors widen the intervals of the next rounds (out of sample, as a record's).
    forecasts: dict[str, float] = field(default_factory=dict)
    pruned: list[Pruned] = field(default_factory=list)
    level: float = 0.95
    half_width: float | None = None  # the intervals' half-width (ln) when it stopped
    basis: str = ""  # what the intervals rested on, in words
    stopped: str | None = None


@dataclass
class SweepState:
    name: str
    sweep_dir: str
    cluster: str  # local | slurm: one kind per sweep
    argv: list[str]
    tracking_uri: str | None = None
    experiment: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    cells: list[Cell] = field(default_factory=list)
    # "host:pid" of the process that last submitted cells: a planned cell whose submitter is gone
    # will never be submitted (launcher/track/reconcile.py says so instead of leaving it planned).
    submitter: str | None = None
    # The cells' statuses when report.md was last written (launcher/finish.py writes it again on change).
    reported: str | None = None
    # The cells' statuses when the parent run was last closed with the report (a sweep whose store
    # missed that, or that ran with tracking=off and was synced later, is closed by the next status/sync).
    closed: str | None = None
    # What names the sweep in any MLflow store (the parent run's tag ``sweep_id``): a sweep synced
    # twice, or from two copies of its directory, finds its runs instead of making new ones.
    sweep_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The code that ran the sweep (git commit, dirty flag), recorded where it ran: a sweep synced
    # from another machine is tagged with its own code, not the syncing checkout's.
    code: dict[str, str] | None = None
    # runs=auto: the sequential design and its rounds (None: fixed runs, one look at the end).
    design: Design | None = None
    # cells=auto: the search of the grid (None: every cell runs).
    search: Search | None = None
    version: int = VERSION

    @property
    def path(self) -> Path:
        return Path(self.sweep_dir)

    def cell_dir(self, cell: Cell) -> Path:
        return self.path / "cells" / cell.dirname

    def progress(self, width: int = 30) -> str:
        """``name: [####......] 3/10 finished (3 done, 7 pending)``: the counts by status and a bar."""
        counts: dict[CellStatus, int] = {}
        for c in self.cells:
            counts[c.status] = counts.get(c.status, 0) + 1
        finished = sum(n for s, n in counts.items() if s.terminal)
        total = len(self.cells)
        filled = int(width * finished / total) if total else width
        summary = ", ".join(f"{n} {s.value}" for s, n in sorted(counts.items(), key=lambda kv: kv[0].value))
        return f"{self.name}: [{'#' * filled}{'.' * (width - filled)}] {finished}/{total} finished ({summary})"

    def ended(self) -> bool:
        """Every cell has ended and no further round comes (runs=auto: launcher/decide.py)."""
        return all(c.status.terminal for c in self.cells) and (self.design is None or bool(self.design.stopped))

    def outcome(self) -> str:
        """The cells' statuses as the report shows them (``reported`` and ``closed`` keep this value)."""
        return json.dumps([[c.status.value, c.job_id, c.interference] for c in self.cells])

    def save(self) -> None:
        records.write_atomic(self.path / STATE_FILE, json.dumps(to_plain(self), indent=1))

    @classmethod
    def load(cls, sweep_dir: Path | str) -> SweepState:
        path = Path(sweep_dir) / STATE_FILE
        if Path(sweep_dir).exists() and not Path(sweep_dir).is_dir():
            raise StateError(f"{sweep_dir} is a file, not a sweep directory. Fix: pass the directory a sweep printed "
                             f"(it holds {STATE_FILE}).")
        if not path.exists():
            raise StateError(f"{sweep_dir} holds no {STATE_FILE}: pass the directory a sweep printed.")
        data = read_json(path, "the sweep document", DOCUMENT_FIX, dict)
        version = data.get("version", 1)
        if not isinstance(version, int):
            raise StateError(f"{path} is not a sweep document (its version is {version!r}). Fix: {DOCUMENT_FIX}")
        if version < VERSION:
            raise StateError(
                f"{path} was written by an older ddp-fsdp-bench (sweep document version {version}, this one reads "
                f"{VERSION}): its cells kept their specs as pickles and shared one cluster config. Its results and "
                f"report stay readable in that directory. Fix: run the same grid again into a new sweep_dir to "
                f"resume or resubmit it with this version."
            )
        if version > VERSION:
            raise StateError(f"{path} was written by a newer ddp-fsdp-bench (version {version}; this one reads "
                             f"{VERSION}). Fix: upgrade ddp-fsdp-bench (pip install -U ddp-fsdp-bench).")
        _refuse_unknown_backends(path, data)
        try:
            state = from_plain(cls, data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise StateError(f"{path} is not a readable sweep document (a field is missing or of another type: "
                             f"{type(exc).__name__}: {exc}). Fix: {DOCUMENT_FIX}") from exc
        # Where the document is now: a sweep directory copied or moved elsewhere works in its new place.
        state.sweep_dir = str(Path(sweep_dir).resolve())
        if not state.cells or not all(isinstance(c, Cell) for c in state.cells):
            raise StateError(f"{path} is not a readable sweep document (it lists no cells). Fix: {DOCUMENT_FIX}")
        if not (state.path / "cells").is_dir():
            raise StateError(f"{state.path / 'cells'} is missing: the cells' specs, results and records are gone "
                             f"(a partial copy?). Fix: copy the whole sweep directory, or run the grid again into a "
                             f"new sweep_dir.")
        if "sweep_id" not in data:  # a document from before sweep ids: the same derived id for every copy of it
            state.sweep_id = uuid.uuid5(uuid.NAMESPACE_URL, " ".join([state.name, *state.argv])).hex
        state.adopt_runs()
        return state

    def adopt_runs(self) -> None:
        """Fill in MLflow ids that another process has created since this document was written."""
        runs = self.path / RUNS_FILE
        if not self.parent_run_id and runs.exists():
            ids = read_json(runs, "the sweep's MLflow ids", f"delete {runs}: launcher.sync creates the runs again "
                            "(or restore it from a copy).", dict)
            self.experiment_id, self.parent_run_id = ids.get("experiment_id"), ids.get("parent_run_id")
        for cell in self.cells:
            cell.run_id = cell.run_id or cell_run.run_id(self.cell_dir(cell))
        self.closed = self.settled().get("closed", self.closed)

    def settled(self) -> dict[str, Any]:
        """SETTLED_FILE's content ({} where nothing was settled yet, or the file is damaged: then
        everything is settled again, which changes nothing in runs that agree)."""
        return records.maybe_document(self.path / SETTLED_FILE, "what the MLflow store has been told") or {}

    def unsettled(self) -> list[Cell]:
        """The cells whose MLflow run does not show them yet: a run whose cell changed since it was last
        settled, or that has no run although it has ended (its run must be created)."""
        recorded = self.settled().get("runs") or {}
        return [c for c in self.cells if c.status is not CellStatus.planned and (
            recorded.get(c.run_id) != signature(c) if c.run_id else c.status.terminal)]

    def record_settled(self, cells: Sequence[Cell] = (), closed: str | None = None,
                       report_mtime_ns: int | None = None, reported: str | None = None) -> None:
        """Record that ``cells``' runs agree with them (that the parent run was closed with the outcome
        ``closed`` and the report of that mtime; that the report was written in the background for
        the outcome ``reported``): a read-modify-write of SETTLED_FILE under its own lock, atomic for
        readers."""
        with records.locked(self.path / SETTLED_FILE):
            found = self.settled()
            found.setdefault("runs", {}).update({c.run_id: signature(c) for c in cells if c.run_id})
            if closed is not None:
                found["closed"], found["report_mtime_ns"] = closed, report_mtime_ns
                self.closed = closed
            if reported is not None:
                found["reported"] = reported
            records.write_document(self.path / SETTLED_FILE, found, indent=None)

    def save_runs(self) -> None:
        records.write_document(self.path / RUNS_FILE, {"experiment_id": self.experiment_id,
                                                       "parent_run_id": self.parent_run_id}, indent=None)

    def save_spec(self, cell: Cell, spec: RunSpec) -> None:
        d = self.cell_dir(cell)
        d.mkdir(parents=True, exist_ok=True)
        records.write_atomic(d / SPEC_FILE, json.dumps(to_plain(spec), indent=1))
        self._specs()[cell.index] = spec

    def load_spec(self, cell: Cell) -> RunSpec:
        """The cell's RunSpec: the one this process wrote, or read back from its spec.json."""
        specs = self._specs()
        if cell.index not in specs:
            path = self.cell_dir(cell) / SPEC_FILE
            fix = ("restore it from a copy of the sweep directory, or run the same grid again with "
                   f"sweep_dir={self.sweep_dir}: it writes the specs of the cells not done again.")
            try:
                specs[cell.index] = from_plain(RunSpec, read_json(path, f"cell {cell.name}'s spec", fix, dict))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise StateError(f"{path} is not a readable spec ({type(exc).__name__}: {exc}). Fix: {fix}") from exc
        return specs[cell.index]

    def read_result(self, cell: Cell) -> dict:
        """The cell's result.json ({} when it has none); a damaged one is an error, never an empty result."""
        path = self.cell_dir(cell) / "result.json"
        if not path.exists():
            return {}
        return read_json(path, f"cell {cell.name}'s result", "restore it from a copy of the sweep directory; the "
                         "cell's metrics.jsonl and its MLflow run keep its steps.", dict)

    def _specs(self) -> dict[int, RunSpec]:
        # Not a dataclass field: never written to sweep.json.
        return self.__dict__.setdefault("_spec_cache", {})


def _refuse_unknown_backends(path: Path, data: dict[str, Any]) -> None:
    """A sweep whose cells ran on a backend not installed here (a site's, through its entry point) is
    refused naming it and how to install it: read without it, its cells' settings have no class."""
    cells = data.get("cells")
    named = {str(c["cluster"].get("name")) for c in cells if isinstance(c, dict) and isinstance(c.get("cluster"), dict)
             and "name" in c["cluster"]} if isinstance(cells, list) else set()
    if isinstance(data.get("cluster"), str):
        named.add(data["cluster"])
    missing = sorted(named - set(registry.known()))
    if missing:
        raise StateError(
            f"{path}: its cells ran on cluster={missing[0]}, a backend not installed here (installed: "
            f"{', '.join(sorted(registry.known()))}). Fix: install the package that provides the {missing[0]!r} "
            f"backend into this environment (pip install it: it registers the entry point "
            f"{registry.ENTRY_POINT_GROUP}: {missing[0]} = <package>, docs/backends.md), or read the sweep where it "
            f"ran. Nothing was read or written.")
