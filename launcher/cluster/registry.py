"""The backends, one line each: a cluster's name (``cluster=NAME``, ``cluster`` in the sweep document)
-> the package of its folder beside this module (docs/backends.md). A site adds its own without
editing this file through the entry point group ``ddp_fsdp_bench.backends`` (``NAME = "package"``).

A backend's package holds ``settings.py``, whose class (a ClusterConfig of that ``name``) says what
``cluster.*`` may hold there and is read when a grid is composed, and ``backend.py``, whose class (a
Backend of that ``name``) runs the cells. Each is imported only when asked for: the report and
``decide`` never import Slurm's.

A site's entry point is never ignored in silence (docs/backends.md, "A site's backend"): one named like
a built-in backend is announced by every command and refuses the commands that use that name; one
whose package cannot be imported is announced, leaves the commands that do not use it alone, and
refuses those that do, naming the entry point and the import error. This module imports nothing of the launcher, so it sits on the
plan's floor (tests/test_house.py's FLOW) and the schema can ask it which settings a backend has;
the typed lookups are launcher/plan/clusterschema.py's ``settings_class`` and
launcher/cluster/backends.py's ``backend_for``."""

from __future__ import annotations

import importlib
import sys
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from contract.spec import ConfigError

BACKENDS: dict[str, str] = {
    "local": "launcher.cluster.local",
    "slurm": "launcher.cluster.slurm",
    "torchrun": "launcher.cluster.torchrun",
}
ENTRY_POINT_GROUP = "ddp_fsdp_bench.backends"


def _named(ep: EntryPoint) -> str:
    """An entry point as a person finds it: its group, line and distribution."""
    dist = getattr(ep, "dist", None)
    where = f" (distribution {dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ENTRY_POINT_GROUP}: {ep.name} = {ep.value}{where}"


def _fix(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"pip uninstall {dist.name}" if dist is not None else "uninstall the package that declares it"


@cache
def _site() -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


@cache
def known() -> dict[str, str]:
    """Every backend's name and its package: this registry's, then the installed packages'. An entry
    point named like one of the project's backends never replaces it: it is announced here, once per
    process, and the commands that use the name are refused (:func:`check`)."""
    site = {ep.name: ep.value for ep in _site()}
    for problem, fix in (collisions()[name] for name in sorted(collisions())):
        print(f"warning: {problem} Fix: {fix}", file=sys.stderr, flush=True)
    return {**site, **BACKENDS}


@cache
def collisions() -> dict[str, tuple[str, str]]:
    """The built-in names a site's entry point also takes: (what is wrong, the fix) for each."""
    return {ep.name: (f"{_named(ep)} takes the name of the built-in backend {ep.name!r} ({BACKENDS[ep.name]}); it "
                      f"is not used, and cluster={ep.name} is refused while it is installed.",
                      f"give the site's backend a name of its own in its package's entry points "
                      f"([project.entry-points.\"{ENTRY_POINT_GROUP}\"]), or {_fix(ep)}.")
            for ep in _site() if ep.name in BACKENDS}


def check(name: str, setting: str = "cluster") -> None:
    """Refuse a backend that a site's entry point makes ambiguous: the built-in one of that name would
    run where the site's was meant."""
    if name in collisions():
        problem, fix = collisions()[name]
        raise ConfigError(setting, name, f"is ambiguous here: {problem}", fix)


def unknown(name: str) -> str:
    """What to say of a cluster name no backend has."""
    return (f"unknown cluster {name!r}: known are {', '.join(sorted(known()))} (launcher/cluster/registry.py, "
            f"or a site's entry point {ENTRY_POINT_GROUP})")


def load(name: str, module: str) -> type:
    """The class in backend ``name``'s module ``module`` (settings, backend) whose ``name`` is the backend's.
    A site's backend whose package cannot be imported is refused naming its entry point and the error."""
    if name not in known():
        raise ValueError(unknown(name))
    loaded = _import(name, module)
    found = [v for v in vars(loaded).values() if isinstance(v, type) and v.__module__ == loaded.__name__
             and getattr(v, "name", None) == name]
    if len(found) != 1:
        raise ValueError(f"{loaded.__name__} defines {len(found)} classes named {name!r}; a backend's "
                         f"{module}.py defines exactly one (docs/backends.md)")
    return found[0]


def _import(name: str, module: str):
    path = f"{known()[name]}.{module}"
    if name in BACKENDS:
        return importlib.import_module(path)  # the project's own: a failure is a bug, with its traceback
    try:
        return importlib.import_module(path)
    except Exception as exc:  # a site's package, broken or half installed: any error its import raises
        (ep,) = [e for e in _site() if e.name == name]
        raise ConfigError("cluster", name, f"the site's backend cannot be imported: {_named(ep)}, module {path}: "
                          f"{type(exc).__name__}: {exc}.", f"reinstall the package that provides it, or "
                          f"{_fix(ep)} (docs/backends.md).") from None


@cache
def usable() -> tuple[str, ...]:
    """The backends whose settings can be read here: every built-in one, and each site's whose package
    imports. A broken one is announced once per process and left out: the commands that do not use it
    go on, the ones that do are refused by :func:`load`."""
    names = []
    for name in sorted(known()):
        try:
            _import(name, "settings")
        except ConfigError as exc:
            print(f"warning: {exc.problem} The commands that use cluster={name} are refused; the others go on "
                  f"without it. Fix: {exc.fix}", file=sys.stderr, flush=True)
            continue
        names.append(name)
    return tuple(names)
