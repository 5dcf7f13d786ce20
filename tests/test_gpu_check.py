"""The GPU check rehearsed on CPU (scripts/gpu-check --cpu), as an offline GPU node would run it: a
Python that has torch and nothing else of the project's needs, the offline bundle installed with no
index, its parts under their budgets, killed in the middle, and its tarball synced into a fresh
MLflow store afterwards, on a machine that has MLflow."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import gpu_check

REPO = Path(__file__).resolve().parent.parent


def _torch_and_its_needs() -> set[str]:
    """torch's distribution and those it requires, recursively (no extras)."""
    seen, todo = set(), ["torch"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in md.distribution(name).requires or []
                 if "extra ==" not in r]
    return seen


def torch_only_python(where: Path) -> Path:
    """A venv whose only packages are torch and its own needs: this environment's copies, linked
    into one folder that a .pth file adds (a copy would be hundreds of MB and a pip install a minute)."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    linked = where / "torch-only"
    linked.mkdir()
    for name in _torch_and_its_needs():
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (linked / top).exists() and not top.endswith(".pth"):
                (linked / top).symlink_to(source)
    site = next(where.glob("lib/python*/site-packages"))
    (site / "torch-only.pth").write_text(f"{linked}\n")
    python = where / "bin" / "python"
    missing = subprocess.run([python, "-c", "import importlib.util as u; import torch; "
                              "print([m for m in ('hydra', 'omegaconf', 'submitit', 'numpy', 'mlflow', 'yaml') "
                              "if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert missing.stdout.strip() == "[]", missing.stdout  # torch imports; nothing else is there
    return python


def test_a_part_past_its_budget_is_stopped_and_says_so(tmp_path):
    check = gpu_check.Check(out=tmp_path, python=sys.executable, cpu=True, deadline=time.monotonic() + 60,
                            env=dict(os.environ), work=tmp_path)
    t0 = time.monotonic()
    rc, text = gpu_check.run_logged(check, [sys.executable, "-c", "import time; print('started', flush=True); "
                                            "time.sleep(60)"], "part.log", budget_s=1.5)
    assert rc is None and time.monotonic() - t0 < 15
    assert "started" in text and "stopped at its budget of 2 s" in text


@pytest.mark.slow
def test_rehearsal_offline_install_kill_in_the_middle_then_sync(tmp_path):
    python = torch_only_python(tmp_path / "node")
    bundle = tmp_path / "bundle"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["bash", "scripts/offline-bundle", str(bundle)], cwd=REPO, check=True,
                   env={**os.environ, "BUNDLE_PYTHON_VERSION": version, "PYTHON": sys.executable})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_BUNDLE": str(bundle), "GPU_CHECK_OUT": str(out)}
    env.pop("PYTHONPATH", None)
    check = subprocess.Popen(["bash", "scripts/gpu-check", "--cpu", "--only", "environment,install,reference,transformer"],
                             cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    assert check.stderr is not None
    for line in check.stderr:  # one line per part as it ends
        lines.append(line)
        if line.startswith("gpu-check: reference:"):
            time.sleep(3)  # the transformer part has started its sweep
            os.killpg(check.pid, signal.SIGKILL)
            break
    check.wait(timeout=30)
    assert any(line.startswith("gpu-check: install: pass") for line in lines), lines
    assert any(line.startswith("gpu-check: reference: pass") for line in lines), lines

    # What a killed check leaves: the table of the parts it finished, and their sweeps.
    results = (out / "BENCH_RESULTS_GPU.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in results.splitlines() if line.startswith("| ")}
    assert {"environment", "install", "reference"} <= set(rows) and "transformer" not in rows, results
    assert "no index" in rows["install"]
    assert json.loads((out / "gpu-check.json").read_text())["parts"][-1]["part"] == "reference"
    assert len([p for p in out.iterdir() if not p.name.startswith(".")]) <= 8
    extracted = tmp_path / "elsewhere"
    with tarfile.open(out / "sweeps.tar.gz") as tar:
        tar.extractall(extracted, filter="data")
    (sweep,) = extracted.iterdir()
    measured = {json.loads((c / "spec.json").read_text())["cell"]: json.loads((c / "result.json").read_text())
                for c in (sweep / "cells").iterdir()}
    assert len(measured) == 4

    # Afterwards, where MLflow is: the sweep into a fresh store, read back through MLflow's client.
    (tmp_path / "store").mkdir()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    subprocess.run([sys.executable, "-m", "launcher.sync", str(sweep), "--tracking-uri", uri], cwd=tmp_path,
                   check=True, capture_output=True)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    cells = {r.data.tags["cell"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(runs) == 5 and {r.info.status for r in runs} == {"FINISHED"}
    for name, result in measured.items():
        assert cells[name].data.metrics["throughput_samples_per_s"] == pytest.approx(
            result["summary"]["throughput_samples_per_s"])
