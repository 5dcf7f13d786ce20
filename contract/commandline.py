"""How every command line of the project is read and refused: the launcher's commands
(launcher/commands/) and the worker's ``python -m jobs`` alike, so a flag is refused the same way on
both sides.

:class:`Parser` is argparse that never abbreviates (``--sh`` is not ``--show``), refuses an unknown
or mistyped flag naming the closest one, and raises :class:`Refused` instead of argparse's own exit,
so that the command ends through its error handling with exit code 2 and one paragraph: what, where,
the fix.

Exit codes, every command alike (docs/troubleshooting.md): 0 done, 1 a failure (or a regression, a
flagged node), 2 refused (nothing was done), 3 undecided; a command stopped by a signal ends with 128
plus the signal, as a shell expects.
"""

from __future__ import annotations

import argparse
import difflib
from typing import NoReturn

DONE_EXIT = 0
FAILURE_EXIT = 1
USER_ERROR_EXIT = 2
UNDECIDED_EXIT = 3
EXIT_CODES = (DONE_EXIT, FAILURE_EXIT, USER_ERROR_EXIT, UNDECIDED_EXIT)
SIGNALLED_EXIT = 128  # 128 + the signal: Ctrl-C is 130, SIGTERM 143


class Refused(Exception):
    """Input a command refuses: the message says what, where and the fix; exit 2, nothing done."""


class Parser(argparse.ArgumentParser):
    """argparse for a command, refusing as the project does: a flag is never abbreviated (``--sh``
    is not ``--show``), an unknown or mistyped one is refused naming the closest flag, and every
    mistake raises :class:`Refused` (exit 2) instead of argparse's exit."""

    def __init__(self, *args, nothing: str = "nothing was done", **kwargs) -> None:
        """``nothing``: what a refusal says was not done, in the command's own words ("nothing was
        submitted")."""
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.nothing = nothing

    def flags(self) -> list[str]:
        return sorted(s for s in self._option_string_actions if s.startswith("--"))

    def error(self, message: str) -> NoReturn:
        help_line = f"{self.prog} --help lists them"
        if message.startswith("unrecognized arguments: "):
            words = message.split(": ", 1)[1].split()
            flag = next((w for w in words if w.startswith("-")), None)
            if flag is None:  # a word more than the command takes, not a flag
                raise Refused(f"{' '.join(words)}: more than {self.prog} takes; {self.nothing}. Fix: see "
                              f"{self.prog} --help.")
            close = difflib.get_close_matches(flag.split("=", 1)[0], self.flags(), n=1, cutoff=0.5)
            fix = f"did you mean {close[0]}? ({help_line})" if close else f"use one of {', '.join(self.flags())}."
            raise Refused(f"{flag}: is not a flag of {self.prog}; {self.nothing}. Fix: {fix}")
        raise Refused(f"{message}; {self.nothing}. Fix: see {self.prog} --help.")


__all__ = ["DONE_EXIT", "EXIT_CODES", "FAILURE_EXIT", "SIGNALLED_EXIT", "UNDECIDED_EXIT", "USER_ERROR_EXIT", "Parser",
           "Refused"]
