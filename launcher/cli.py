"""How every command ends on a user's mistake or a damaged sweep directory: one paragraph (what is
wrong, where, what to do) and a nonzero exit, never a traceback.

The readers say what is wrong with a file (:class:`contract.records.RecordError`, and
:class:`launcher.state.StateError` for a sweep's own files); a path that cannot be written or read
(a full disk, ``/proc``, permissions) is an ``OSError`` whose file and reason are named here; a setting the schema refuses is a
:class:`contract.spec.ConfigError`; a command line a command refuses is :class:`Refused` (its
:class:`Parser` raises it for an unknown, mistyped or malformed flag). Anything else is a bug and
keeps its traceback.

Exit codes, every command alike: 0 done, 1 a failure (or a regression, a flagged node), 2 refused
(nothing was done), 3 undecided.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from collections.abc import Callable
from typing import NoReturn

from contract.records import RecordError
from contract.spec import ConfigError

FAILURE_EXIT = 1
USER_ERROR_EXIT = 2
UNDECIDED_EXIT = 3


class Refused(Exception):
    """Input a command refuses: the message says what, where and the fix; exit 2, nothing done."""


def guarded(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` with RecordError (StateError among them), ConfigError, Refused and OSError turned
    into one paragraph on stderr and exit code 2."""

    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except (RecordError, ConfigError, Refused) as exc:  # StateError is a RecordError
            print(f"error: {exc}", file=sys.stderr, flush=True)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}. Fix: check that this path exists and can be written "
                  f"(the sweep directory, output_root, --out), free space if the disk is full, or pick another "
                  f"path.", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT

    return run


class Parser(argparse.ArgumentParser):
    """argparse for a command, refusing as the project does: a flag is never abbreviated (``--sh``
    is not ``--show``), an unknown or mistyped one is refused naming the closest flag, and every
    mistake raises :class:`Refused` (exit 2 through :func:`guarded`) instead of argparse's exit."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def flags(self) -> list[str]:
        return sorted(s for s in self._option_string_actions if s.startswith("--"))

    def error(self, message: str) -> NoReturn:
        help_line = f"{self.prog} --help lists them"
        if message.startswith("unrecognized arguments: "):
            words = message.split(": ", 1)[1].split()
            flag = next((w for w in words if w.startswith("-")), words[0] if words else "")
            close = difflib.get_close_matches(flag.split("=", 1)[0], self.flags(), n=1, cutoff=0.5)
            fix = f"did you mean {close[0]}? ({help_line})" if close else f"use one of {', '.join(self.flags())}."
            raise Refused(f"{flag}: is not a flag of {self.prog}; nothing was done. Fix: {fix}")
        raise Refused(f"{message}; nothing was done. Fix: see {self.prog} --help.")


__all__ = ["FAILURE_EXIT", "UNDECIDED_EXIT", "USER_ERROR_EXIT", "Parser", "Refused", "guarded"]
