"""The one lookup from the cluster name kept in the sweep document to its backend."""

from __future__ import annotations

from launcher.cluster.base import Backend
from launcher.cluster.local import LocalBackend
from launcher.cluster.slurm import SlurmBackend

BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (LocalBackend, SlurmBackend)}


def backend_for(name: str) -> Backend:
    """The backend of cluster ``name`` (``SweepState.cluster``, ``cluster.name`` of the config)."""
    try:
        return BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown cluster {name!r}: known are {', '.join(sorted(BACKENDS))}") from None
