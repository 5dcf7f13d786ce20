"""How every command ends on a user's mistake or a damaged sweep directory: one paragraph (what is
wrong, where, what to do) and a nonzero exit, never a traceback.

The readers say what is wrong with a file (:class:`launcher.state.StateError`, raised by
``state.read_json``); a path that cannot be written or read (a full disk, ``/proc``, permissions)
is an ``OSError`` whose file and reason are named here. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from launcher.state import StateError

USER_ERROR_EXIT = 2


def guarded(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` with StateError and OSError turned into one paragraph on stderr and exit code 2."""

    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except StateError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}. Fix: check that this path exists and can be written "
                  f"(the sweep directory, output_root, --out), free space if the disk is full, or pick another "
                  f"path.", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT

    return run


__all__ = ["USER_ERROR_EXIT", "guarded"]
