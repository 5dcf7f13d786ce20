"""The backends, one line each: a cluster's name (``cluster=NAME``, ``cluster`` in the sweep document)
-> the package of its folder beside this module (docs/backends.md). A site adds its own without
editing this file through the entry point group ``ddp_fsdp_bench.backends`` (``NAME = "package"``).

A backend's package holds ``settings.py``, whose class (a ClusterConfig of that ``name``) says what
``cluster.*`` may hold there and is read when a grid is composed, and ``backend.py``, whose class (a
Backend of that ``name``) runs the cells. Each is imported only when asked for: the report and
``decide`` never import Slurm's. This module imports nothing of the launcher, so it sits on the
plan's floor (tests/test_house.py's FLOW) and the schema can ask it which settings a backend has;
the typed lookups are launcher/plan/clusterschema.py's ``settings_class`` and
launcher/cluster/backends.py's ``backend_for``."""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points

BACKENDS: dict[str, str] = {
    "local": "launcher.cluster.local",
    "slurm": "launcher.cluster.slurm",
    "torchrun": "launcher.cluster.torchrun",
}
ENTRY_POINT_GROUP = "ddp_fsdp_bench.backends"


@cache
def known() -> dict[str, str]:
    """Every backend's name and its package: this registry's, then the installed packages'."""
    site = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**site, **BACKENDS}  # a site's entry point never replaces one of the project's backends


def unknown(name: str) -> str:
    """What to say of a cluster name no backend has."""
    return (f"unknown cluster {name!r}: known are {', '.join(sorted(known()))} (launcher/cluster/registry.py, "
            f"or a site's entry point {ENTRY_POINT_GROUP})")


def load(name: str, module: str) -> type:
    """The class in backend ``name``'s module ``module`` (settings, backend) whose ``name`` is the backend's."""
    if name not in known():
        raise ValueError(unknown(name))
    loaded = importlib.import_module(f"{known()[name]}.{module}")
    found = [v for v in vars(loaded).values() if isinstance(v, type) and v.__module__ == loaded.__name__
             and getattr(v, "name", None) == name]
    if len(found) != 1:
        raise ValueError(f"{loaded.__name__} defines {len(found)} classes named {name!r}; a backend's "
                         f"{module}.py defines exactly one (docs/backends.md)")
    return found[0]
