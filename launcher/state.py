"""The sweep's state on disk (sweep.json), so later commands can show, wait, cancel, resubmit
and report without the process that submitted it."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

STATE_FILE = "sweep.json"


@dataclass
class CellState:
    index: int
    name: str
    dirname: str
    overrides: List[str]
    nodes: int
    world_size: int
    strategy: str
    precision: str
    model: str
    job_id: Optional[str] = None
    run_id: Optional[str] = None
    status: str = "planned"  # planned | submitted | done | failed | cancelled
    error: Optional[str] = None
    resubmits: int = 0


@dataclass
class SweepState:
    name: str
    sweep_dir: str
    cluster: str  # local | slurm
    argv: List[str]
    tracking_uri: Optional[str] = None
    experiment_id: Optional[str] = None
    parent_run_id: Optional[str] = None
    cells: List[CellState] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.sweep_dir)

    def cell_dir(self, cell: CellState) -> Path:
        return self.path / "cells" / cell.dirname

    def save(self) -> None:
        tmp = self.path / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, self.path / STATE_FILE)  # atomic: a reader never sees half a file

    @classmethod
    def load(cls, sweep_dir: Path) -> "SweepState":
        path = Path(sweep_dir) / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"{sweep_dir} holds no {STATE_FILE}: pass the directory a sweep printed.")
        data = json.loads(path.read_text())
        data["cells"] = [CellState(**c) for c in data["cells"]]
        return cls(**data)

    def save_spec(self, cell: CellState, spec) -> None:
        d = self.cell_dir(cell)
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.pkl").write_bytes(pickle.dumps(spec))

    def load_spec(self, cell: CellState):
        return pickle.loads((self.cell_dir(cell) / "spec.pkl").read_bytes())
