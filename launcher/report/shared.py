"""Records that several sweeps share beside the sweep directories (the output root):
``noise-floor.json``, ``fabrics.json``, ``forecast-errors.json``.

Every sweep reads them and some sweeps write them, possibly at the same time, so:

* **An update is read-modify-write under a lock** (a POSIX record lock on ``<name>.lock``, which
  holds across the nodes of a shared file system where flock may not): two sweeps finishing at once
  both keep their entries.
* **A write is atomic** (a temporary file, then ``os.replace``): a reader sees the old or the new
  file, never half of one.
* **A damaged record is kept aside, never overwritten.** A file that is not a JSON object (cut by
  a full disk, edited by hand) is renamed to ``<name>.damaged-<time>`` and named in a warning on
  stderr; the sweep goes on as if there were no record, and the next write starts a new one. The
  other clusters' entries are in the renamed file, for a person to recover.
* **A damaged entry is set aside, never the record.** An entry holding NaN or infinity (a list item
  of a cluster's entries, or one keyed record such as a shape's fabric) is left out of what is read,
  named in a warning, and the good entries are used; the next update moves it to
  ``<name>.damaged-<time>`` beside the record, so it is kept for a person, never silently dropped.
* A read-only output root keeps its old record: writing is best effort (the sweep's own figures
  are in its own folder), and says so on stderr.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any


def read(root: Path | str, name: str) -> dict[str, Any]:
    """The record ``root/name`` as a dict; {} when there is none. A damaged one is set aside (renamed,
    named in a warning) and read as none."""
    path = Path(root) / name
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        print(f"warning: {path} cannot be read ({exc.strerror or exc}); going on without it.", file=sys.stderr)
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        good, bad = _split(data)
        if bad:
            _warn_entries(path, bad)
        return good
    _set_aside(path)
    return {}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _split(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record without its damaged entries, those entries by where they were): an entry is a
    list item of a key's entries, or a key's whole record where it is one object."""
    good: dict[str, Any] = {}
    bad: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, list):
            good[key] = [e for e in value if _finite(e)]
            bad.update({f"{key}[{i}]": e for i, e in enumerate(value) if not _finite(e)})
        elif _finite(value):
            good[key] = value
        else:
            bad[key] = value
    return good, bad


_warned: set[str] = set()  # what was said already: a record read again in one process is not said again


def warn_once(message: str) -> None:
    """``message`` on stderr, once per process (a record's readers read it several times)."""
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr)


def _warn_entries(path: Path, bad: dict[str, Any]) -> None:
    names = ", ".join(list(bad)[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    warn_once(f"warning: {path}: {len(bad)} damaged entr{'y' if len(bad) == 1 else 'ies'} (NaN or infinity) set aside, "
              f"not used: {names}; every other entry is used. The next update keeps {'it' if len(bad) == 1 else 'them'} "
              f"in {path.name}.damaged-<time> beside it, for a person to look at.")


def _set_aside(path: Path) -> None:
    aside = path.with_name(f"{path.name}.damaged-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return  # another process set it aside first
    except OSError as exc:
        print(f"warning: {path} is damaged (not a JSON object) and cannot be set aside ({exc.strerror or exc}); "
              f"it is left as it is and not used.", file=sys.stderr)
        return
    print(f"warning: {path} was damaged (not a JSON object): kept aside as {aside.name}, not overwritten; "
          f"going on without it (recover the entries from it by hand if they matter).", file=sys.stderr)


def _keep_damaged_entries(path: Path) -> None:
    """Before a record is written without its damaged entries: those entries, kept beside it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    bad = _split(data)[1] if isinstance(data, dict) else {}
    if bad:
        aside = path.with_name(f"{path.name}.damaged-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        aside.write_text(json.dumps(bad, indent=1))
        print(f"warning: {path}: {len(bad)} damaged entr{'y' if len(bad) == 1 else 'ies'} moved to {aside.name}.",
              file=sys.stderr)


@contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    with open(root / f".{name}.lock", "a") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)


def update(root: Path | str, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """Read ``root/name``, apply ``change`` and write the result back, atomically and under the
    record's lock. False (and a warning) where the root cannot be written."""
    root = Path(root)
    try:
        with _locked(root, name):
            records = change(read(root, name))
            _keep_damaged_entries(root / name)
            tmp = root / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(records, indent=1, sort_keys=True))
            os.replace(tmp, root / name)
    except OSError as exc:
        print(f"warning: {root / name} not updated ({exc.strerror or exc}); its old entries stay.", file=sys.stderr)
        return False
    return True
