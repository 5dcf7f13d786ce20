"""The one base every command stands on (as torchtune's ``_cli/subcommand.py`` is for its
subcommands): a command declares its flags on the shared :class:`Parser` and does its work in
``run``; :meth:`Command.main` reads the command line, runs it through :func:`guarded`, and ends with one
of the documented exit codes.

How a command ends on a user's mistake or a damaged sweep directory: one paragraph (what is wrong,
where, what to do) and exit code 2, never a traceback. The readers say what is wrong with a file
(:class:`contract.records.RecordError`, and :class:`launcher.state.StateError` for a sweep's own
files); a path that cannot be written or read (a full disk, ``/proc``, permissions) is an ``OSError`` whose file and reason are named here; a
setting the schema refuses is a :class:`contract.spec.ConfigError`; a command line a command refuses
is :class:`Refused` (its :class:`Parser` raises it for an unknown, mistyped or malformed flag).
Anything else is a bug and keeps its traceback.

Exit codes, every command alike (contract/commandline.py): 0 done, 1 a failure (or a regression, a
flagged node), 2 refused (nothing was done), 3 undecided; 128 + the signal when one stopped it.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import ClassVar

from contract.commandline import (
    EXIT_CODES,
    FAILURE_EXIT,
    SIGNALLED_EXIT,
    UNDECIDED_EXIT,
    USER_ERROR_EXIT,
    Parser,
    Refused,
)
from contract.records import RecordError
from contract.spec import ConfigError
from launcher.commands import entry


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


class Command:
    """One command of the launcher. A subclass names itself as the one list does
    (launcher/commands/__init__.py), adds its flags in :meth:`add_arguments` and does its work in
    :meth:`run`; its module exposes ``main = TheCommand.main``."""

    name: ClassVar[str]
    # A help text of its own (the run command lists the config groups); None: argparse's, from the flags.
    help_text: ClassVar[str | None] = None
    # What a refusal of its command line says was not done, in its own words.
    nothing: ClassVar[str] = "nothing was done"

    def __init__(self) -> None:
        self.argv: list[str] = []  # the command line as given, for a command that records it

    def add_arguments(self, parser: Parser) -> None:
        """The command's flags and positional words."""

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError

    def parser(self) -> Parser:
        found = entry(self.name)
        parser = Parser(prog=found.prog, description=found.summary, add_help=False, nothing=self.nothing)
        parser.add_argument("-h", "--help", action="store_true", help="this help")
        self.add_arguments(parser)
        return parser

    def help(self) -> str:
        return self.help_text if self.help_text is not None else self.parser().format_help()

    @classmethod
    def main(cls, argv: list[str] | None = None) -> int:
        """Read ``argv`` (default: the process's), run the command, and end with its exit code."""
        return _run(cls(), list(sys.argv[1:] if argv is None else argv))


@guarded
def _run(cmd: Command, argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):  # before the words a command requires are checked
        print(cmd.help())
        return 0
    cmd.argv = argv
    code = cmd.run(cmd.parser().parse_intermixed_args(argv))
    if code not in EXIT_CODES and code <= SIGNALLED_EXIT:
        raise RuntimeError(f"{entry(cmd.name).prog} ended with exit code {code}, which no document defines "
                           f"(0 done, 1 failure, 2 refused, 3 undecided, 128 + a signal)")
    return code


__all__ = ["FAILURE_EXIT", "UNDECIDED_EXIT", "USER_ERROR_EXIT", "Command", "Parser", "Refused", "guarded"]
