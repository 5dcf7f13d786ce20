"""A backend by its cluster's name (``SweepState.cluster``, ``cluster.name`` of the config), through
the registry (launcher/cluster/registry.py): imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.cluster import registry

if TYPE_CHECKING:  # the interface, for the checker only
    from launcher.cluster.base import Backend


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name`` (its ``backend.py``), imported now."""
    registry.check(name)  # a site's entry point that takes a built-in's name: refused, never guessed
    return registry.load(name, "backend")


def backend_for(name: str) -> Backend:
    """The backend of cluster ``name``."""
    return backend_class(name)()
