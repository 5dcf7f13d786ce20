"""A sweep logged to a real ``mlflow server``, looked at through MLflow's own UI in headless Chromium:
the experiment page must open on its runs, and the compare page of a 4-cell sweep lead with the
headline metrics.

Needs Debian's chromium (``apt-get install -y --no-install-recommends chromium``); skipped without
it, or when the MLflow server does not come up.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from bench.common import stop_group
from launcher.__main__ import main
from launcher.state import SweepState
from launcher.track.tracking import compare_url, experiment_route, ui_url
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
    stop_group(proc, ((signal.SIGTERM, 15), (signal.SIGKILL, 5)))


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


def _screenshot(url: str, shot: Path, profile: Path) -> str:
    """Headless Chromium's picture of ``url`` (kept in ``shot``) and its DOM once rendered."""
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1600,2400",
           # Virtual time runs the page's fetches and renders to completion, then the page is captured.
           "--virtual-time-budget=20000", "--dump-dom", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as img:  # not a blank page: a rendered table and plot have many distinct colours
        assert img.size == (1600, 2400)
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 100
    return done.stdout


def test_the_experiment_opens_on_its_runs_and_the_compare_page_leads_with_the_headline(mlflow_server, tmp_path):
    code = main(["-m", *FAST, "strategy=ddp,fsdp", "batch_size=4,8", f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 'sweep'}", f"tracking.uri={mlflow_server}"])
    state = SweepState.load(tmp_path / "sweep")
    assert code == 0 and len(state.cells) == 4, [(c.name, c.status, c.error) for c in state.cells]
    client = MlflowClient(tracking_uri=mlflow_server)
    # finalize() attached the report to the parent run through the server's artifact proxy.
    assert client.get_run(state.parent_run_id).info.status == "FINISHED"
    assert "report.md" in {a.path for a in client.list_artifacts(state.parent_run_id)}

    # The experiment page as the launcher's last line and the parent's description link to it: the
    # runs table (a training experiment), not the GenAI overview of traces.
    dom = _screenshot(ui_url(mlflow_server, experiment_route(state.experiment_id)), state.path / "mlflow-experiment.png",
                      tmp_path / "chromium-profile")
    assert "Detect Issues in Your Traces" not in dom
    assert ">Runs<" in dom and state.name in dom, dom[-2000:]  # the sweep's parent, its cells folded under it

    # The compare page of the four cell runs, the way the parent's description links to it.
    run_ids = [c.run_id for c in state.cells]
    dom = _screenshot(compare_url(mlflow_server, run_ids, [state.experiment_id]), state.path / "mlflow-compare.png",
                      tmp_path / "chromium-profile")
    assert "Comparing 4 Runs" in dom, dom[-2000:]
    for cell in state.cells:
        assert cell.run_id in dom and cell.name in dom
    # Its parallel-coordinates chart opens on the first metric every run logged: samples/s per
    # device, not a prediction or a share (its metrics table below is alphabetical, MLflow's choice).
    logged = client.get_run(run_ids[0]).data.metrics
    assert list(logged)[:2] == ["throughput_samples_per_s_per_device", "step_time_ms_p50"], list(logged)[:5]
    chart = dom.split("Parallel Coordinates Plot", 1)[1].split("Run details", 1)[0]
    assert "throughput_samples_per_s_per_device" in chart, chart[-3000:]
    assert not [m for m in logged if m != "throughput_samples_per_s_per_device" and f">{m}<" in chart]
