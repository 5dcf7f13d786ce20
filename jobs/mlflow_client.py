"""The one way into MLflow, for the launcher and the ranks alike: environment defaults, logger
levels, a client, and MLflow's length limits as named constants.

MLflow is imported only inside :func:`client`: importing it takes about two seconds, which neither
``--help`` nor a rank that logs nothing should pay.
"""

from __future__ import annotations

import logging
import os

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
    """An ``MlflowClient`` for ``uri``, with the defaults above and without MLflow's start-up chatter."""
    set_defaults()
    from mlflow.tracking import MlflowClient

    # After the import: MLflow configures its logger when imported. No table-creation chatter.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)
