"""A sweep logged to a real ``mlflow server``, looked at through MLflow's own UI in headless Chromium:
the compare-runs page for the sweep's cell runs must render the runs and their metrics.

Needs Debian's chromium (``apt-get install -y --no-install-recommends chromium``); skipped without
it, or when the MLflow server does not come up.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from launcher.__main__ import main
from launcher.state import SweepState
from tests.conftest import FAST

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
# FACTS: ~9 s to /health on 2 idle cores; much longer while other work competes for them.
SERVER_START_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    # The server forks a uvicorn worker: stop the whole process group it leads, then reap it.
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def mlflow_server(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}: apt-get install -y --no-install-recommends chromium")
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # One worker and no job runners: 2 processes instead of 15, /health in seconds (FACTS).
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = (tmp_path / "mlflow-server.log").open("w")
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--artifacts-destination", str(tmp_path / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + SERVER_START_S
    while not _healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            # Stopping a server before /health answers can orphan its children; this is the
            # give-up path only, and the process group goes with it.
            _stop(proc)
            log.close()
            tail = (tmp_path / "mlflow-server.log").read_text()[-1500:]
            pytest.skip(f"mlflow server did not answer {url}/health within {SERVER_START_S} s "
                        f"(exit code {proc.returncode}):\n{tail}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        _stop(proc)
        log.close()


def compare_url(server_uri: str, run_ids: list[str], experiment_ids: list[str]) -> str:
    """The MLflow UI's compare-runs page for these runs (the route MLflow's UI links to)."""
    runs, experiments = json.dumps(list(run_ids)), json.dumps(sorted(set(experiment_ids)))
    return f"{server_uri.rstrip('/')}/#/compare-runs?runs={quote(runs)}&experiments={quote(experiments)}"


def test_compare_page_shows_the_sweeps_runs(mlflow_server, tmp_path):
    code = main(["-m", "strategy=ddp,fsdp", *FAST, f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}",
                 f"tracking.uri={mlflow_server}"])
    state = SweepState.load(tmp_path / "sweep")
    assert code == 0, [(c.name, c.status, c.error) for c in state.cells]
    client = MlflowClient(tracking_uri=mlflow_server)
    # finalize() attached the report to the parent run through the server's artifact proxy.
    assert client.get_run(state.parent_run_id).info.status == "FINISHED"
    assert "report.md" in {a.path for a in client.list_artifacts(state.parent_run_id)}

    run_ids = [c.run_id for c in state.cells]
    url = compare_url(mlflow_server, run_ids, [state.experiment_id])
    shot = tmp_path / "mlflow-compare.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={shot}",
           "--window-size=1600,2400",
           # Virtual time runs the page's fetches and renders to completion, then the page is captured.
           "--virtual-time-budget=20000", "--dump-dom", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    shutil.copy(shot, state.path / shot.name)  # kept beside the sweep's report.md
    dom = done.stdout

    assert "Comparing 2 Runs" in dom, dom[-2000:]
    for cell in state.cells:
        assert cell.run_id in dom and cell.name in dom
    # The metrics table renders only the rows in view; some of the runs' metric names must be there.
    logged = set(client.get_run(run_ids[0]).data.metrics)
    assert "throughput_samples_per_s" in logged
    assert len([m for m in logged if f">{m}<" in dom]) >= 3, sorted(logged)
    # Not a blank page: a rendered table and plot have many distinct colours.
    with Image.open(shot) as img:
        assert img.size == (1600, 2400)
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 100
