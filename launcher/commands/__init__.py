"""The launcher's commands: one module each on the last floor, all in the one list below (as
torchtune's ``_cli/`` keeps one subcommand class per command). Each stands on the one base
(launcher/commands/command.py): its flags read by the shared Parser, its end through the project's error
handling, its exit code one of the documented four.

``python -m launcher`` and ``python -m launcher.<name>`` keep working: each is an entry shim of one
line (launcher/__main__.py, launcher/status.py, launcher/report/__main__.py, ...) that calls
:func:`main_of`. A command's module is imported when it is called, as the backends' registry imports a
backend (launcher/cluster/registry.py): the list is read (``python -m launcher --help`` prints it)
without importing any command, and an entry shim loads its own command only. Nothing but the shims
imports this package: the library never imports a command (tests/test_house.py).
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One command: its name (its module is launcher/commands/<name>.py), what it does in one line,
    and the module ``python -m`` runs for it (its entry shim)."""

    name: str
    summary: str
    shim: str

    @property
    def module(self) -> str:
        return f"launcher.commands.{self.name}"

    @property
    def prog(self) -> str:
        return f"python -m {self.shim}"


COMMANDS = (
    Entry("run", "a grid of settings -> cells -> jobs -> MLflow -> the comparison", "launcher"),
    Entry("status", "a sweep's progress from any shell: wait, cancel, resubmit", "launcher.status"),
    Entry("sync", "log to MLflow what did not reach it, or a whole sweep to another store", "launcher.sync"),
    Entry("report", "a sweep's or an experiment's report; sweep against sweep (--compare)", "launcher.report"),
    Entry("forecast", "cells not run, forecast from a sweep that was", "launcher.forecast"),
    Entry("health", "every node probed, judged and kept in a ledger; --check one node", "launcher.health"),
    Entry("history", "an experiment's sweeps or a node ledger over time, change points", "launcher.history"),
)


def entry(name: str) -> Entry:
    """The entry of command ``name``; a name not in the list is a bug of the caller (KeyError)."""
    for e in COMMANDS:
        if e.name == name:
            return e
    raise KeyError(f"no command {name!r} in launcher/commands/__init__.py: {', '.join(e.name for e in COMMANDS)}")


def main_of(name: str) -> Callable[..., int]:
    """Command ``name``'s ``main(argv=None) -> exit code``, its module imported when it is called;
    ``argv=None`` (the process's arguments) is a process about to exit."""
    found = entry(name)

    def main(argv: list[str] | None = None) -> int:
        code = importlib.import_module(found.module).main(argv)
        if argv is None:
            # The process's own command line: it exits next. Frozen, what it holds is skipped by the
            # interpreter's shutdown collections (about 1 s once torch and MLflow are imported).
            gc.freeze()
        return code

    main.__doc__ = f"``{found.prog}``: {found.summary} ({found.module})."
    return main


def listing() -> str:
    """The commands, one line each, as ``--help`` lists them."""
    width = max(len(e.prog) for e in COMMANDS)
    return "\n".join(f"  {e.prog:<{width}}  {e.summary}" for e in COMMANDS)


__all__ = ["COMMANDS", "Entry", "entry", "listing", "main_of"]
