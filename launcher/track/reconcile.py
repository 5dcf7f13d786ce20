"""Each cell's status, from what its cluster (launcher/cluster/) last said about its job.

The backend moves every submitted cell to the state its job is in (the rules of each cluster are
in its folder); here the cells that changed are listed, and the document is saved. Their MLflow runs
are brought up to date by the finish (launcher/finish.py), inline or in the background: nothing
here calls MLflow. A planned cell whose submitting process has ended will never be submitted: it is
``cancelled`` with that reason, so no cell stays planned for good.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from launcher.cluster.backends import backend_for
from launcher.cluster.base import JobTimes, alive
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState


@dataclass
class Refreshed:
    changed: list[Cell] = field(default_factory=list)
    # The jobs' latest starts, where the cluster recorded them (the co-location check reads them).
    times: JobTimes = field(default_factory=dict)


def refresh(state: SweepState, save: bool = True) -> Refreshed:
    """Bring every cell's status up to date; save the document when one changed (``save``: or leave
    that to the caller, who saves once)."""
    state.adopt_runs()  # runs a background process has created since
    before = {cell.index: (cell.status, cell.error, cell.restarts) for cell in state.cells}
    for cell in state.cells:
        if cell.job_id is None:
            _unsubmitted(state, cell)
    out = Refreshed(times=backend_for(state.cluster).update_cells(state, [c for c in state.cells if c.job_id]))
    for cell in state.cells:
        if (cell.status, cell.error, cell.restarts) != before[cell.index]:
            out.changed.append(cell)
    if out.changed and save:
        state.save()
    return out


def submitter_gone(state: SweepState) -> bool:
    """Whether the process that last submitted cells has ended (known only on its own host)."""
    if not state.submitter:
        return True
    host, _, pid = state.submitter.rpartition(":")
    if host != socket.gethostname():
        return False  # another login node: it cannot be checked from here
    return not alive(pid)


def _unsubmitted(state: SweepState, cell: Cell) -> None:
    if cell.status is CellStatus.planned and submitter_gone(state):
        cell.status = CellStatus.cancelled
        cell.error = (f"never submitted: the process that was submitting the sweep ({state.submitter or 'unknown'}) "
                      f"ended first. Fix: python -m launcher.status {state.sweep_dir} --resubmit-failed")
