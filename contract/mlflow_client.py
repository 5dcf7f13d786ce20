"""The one way into MLflow, for the launcher and the ranks alike: environment defaults, logger
levels, a client, and MLflow's length limits as named constants.

MLflow is imported only inside :func:`client`: importing it takes about two seconds, which neither
``--help`` nor a rank that logs nothing should pay.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

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
    """An ``MlflowClient`` for ``uri``, with the defaults above and without MLflow's start-up chatter.
    A SQLite store is opened under :func:`store_lock`: whoever comes first creates it."""
    set_defaults()
    from mlflow.tracking import MlflowClient

    # After the import: MLflow configures its logger when imported. No table-creation chatter.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with store_lock(uri):
        # The constructor opens the store: on an empty SQLite file it runs MLflow's schema migrations.
        return MlflowClient(tracking_uri=uri)


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
    try:
        handle = open(path.with_name(path.name + STORE_LOCK_SUFFIX), "a")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: open it as MLflow alone would
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
