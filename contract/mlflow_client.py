"""The one way into MLflow, for the launcher and the ranks alike: environment defaults, logger
levels, a client, and MLflow's length limits as named constants.

MLflow is imported only inside :func:`client`: importing it takes about two seconds, which neither
``--help`` nor a rank that logs nothing should pay.

Every call into MLflow has a deadline (:data:`CALL_DEADLINE_S`), opening the store included: MLflow's
own client retries creating its database engine for minutes, and a locked SQLite file makes every
statement wait. A call runs in a thread of its own while the caller waits for it, so the wait can be
given up: at the deadline, and at once on Ctrl-C, SIGTERM or SIGHUP (the process's own handler still
decides what the signal means). A store that did not answer is not waited on again by this process
(:class:`StoreUnavailable` at once): the JSONL records keep everything, and ``launcher.sync`` replays
them. docs/troubleshooting.md, "The tracking store does not answer".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from contract import records

# MLflow's own limits (mlflow.utils.validation): longer values are refused, so they are cut here.
TAG_MAX_CHARS = 5000
PARAM_MAX_CHARS = 6000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


def set_defaults() -> None:
    """Environment defaults, set before MLflow is imported (users may override every one).

    No usage pings from a benchmark harness. MLflow's HTTP client retries with exponential backoff
    for minutes by default: during a tracking outage every status or sync call, and every rank's
    final log, would hang. Fail within seconds instead; the JSONL records keep everything, and
    ``launcher.sync`` replays them.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def client(uri: str):
    """An ``MlflowClient`` for ``uri``, with the defaults above and without MLflow's start-up chatter,
    every call of which is bounded (:class:`BoundedClient`). A SQLite store is opened under
    :func:`store_lock`: whoever comes first creates it."""
    set_defaults()

    def load() -> Any:
        import importlib

        from mlflow.tracking import MlflowClient

        if not uri.startswith(("http://", "https://")):
            # A database store's module (SQLAlchemy, alembic): imported here, not in the constructor
            # below, so that opening a store that answers takes a tenth of a second.
            importlib.import_module("mlflow.store.tracking.sqlalchemy_store")
        # After the import: MLflow configures its logger when imported. No table-creation chatter.
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        return MlflowClient

    # The imports (two to four seconds) wait on no store: a stop does not shorten them.
    mlflow_client_class = _wait(uri, "importing MLflow", load, (), {}, store=False)

    def open_store() -> Any:
        with store_lock(uri):
            # The constructor opens the store: on an empty SQLite file it runs MLflow's schema migrations.
            return mlflow_client_class(tracking_uri=uri)

    return BoundedClient(uri, bounded(uri, "opening the store", open_store))


# The longest one call into MLflow may take: opening a store (MLflow's own engine retries last about
# 100 s, a fresh SQLite store's migrations a few seconds), a search, a logged batch or artifact. A
# server's calls are bounded sooner by the HTTP settings above (10 s, one retry).
CALL_DEADLINE_S = 60.0
# The longest a process waits for its turn at a run (one run creator at a time: contract/cell_run.py,
# launcher/track/runs.py): the holder's few calls, each within CALL_DEADLINE_S, then an error naming it.
TURN_WAIT_S = 5 * CALL_DEADLINE_S
# Once a stop was asked (Ctrl-C, SIGTERM, SIGHUP), the longest a call may still wait on the store,
# from the call's start or the signal, whichever is later: a store that answers has its runs marked
# KILLED, one that does not holds the exit up this long, once.
AFTER_STOP_S = 1.5
_stop: dict[str, float | None] = {"at": None}  # monotonic time of the stop asked in this process
_unanswered: dict[str, str] = {}  # store -> what did not answer there: not waited on again


class StoreUnavailable(RuntimeError):
    """A call into MLflow given up: past its deadline, or to a store that did not answer an earlier call."""


def stop_requested(asked: bool = True) -> None:
    """Say that a stop was asked (the launcher's signal handlers call it; False where a new scope of
    handlers starts): calls on the store from then on wait at most :data:`AFTER_STOP_S`."""
    _stop["at"] = time.monotonic() if asked else None


def bounded(uri: str, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` on the store ``uri``, waited for until its deadline; raises
    :class:`StoreUnavailable` past it, and at once where the store did not answer before."""
    if uri in _unanswered:
        raise StoreUnavailable(f"the MLflow store {uri} is not called again: {_unanswered[uri]}")
    return _wait(uri, what, call, args, kwargs, store=True)


def _wait(uri: str, what: str, call: Callable[..., Any], args: tuple, kwargs: dict, store: bool) -> Any:
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call(*args, **kwargs)
        except BaseException as exc:  # handed to the caller as raised
            box["error"] = exc
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=run, name=f"mlflow: {what}", daemon=True).start()  # daemon: never holds up the exit
    with _signals_during_the_wait():
        while not done.wait(0.05):  # short waits: a signal's handler runs between them
            stop_at = _stop["at"]
            stopped = store and stop_at is not None
            limit_s = AFTER_STOP_S if stopped else CALL_DEADLINE_S
            if time.monotonic() - (max(started, stop_at) if stopped and stop_at else started) > limit_s:
                why = f"{what} did not answer within {limit_s:g} s" + (" of the stop" if stopped else "")
                if store:
                    _unanswered[uri] = why
                raise StoreUnavailable(f"the MLflow store {uri}: {why} (given up; the JSONL records keep "
                                       f"everything, launcher.sync replays them)")
    if "error" in box:
        raise box["error"]
    return box["value"]


@contextlib.contextmanager
def _signals_during_the_wait() -> Iterator[None]:
    """While the main thread waits for a call, a signal does what it would have done (Python's Ctrl-C
    raises KeyboardInterrupt, the launcher's handler stops the sweep, no handler ends the process with
    128 + its number) and the wait goes on at most :data:`AFTER_STOP_S` on the store."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handle(signum: int, frame: Any) -> None:
        before = previous[signum]
        if before == signal.SIG_IGN:
            return
        stop_requested()
        if callable(before):
            before(signum, frame)  # may raise (KeyboardInterrupt) or end the process itself
        else:
            raise SystemExit(128 + signum)

    for caught in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[caught] = signal.signal(caught, handle)
    try:
        yield
    finally:
        for number, before in previous.items():
            signal.signal(number, before)


class BoundedClient:
    """An ``MlflowClient`` whose every public method is called through :func:`bounded`."""

    def __init__(self, uri: str, client: Any) -> None:
        self._uri, self._client = uri, client

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if name.startswith("_") or not callable(value):
            return value
        return functools.partial(bounded, self._uri, f"MlflowClient.{name}", value)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store; None for any other URI."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


STORE_LOCK_SUFFIX = ".lock"


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a SQLite store is opened. Two processes that open a fresh store at once both run
    MLflow's schema migrations, and one fails (``table _alembic_tmp_tags already exists``): with the
    lock, the first creates the tables and the others wait, then find them. A lock file beside the
    database (``mlflow.db.lock``); none for a server or another database, which create their schema
    once themselves, nor where the directory is read-only (that store is only read)."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    with contextlib.ExitStack() as held:
        try:  # a turn around MLflow's migrations, not a record write: it waits for the first opener
            held.enter_context(records.holding(path.with_name(path.name + STORE_LOCK_SUFFIX), wait_s=None))
        except (OSError, records.RecordError):  # a read-only directory, or a file system without locks:
            pass  # open it as MLflow alone would
        yield
