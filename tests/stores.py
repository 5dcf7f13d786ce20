"""An MLflow store that exists already, for tests whose subject is not the creation of a store.

MLflow creates a SQLite store by running its schema migrations: about 1.7 s on these machines, paid
by every test whose sweep starts in an empty output_root. A site's store exists after its first
sweep; :func:`existing_store` puts such a store where the launcher looks for it: a copy of an empty
store that MLflow itself created once in this session. The launcher's own creation of a store
stays tested where a sweep starts in an empty output_root: test_local_e2e's parity test, the sweeps
of test_report, test_damaged_sweeps and test_mlflow_ui, and test_container's sweep in the image.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path


@functools.cache
def _template() -> Path:
    """An empty store, created by MLflow once per session."""
    from contract import mlflow_client

    path = Path(tempfile.mkdtemp(prefix="mlflow-template-")) / "mlflow.db"
    mlflow_client.client(f"sqlite:///{path}").search_experiments()  # creates the tables
    return path


def existing_store(output_root: Path) -> Path:
    """``output_root/mlflow.db``, the launcher's default store there: as it is when it exists, else a
    copy of the empty store."""
    store = output_root / "mlflow.db"
    if not store.exists():
        output_root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), store)
    return store
