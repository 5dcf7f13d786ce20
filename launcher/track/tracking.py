"""Launcher-side MLflow: the experiment (created once, here), the sweep's parent run and one
child run per cell. Workers only log to the run id they are given, so no two processes ever
race to create an experiment or a run (mlflow#4123).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from contract import metrics, mlflow_client
from contract.mlflow_client import TAG_MAX_CHARS
from launcher.masking import mask

mlflow_client.set_defaults()  # before anything imports MLflow


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, secrets masked."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not tree and prefix:
            out[prefix[:-1]] = "{}"
        return out
    if isinstance(tree, (list, tuple)):
        out[prefix[:-1]] = mask(prefix[:-1], json.dumps([mask(prefix[:-1], x) for x in tree]))
        return out
    out[prefix[:-1]] = mask(prefix[:-1], tree)
    return out


def default_uri(output_root: Path) -> str:
    return f"sqlite:///{(output_root / 'mlflow.db').resolve()}"


def absolute_uri(uri: str) -> str:
    """A relative ``sqlite:///`` store made absolute against the directory the command runs in, once,
    at the sweep's start (sweep.json records the result): a later status or sync from another
    directory finds the same store instead of creating an empty one there. Other URIs unchanged."""
    path = sqlite_path(uri)
    return f"sqlite:///{path.resolve()}" if path is not None and not path.is_absolute() else uri


sqlite_path = mlflow_client.sqlite_path  # the one reading of a sqlite:/// URI, shared with the ranks


def artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go beside its database file. MLflow's own default is ./mlruns
    under whatever directory the launcher happened to start in. A server decides for itself."""
    path = sqlite_path(uri)
    return (path.parent / "mlartifacts").resolve().as_uri() if path is not None else None


def compare_route(run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """The MLflow UI's compare-runs page for these runs, relative to wherever the UI is served (the
    route MLflow's UI links to itself)."""
    from urllib.parse import quote

    runs, experiments = json.dumps(list(run_ids)), json.dumps(sorted(set(experiment_ids)))
    return f"#/compare-runs?runs={quote(runs)}&experiments={quote(experiments)}"


def compare_url(server_uri: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    return f"{server_uri.rstrip('/')}/{compare_route(run_ids, experiment_ids)}"


# MLflow's compare page struggles above about a hundred runs (mlflow#21841): beyond, the report is the view.
COMPARE_PAGE_MAX_RUNS = 100


def parent_links(experiment_id: str, parent_run_id: str, cell_run_ids: Sequence[str]) -> str:
    """One markdown line for the top of the parent run's description: its report, one click away,
    and the compare page of its cells' runs (links relative to the UI, so they hold behind any host)."""
    report = f"[report.md](#/experiments/{experiment_id}/runs/{parent_run_id}/artifacts?{TRAINING_WORKFLOW})"
    if not cell_run_ids:
        return f"**Report:** {report}"
    if len(cell_run_ids) > COMPARE_PAGE_MAX_RUNS:
        return (f"**Report:** {report} (with {len(cell_run_ids)} cell runs, MLflow's compare page is slow; the "
                f"report ranks them all)")
    compare = f"[compare the {len(cell_run_ids)} cell runs]({compare_route(cell_run_ids, [experiment_id])})"
    return f"**Report:** {report} · {compare}"


def close_parent(uri: str, run_id: str, report: Path, plots: Iterable[Path], status: str, end_s: float) -> None:
    """Attach the sweep's report (report.md at the top, plots under plots/ so its relative image
    links hold in the artifact view) to the parent run, and end the run where the sweep's last job
    ended (not when someone asked for the report)."""
    client = mlflow_client.client(uri)
    client.log_artifact(run_id, str(report))
    for p in plots:
        client.log_artifact(run_id, str(p), "plots")
    client.set_terminated(run_id, status, end_time=int(end_s * 1000))


def log_by_step(uri: str, run_id: str, by_step: dict[int, dict[str, float]]) -> None:
    """Registered metrics on a run, each with its step (the fabric's: the ranks of the shape it was
    probed on, so that a sweep of several shapes keeps each)."""
    from mlflow.entities import Metric

    client = mlflow_client.client(uri)
    now_ms = int(time.time() * 1000)
    for step, figures in sorted(by_step.items()):
        client.log_batch(run_id, metrics=[Metric(metrics.get(k).name, v, now_ms, step) for k, v in figures.items()])


# MLflow 3's UI opens an experiment on the page its kind asks for: the GenAI overview (traces,
# latency) or the runs table, which is where sweeps are compared. Earlier 3.x UIs read the kind from
# this experiment tag; 3.17's reads it from its workflow switch ("GenAI" / "Model training"), kept
# in the browser and GenAI by default, unless the link says which: experiment_route does.
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
EXPERIMENT_TAGS = {EXPERIMENT_KIND_TAG: TRAINING_KIND}
TRAINING_WORKFLOW = "workflowType=machine_learning"


def experiment_route(experiment_id: str) -> str:
    """The experiment's page in the MLflow UI, opening on its runs (relative to where the UI is served)."""
    return f"#/experiments/{experiment_id}?{TRAINING_WORKFLOW}"


def ui_url(tracking_uri: str, route: str) -> str:
    """Where a person opens ``route``: on the tracking server itself, or on a local ``mlflow ui``
    (its default address) for a database or file store."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/{route}"


class SweepTracker:
    def __init__(self, uri: str, experiment: str) -> None:
        self.uri = uri
        self.client = mlflow_client.client(uri)
        found = self.client.get_experiment_by_name(experiment) or self._create_experiment(experiment)
        self.experiment_id = found.experiment_id
        if found.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
            # An experiment made by an older version (or by hand): mark it too, once.
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)

    def _create_experiment(self, name: str):
        """The experiment, created here; when another sweep that started at the same moment created it
        first (its name is unique in the store: mlflow#4123), that one."""
        try:
            self.client.create_experiment(name, artifact_location=artifact_location(self.uri), tags=EXPERIMENT_TAGS)
        except Exception:
            if self.client.get_experiment_by_name(name) is None:
                raise
        return self.client.get_experiment_by_name(name)

    def parent(self, name: str, tags: dict[str, str], start_s: float) -> str:
        """The sweep's parent run, starting at the sweep's start (its cells' runs: contract/cell_run.py)."""
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"sweep": name, **tags},
                                     start_time=int(start_s * 1000))
        return run.info.run_id

    def find_parent(self, sweep_id: str) -> str | None:
        """The parent run this store already holds for the sweep (tag ``sweep_id``), if any."""
        found = self.client.search_runs([self.experiment_id], f"tags.{SWEEP_ID_TAG} = '{sweep_id}'", max_results=10,
                                        order_by=["attributes.start_time ASC"])
        parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
        return parents[0].info.run_id if parents else None

    def cell_runs(self, parent_run_id: str) -> dict[str, str]:
        """{cell name: run id} of the parent's child runs."""
        found, token = {}, None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                           max_results=1000, page_token=token)
            found.update({r.data.tags["cell"]: r.info.run_id for r in page if "cell" in r.data.tags})
            token = page.token
            if not token:
                return found


# The parent run's tag that names its sweep in any store (launcher.state.SweepState.sweep_id).
SWEEP_ID_TAG = "sweep_id"


def end_parent(uri: str, run_id: str, status: str, tags: dict[str, str]) -> None:
    """End the sweep's parent run with ``status`` (KILLED for an interrupted sweep) and ``tags``."""
    client = mlflow_client.client(uri)
    for key, value in tags.items():
        client.set_tag(run_id, key, value[:TAG_MAX_CHARS])
    client.set_terminated(run_id, status)


def tag_runs(uri: str, tags_by_run: dict[str, dict[str, str]]) -> None:
    """Set tags on several runs (values cut at MLflow's tag limit)."""
    if not tags_by_run:
        return
    client = mlflow_client.client(uri)
    for run_id, tags in tags_by_run.items():
        for key, value in tags.items():
            client.set_tag(run_id, key, value[:TAG_MAX_CHARS])


def reopen(uri: str, run_id: str) -> None:
    """A resubmitted cell logs on into its run: mark it running again, without the reason its last
    attempt was cancelled ("interrupted by SIGINT" would read as this attempt's). Its failure tags
    stay until it settles, which keeps them as ``earlier_failure`` (launcher/track/runs.py)."""
    client = mlflow_client.client(uri)
    client.update_run(run_id, status="RUNNING")
    if "cancel_reason" in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, "cancel_reason")


def check_reachable(uri: str, timeout_s: float = 5.0) -> str | None:
    """Why the sweep could not log to ``uri``, or None when it can (no MLflow import: fast)."""
    from urllib.parse import urlparse

    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        import urllib.error
        import urllib.request

        try:
            # Credentials in the URI are not part of the address (MLflow reads them from
            # MLFLOW_TRACKING_USERNAME/PASSWORD); /health needs none.
            netloc = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
            base = f"{parsed.scheme}://{netloc}{parsed.path}".rstrip("/")
            with urllib.request.urlopen(base + "/health", timeout=timeout_s) as resp:
                if resp.status == 200:
                    return None
                return f"the server answered HTTP {resp.status} on /health"
        except urllib.error.HTTPError as exc:
            return f"the server answered HTTP {exc.code} on /health"
        except (urllib.error.URLError, OSError) as exc:
            return f"no MLflow server answers there ({getattr(exc, 'reason', exc)})"
    if parsed.scheme == "sqlite":
        return _sqlite_problem(uri)
    if parsed.scheme in DATABASE_SCHEMES or parsed.scheme.split("+")[0] in DATABASE_SCHEMES:
        return _database_problem(uri, timeout_s)
    if uri.startswith(("databricks", "uc:")):
        return ("Databricks stores are not supported: their credentials cannot be checked before submission and "
                "the ranks log from the cluster's nodes")
    if parsed.scheme in ("", "file"):
        return _file_store_problem(Path(parsed.path if parsed.scheme else uri))
    return (f"MLflow cannot log to a {parsed.scheme}:// store (it logs to an MLflow server, http:// or https://, "
            f"an SQLite file, sqlite:///path/mlflow.db, or a database, {', '.join(DATABASE_SCHEMES)})")


def _sqlite_problem(uri: str) -> str | None:
    """The SQLite file can be written, or created, and so can its journal beside it: tried, not inferred
    from permissions (root passes os.access everywhere, yet nothing can be created in /proc). Nothing
    is left behind: a file made and removed beside it, an existing one opened for writing, unchanged
    (what it holds is MLflow's to judge, within its deadline). No MLflow and no SQLite call, so a store
    that another process holds locked does not hold this check up (MLflow's calls have their own
    deadline, contract/mlflow_client.py)."""
    import tempfile

    path = sqlite_path(uri)
    if path is None or not path.parent.is_dir():
        return f"the directory of the SQLite file ({path.parent if path else uri}) does not exist"
    if path.exists() and not path.is_file():
        return f"{path} is not a file"
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path.parent)  # the journal goes beside it
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        what = "written (nor its journal beside it)" if path.exists() else f"created in {path.parent}"
        return f"the SQLite file {path} cannot be {what} ({exc.strerror or exc})"
    if path.exists():
        try:
            with open(path, "r+b"):
                pass
        except OSError as exc:
            return f"the SQLite file {path} cannot be written ({exc.strerror or exc})"
    return None


# Databases MLflow's SQL store logs to (through SQLAlchemy, with the driver the scheme names), and
# the package that provides each default driver module.
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                   "pymysql": "PyMySQL", "pyodbc": "pyodbc"}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def _database_problem(uri: str, timeout_s: float) -> str | None:
    """The database's driver imports here and its host accepts connections (credentials and the
    database itself are checked when the first run is created)."""
    import socket
    from urllib.parse import urlparse

    from sqlalchemy.engine import make_url

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        package = DRIVER_PACKAGES.get((exc.name or "").split(".")[0], exc.name)
        return f"its database driver, the Python module {exc.name!r}, is not installed (pip install '{package}')"
    except Exception as exc:  # an unknown dialect: sqlalchemy says which
        return f"SQLAlchemy cannot use it ({type(exc).__name__}: {exc})"
    parsed = urlparse(uri)
    port = parsed.port or DEFAULT_PORTS.get(parsed.scheme.split("+")[0], 0)
    if parsed.hostname and port:
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        except OSError as exc:
            return f"no database answers at {parsed.hostname}:{port} ({exc})"
    return None


def _file_store_problem(root: Path) -> str | None:
    """MLflow 3 keeps its file store (a directory of runs) in maintenance mode: refused unless
    MLFLOW_ALLOW_FILE_STORE=true, as MLflow itself does."""
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        return ("MLflow 3 refuses a directory as its store (the file store is in maintenance mode) unless "
                f"MLFLOW_ALLOW_FILE_STORE=true; an SQLite file there works: sqlite:///{root.resolve() / 'mlflow.db'}")
    existing = next((p for p in (root, *root.resolve().parents) if p.exists()), Path("/"))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        return f"the directory {existing} cannot hold the store (not a writable directory)"
    return None


def code_provenance() -> dict[str, str]:
    """The project's git commit and whether the working tree had uncommitted changes."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown"}
    return {"git_commit": commit or "unknown", "git_dirty": str(bool(dirty)).lower()}


def attach_cell_artifacts(uri: str, run_id: str, cell_dir: Path, submitit_dir: Path, job_id: str | None) -> None:
    """The cell's resolved config, records, errors, rank logs and the rendered sbatch script."""
    client = mlflow_client.client(uri)
    for name in ("config.yaml", "spec.json", "metrics.jsonl", "result.json", "preempted.txt"):
        if (cell_dir / name).exists():
            client.log_artifact(run_id, str(cell_dir / name))
    for path in sorted(cell_dir.glob("error-rank*.txt")) + sorted((cell_dir / "ranks").glob("*")):
        client.log_artifact(run_id, str(path), "ranks")
    if job_id and submitit_dir.is_dir():
        array_id = job_id.split("_")[0]
        for path in sorted(set(submitit_dir.glob(f"{job_id}_*")) | set(submitit_dir.glob(f"{array_id}_submission.sh"))):
            if path.suffix in (".out", ".err", ".sh"):
                client.log_artifact(run_id, str(path), "logs")


def log_figures(uri: str, figures_by_run: dict[str, dict[str, float]]) -> None:
    """Summary figures (registered metrics computed over cells, such as the forecasts checked) on
    runs that exist, each at step 0 like the cells' own summaries."""
    client = mlflow_client.client(uri)
    for run_id, figures in figures_by_run.items():
        for name, value in figures.items():
            client.log_metric(run_id, metrics.get(name).name, float(value), step=0)


def attach(uri: str, run_id: str, files: Iterable[Path], folder: str | None = None) -> None:
    """Attach ``files`` to a run (under ``folder``)."""
    client = mlflow_client.client(uri)
    for path in files:
        client.log_artifact(run_id, str(path), folder)


def describe_parent(uri: str, run_id: str, note: str, files: Iterable[Path] = ()) -> None:
    """Set the sweep's parent run description (MLflow's ``mlflow.note.content`` tag, markdown) and
    attach ``files`` (cells.csv) at the top of its artifacts."""
    client = mlflow_client.client(uri)
    if len(note) > TAG_MAX_CHARS:
        tail = "\n\n… (cut here: the full findings are in report.md)"
        note = note[: TAG_MAX_CHARS - len(tail)] + tail
    client.set_tag(run_id, "mlflow.note.content", note)
    for path in files:
        client.log_artifact(run_id, str(path))


def tag_verdicts(uri: str, run_id: str, answers: Sequence[str]) -> None:
    """Each answer line as a tag of the parent run, ``verdict.<where>`` (``verdict.2 ranks``): a column
    the runs list can show, beside the sweep's other parent runs."""
    import re

    tags: dict[str, str] = {}
    for line in answers:
        where, _, verdict = line.partition(": ")
        key = "verdict." + re.sub(r"[^/\w.\- ]", "_", where)
        tags[key[:250]] = verdict[:TAG_MAX_CHARS]
    if tags:
        mlflow_client.client(uri).log_batch(run_id, tags=[_run_tag(k, v) for k, v in tags.items()])


def _run_tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, value)


# The tag of a run that holds a forecast, never a measurement (a cells=auto sweep's configurations
# not run, launcher/forecast/cellsearch.py): it carries no ``cell`` tag, so no report reads it as a cell.
FORECAST_TAG = "forecast"


def log_forecast_runs(uri: str, experiment_id: str, parent_run_id: str,
                      runs: Sequence[tuple[str, dict[str, str], dict[str, float], dict[str, str]]]) -> list[str]:
    """One FINISHED child run of the parent per (name, params, metrics, tags), tagged ``forecast``;
    returns their ids in order."""
    client = mlflow_client.client(uri)
    ids = []
    for name, params, figures, tags in runs:
        run = client.create_run(experiment_id, run_name=f"{name} (forecast)",
                                tags={"mlflow.parentRunId": parent_run_id, FORECAST_TAG: "true",
                                      **{k: v[:TAG_MAX_CHARS] for k, v in tags.items()}})
        for key, text in params.items():
            client.log_param(run.info.run_id, key, text)
        for key, figure in figures.items():
            client.log_metric(run.info.run_id, key, figure)
        client.set_terminated(run.info.run_id, "FINISHED")
        ids.append(run.info.run_id)
    return ids
