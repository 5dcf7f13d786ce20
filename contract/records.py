"""Every record the launcher and the ranks keep, read and written one way (docs/install.md).

* **Documents** (sweep.json, a cell's result.json, spec.json, mlflow.json), one JSON object a file:
  :func:`read_document` refuses one that is cut short or of another shape, naming it (RecordError),
  and leaves it as it is; a NaN in it is set aside (read as None) and named, the rest used.
* **Keyed records** beside the sweeps (fabrics.json, noise-floor.json, sweep-drift.json,
  forecast-errors.json), keys of one entry or a list of entries: :func:`read_keyed` sets aside and
  names each entry of another shape or with NaN and uses every other; a file cut short gives the
  entries before the cut. :func:`update_keyed` keeps what was set aside beside the record.
* **Line records** (the health ledger, a cell's metrics.jsonl): :func:`read_lines` sets aside each
  damaged line (left in the file), names its number and why, and uses every good one.

Every write is atomic (:func:`write_atomic`), every read-modify-write runs under :func:`locked` (flock
on a sibling ``.<name>.lock``, a bounded wait, then a RecordError naming the holder); :func:`new_folder`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

LOCK_WAIT_S = 30.0  # a record update takes milliseconds: a lock held this long is held by a stuck process
_POLL_S = 0.02
WARN_AT_MOST = 5  # damaged lines or entries named one by one in a warning; the rest counted
SHARED_FS = "docs/install.md (records on a shared file system)"


class RecordError(Exception):
    """A record that cannot be read or written: the message says which file, why, and the fix."""


# ---- the one lock, and the one atomic write --------------------------------------------------------

def _take(handle: Any, wait_s: float | None) -> bool:
    """flock ``handle`` exclusively, retrying until ``wait_s`` has passed (None: as long as the
    holder lives, for turns that are not record writes; 0: once). Whether it was taken."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise RecordError(f"{handle.name}: this file system takes no flock locks ({exc.strerror}): two "
                                  f"processes could write one record at once. Fix: mount it with locks (Lustre: "
                                  f"-o flock; NFS: without nolock or local_lock), or put output_root on a file system "
                                  f"that has them; {SHARED_FS}.") from None
            raise


@contextlib.contextmanager
def holding(path: Path, wait_s: float | None = LOCK_WAIT_S) -> Iterator[bool]:
    """The lock file ``path`` held while the block runs; yields whether it was taken (False only when
    ``wait_s`` passed with another holding it), whose ``host:pid`` it writes for whoever waits."""
    with open(path, "a+") as handle:
        if not _take(handle, wait_s):
            yield False
            return
        try:
            os.ftruncate(handle.fileno(), 0)
            handle.write(f"{socket.gethostname()}:{os.getpid()}\n")
            handle.flush()
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def locked(record: Path, wait_s: float = LOCK_WAIT_S) -> contextlib.AbstractContextManager[None]:
    """``record``'s lock held while the block runs, or a RecordError after ``wait_s``: ``.<name>.lock``
    beside it (never the record itself, which os.replace swaps for a file the old lock does not cover)."""
    return turn(Path(record).with_name(f".{Path(record).name}.lock"), wait_s, f"{record}: its lock")


@contextlib.contextmanager
def turn(lock: Path, wait_s: float, what: str | None = None) -> Iterator[None]:
    """The lock file ``lock`` held while the block runs, or a RecordError after ``wait_s`` naming its
    holder and ``what`` waited (default: the lock file itself)."""
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with holding(lock, wait_s) as taken:
        if not taken:
            holder = lock.read_text().strip() if lock.exists() else ""
            raise RecordError(f"{what or lock} {'(' + str(lock) + ') ' if what else ''}is held by "
                              f"{holder or 'a process'} for more than {wait_s:g} s; nothing was written. Fix: wait "
                              f"for that process to end, or end it if it hangs (a lock is freed when its process "
                              f"ends; on NFS a crashed client's lock is freed by the server's lock recovery); "
                              f"{SHARED_FS}.")
        yield


def write_atomic(path: Path, text: str, sync: bool = True) -> None:
    """Write ``text`` to ``path`` so that a reader, on this node or another, sees the old file or the
    new one, never half of one: a temporary file in the same directory (a rename is atomic only
    within one), flushed to the disk or the server (``sync``: not for a file rewritten every second
    whose loss in a crash loses nothing, a heartbeat), then ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not sync:
        return
    with contextlib.suppress(OSError):  # the rename itself on the disk; not every file system allows it
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def new_folder(parent: Path, stamp: str | None = None) -> Path:
    """A folder of its own, ``<parent>/<date>_<time>``, made here: another started in the same second
    (a scrontab entry, two sweeps, health=auto) takes ``-2``, ``-3``, ... mkdir fails where the name is
    taken, on a shared file system too, so two processes never share one."""
    stamp = stamp or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    Path(parent).mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        folder = Path(parent) / (stamp if i == 1 else f"{stamp}-{i}")
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
            return folder
    raise AssertionError("unreachable")


# ---- what is damaged -------------------------------------------------------------------------------

_warned: set[str] = set()  # a record read again in one process is not named again


def warn(message: str) -> None:
    """``message`` on stderr, once per process."""
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr, flush=True)


def nonfinite(value: Any, where: str = "") -> list[str]:
    """Where ``value`` holds NaN or infinity: dotted paths (``summary.loss``, ``[3]``)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "the value"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nonfinite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nonfinite(v, f"{where}[{i}]")]
    return []


def without_nonfinite(value: Any) -> Any:
    """``value`` with each NaN or infinity set aside: None in its place (a list keeps its length)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: without_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nonfinite(v) for v in value]
    return value


def _named(notes: list[str]) -> str:
    return "; ".join(notes[:WARN_AT_MOST]) + (f"; and {len(notes) - WARN_AT_MOST} more" if notes[WARN_AT_MOST:] else "")


def _aside_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.damaged-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


# ---- documents -------------------------------------------------------------------------------------

def read_document(path: Path, what: str, fix: str, shape: type = dict, checked: bool = False) -> Any:
    """The JSON ``shape`` in ``path``. A file that cannot be read, is empty, cut short, not text or of
    another shape raises RecordError naming it, why and ``fix``; the file is left as it is. A NaN or
    infinite number is set aside (None) and named in a warning, the rest used; unless ``checked``: the
    reader's own validation refuses it naming the setting (a spec's ``lr: NaN``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except IsADirectoryError:
        raise RecordError(f"{path} should be a file ({what}) but is a directory. Fix: {fix}") from None
    except UnicodeDecodeError:
        raise RecordError(f"{path} ({what}) is not text: the file is damaged. Fix: {fix}") from None
    except OSError as exc:
        raise RecordError(f"{path} ({what}) cannot be read: {exc.strerror or exc}. Fix: {fix}") from None
    if not text.strip():
        raise RecordError(f"{path} ({what}) is empty (a full disk, or a copy cut short?). Fix: {fix}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{path} ({what}) is not complete JSON ({exc}; a full disk, or a copy cut short?). "
                          f"Fix: {fix}") from None
    if not isinstance(data, shape):
        raise RecordError(f"{path} ({what}) holds a JSON {type(data).__name__}, not the {shape.__name__} this "
                          f"file holds: another program's file? Fix: {fix}")
    bad = [] if checked else nonfinite(data)
    if bad:
        warn(f"warning: {path} ({what}): {_named(bad)} NaN or infinite: set aside (read as none), the rest used.")
        data = without_nonfinite(data)
    return data


def maybe_document(path: Path, what: str, shape: type = dict, checked: bool = False) -> Any:
    """A document that may be missing, and that its reader can do without (a cache, a derived record,
    a rank's heartbeat): None where there is none; a damaged one named in a warning and left as it is,
    then read as none."""
    try:
        return read_document(path, what, "it is read as missing, and written again by whoever keeps it.", shape,
                             checked) \
            if Path(path).exists() else None
    except RecordError as exc:
        warn(f"warning: {exc}")
        return None


def write_document(path: Path, data: Any, indent: int | None = 1) -> None:
    """``data`` as JSON in ``path``, atomically; NaN and infinity written as null, as they are read."""
    write_atomic(Path(path), json.dumps(without_nonfinite(data), indent=indent, sort_keys=True))


# ---- keyed records ---------------------------------------------------------------------------------

Check = Callable[[Any], "str | None"]  # why an entry is not of its record's kind (None: it is)
NUMBER = (int, float)


def lacks(entry: Any, fields: dict[str, type | tuple[type, ...]]) -> str | None:
    """Why ``entry`` is not an object holding ``fields`` of their types (None: it is one); a kind's
    :data:`Check` in one line."""
    if not isinstance(entry, dict):
        return f"JSON of another shape (a {type(entry).__name__}, not an object)"
    for name, want in fields.items():
        got = entry.get(name)
        if not isinstance(got, want) or (isinstance(got, bool) and want == NUMBER):
            return f"JSON of another shape ({name} is {'missing' if name not in entry else type(got).__name__})"
    return None


def _object_until_cut(text: str) -> tuple[dict[str, Any], bool] | None:
    """A JSON object's entries read one by one: (every entry before the place it is cut or broken,
    whether it was whole); None where the text is not an object at all."""
    decoder, at, out = json.JSONDecoder(), 0, dict[str, Any]()
    try:
        at = _skip(text, 0)
        if text[at] != "{":
            return None
        at = _skip(text, at + 1)
        while text[at] != "}":
            key, at = decoder.raw_decode(text, at)
            at = _skip(text, at)
            if text[at] != ":":
                return out, False
            value, at = decoder.raw_decode(text, _skip(text, at + 1))
            out[str(key)] = value
            at = _skip(text, at)
            if text[at] == ",":
                at = _skip(text, at + 1)
        return out, not text[at + 1:].strip()
    except (IndexError, ValueError):
        return out, False


def _skip(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip())


def _split(data: dict[str, Any], check: Check | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the record without its damaged entries, why each was left out, by where it was): an entry is
    a list item of a key's entries, or a key's whole value where that is not a list."""
    def why(entry: Any) -> str | None:
        if nonfinite(entry):
            return "NaN or infinity"
        return check(entry) if check else None

    good: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, list):
            good[key] = [e for e in value if why(e) is None]
            bad.update({f"{key}[{i}]": w for i, e in enumerate(value) if (w := why(e)) is not None})
        elif (w := why(value)) is None:
            good[key] = value
        else:
            bad[key] = w
    return good, bad


def _keyed(path: Path, check: Check | None, moving: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the good entries, the damaged ones with where they were) of a keyed record; a file cut short
    read up to the cut. A damaged file is left as it is by a reader (every read uses what it holds)
    and renamed aside by an update (``moving``), which then writes the good entries anew."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        warn(f"warning: {path} cannot be read ({exc.strerror or exc}); going on without it.")
        return {}, {}
    read = _object_until_cut(text)
    if read is None:
        _set_aside(path, "not a JSON object (JSON of another shape, or not JSON)", 0, moving)
        return {}, {}
    data, whole = read
    good, why = _split(data, check)
    bad = {where: _at(data, where) for where in why}
    if not whole:
        _set_aside(path, "cut short or broken", len(data), moving)
    if why:
        warn(f"warning: {path}: {len(why)} damaged entr{'y' if len(why) == 1 else 'ies'} set aside, not used: "
             f"{_named([f'{where} ({w}: {json.dumps(bad[where], default=str)[:80]})' for where, w in why.items()])}; "
             f"every other entry is used. The next update keeps {'it' if len(why) == 1 else 'them'} in "
             f"{path.name}.damaged-<time> beside it.")
    return good, bad


def _at(data: dict[str, Any], where: str) -> Any:
    key, _, index = where.partition("[")
    return data[key][int(index[:-1])] if index and key in data and isinstance(data[key], list) else data.get(where)


def _set_aside(path: Path, why: str, kept: int, moving: bool) -> None:
    used = (f"the {kept} entries before the damage are used" if kept else
            "going on without it (recover its entries from it by hand if they matter)")
    if not moving:
        warn(f"warning: {path} is damaged ({why}): left as it is, not overwritten; {used}. The next update keeps "
             f"it aside as {path.name}.damaged-<time>.")
        return
    aside = _aside_name(path)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, aside)
        warn(f"warning: {path} was damaged ({why}): kept aside as {aside.name}, not overwritten; {used}.")


def read_keyed(path: Path, check: Check | None = None) -> dict[str, Any]:
    """A keyed record's good entries ({} where there is none); each damaged one named and set aside."""
    return _keyed(Path(path), check, moving=False)[0]


def update_keyed(path: Path, change: Callable[[dict[str, Any]], dict[str, Any]], check: Check | None = None) -> bool:
    """Read the keyed record ``path``, apply ``change`` to its good entries and write the result back,
    atomically under its lock; its damaged entries are first written beside it. False (and a warning)
    where it cannot be written: the record's old entries stay."""
    path = Path(path)
    try:
        with locked(path):
            good, bad = _keyed(path, check, moving=True)
            if bad:
                aside = _aside_name(path)
                write_atomic(aside, json.dumps(bad, indent=1))  # as they were, NaN and all, for a person
                warn(f"warning: {path}: {len(bad)} damaged entr{'y' if len(bad) == 1 else 'ies'} moved to {aside.name}.")
            write_document(path, change(good))
    except (OSError, RecordError) as exc:
        warn(f"warning: {path} not updated ({getattr(exc, 'strerror', None) or exc}); its old entries stay.")
        return False
    return True


# ---- line records ----------------------------------------------------------------------------------

@dataclass
class Lines:
    """A line record as read: its records with their line numbers, oldest first, and the lines set aside."""

    path: Path
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    unreadable: set[int] = field(default_factory=set)  # damaged lines that are not JSON: they may hold anything
    text: dict[int, str] = field(default_factory=dict)  # a damaged line's text


def read_lines(path: Path, check: Check | None = None, repair: Callable[[dict[str, Any]], list[str]] | None = None,
               live: bool = False, what: str = "record", say: bool = True) -> Lines:
    """Every line of ``path`` that is a record (a JSON object ``check`` accepts), with its number; each
    other line set aside (not read, left in the file) and (``say``) named in a warning. ``repair``
    sets aside parts of a good record (its NaN figures) and names them. ``live``: a writer appends to
    the file as it is read, so a last line without its line end is still being written, not damaged."""
    out = Lines(Path(path))
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    lines = text.splitlines()
    if live and lines and not text.endswith("\n"):
        lines.pop()
    notes = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec, why = json.loads(line), None
        except ValueError:
            rec, why = None, "cut short or not JSON"
            out.unreadable.add(number)
        if why is None:
            why = (f"JSON of another shape (a {type(rec).__name__}, not a {what})" if not isinstance(rec, dict)
                   else check(rec) if check else None)
        if why is None:
            fixed = repair(rec) if repair else []
            if fixed:
                notes.append(f"line {number}: {', '.join(fixed)} NaN or infinite: set aside, the rest of the "
                             f"{what} kept")
            out.records.append((number, rec))
            continue
        out.damaged.append((number, why))
        out.text[number] = line
        notes.append(f"line {number}: {why}: set aside (not read; left in the file for a person to repair or delete)")
    if say and notes:
        warn(f"warning: {path}: {_named(notes)}; {len(out.records)} readable {what}(s) kept.")
    return out


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one record to the line record ``path``: under its lock, the old lines and the new one
    written to a new file that replaces it (a reader sees the old file or the new, never half a line).
    A damaged line stays where it is; a last line cut short gets its line end, so the new record
    starts a line of its own."""
    path = Path(path)
    with locked(path):
        old = path.read_text() if path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        write_atomic(path, old + json.dumps(record, sort_keys=True) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a cell's ``metrics.jsonl``, which rank 0 appends to while the launcher reads it
    (none if it does not exist yet); a damaged line is named and set aside."""
    return [rec for _, rec in read_lines(Path(path), live=True, what="metrics record").records]
