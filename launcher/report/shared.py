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
* A read-only output root keeps its old record: writing is best effort (the sweep's own figures
  are in its own folder), and says so on stderr.
"""

from __future__ import annotations

import fcntl
import json
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
        return data
    _set_aside(path)
    return {}


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
            tmp = root / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(records, indent=1, sort_keys=True))
            os.replace(tmp, root / name)
    except OSError as exc:
        print(f"warning: {root / name} not updated ({exc.strerror or exc}); its old entries stay.", file=sys.stderr)
        return False
    return True
