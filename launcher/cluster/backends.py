"""The one lookup from the cluster name kept in the sweep document to its backend: one line per
backend, each a folder beside this module (docs/backends.md), imported only when asked for (the
report and ``decide`` never import Slurm's). A site adds its own backend without editing this file
through the entry point group ``ddp_fsdp_bench.backends`` (name = "package.module:Class")."""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the interface for the checker only: the registry itself loads nothing until asked
    from launcher.cluster.base import Backend

BACKENDS: dict[str, str] = {
    "local": "launcher.cluster.local.backend:LocalBackend",
    "slurm": "launcher.cluster.slurm.backend:SlurmBackend",
    "torchrun": "launcher.cluster.torchrun.backend:TorchrunBackend",
}
ENTRY_POINT_GROUP = "ddp_fsdp_bench.backends"


@cache
def known() -> dict[str, str]:
    """Every backend's name and where its class lives: this registry's, then the installed packages'."""
    site = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**site, **BACKENDS}  # a site's entry point never replaces one of the project's backends


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name``, imported now."""
    try:
        module, _, attr = known()[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown cluster {name!r}: known are {', '.join(sorted(known()))}") from None
    return getattr(importlib.import_module(module), attr)


def backend_for(name: str) -> Backend:
    """The backend of cluster ``name`` (``SweepState.cluster``, ``cluster.name`` of the config)."""
    return backend_class(name)()
