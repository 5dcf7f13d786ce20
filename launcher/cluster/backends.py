"""The one lookup from the cluster name kept in the sweep document to its backend: one line per
backend, each a folder beside this module (docs/backends.md)."""

from __future__ import annotations

from launcher.cluster.base import Backend
from launcher.cluster.local.backend import LocalBackend
from launcher.cluster.slurm.backend import SlurmBackend

BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (LocalBackend, SlurmBackend)}


def backend_for(name: str) -> Backend:
    """The backend of cluster ``name`` (``SweepState.cluster``, ``cluster.name`` of the config)."""
    try:
        return BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown cluster {name!r}: known are {', '.join(sorted(BACKENDS))}") from None
