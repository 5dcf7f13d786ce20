"""The built wheel on its own: configs inside, the console script, a sweep from any directory.

The wheel is built from a copy of the sources (the build's build/ and *.egg-info stay out of the
checkout) and installed, without dependencies, into a new virtual environment outside the checkout.
The dependencies come from this interpreter's site-packages, added to the new environment as a
plain path in a .pth file: Python runs the .pth files of site directories only, so the checkout's
editable finder (a .pth in that directory) is never run and the checkout is not importable there.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["pyproject.toml", "README.md", "launcher", "contract", "jobs"]


def _run(cmd, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _setuptools_ok() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 68  # pyproject.toml's build requirement


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    # Offline: the build uses this environment's setuptools when it is new enough.
    isolation = ["--no-build-isolation", "--no-index"] if _setuptools_ok() else []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", dist, src])
    (whl,) = dist.glob("ddp_fsdp_bench-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("env") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", root])
    py = root / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "ddp_fsdp_bench_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel])
    return root


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return env


def test_wheel_holds_every_config_and_the_console_script(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    configs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "launcher" / "conf").rglob("*.yaml")}
    assert configs and "launcher/conf/config.yaml" in configs
    assert configs <= names, f"missing from the wheel: {sorted(configs - names)}"
    assert "jobs/worker.py" in names and "launcher/__main__.py" in names
    assert "ddp-fsdp-bench = launcher.__main__:main" in entry_points


def test_installed_wheel_runs_a_sweep_from_another_directory(venv, tmp_path):
    env = _env(venv)
    work = tmp_path / "work"
    work.mkdir()
    py = venv / "bin" / "python"

    # The packages and their configs resolve to the new environment, never to the checkout.
    out = _run([py, "-c", "import jobs, launcher; from launcher.plan.grid import CONF_DIR; "
                          "print(launcher.__file__); print(jobs.__file__); print(CONF_DIR)"], cwd=work, env=env)
    paths = [Path(line).resolve() for line in out.stdout.split()]
    assert len(paths) == 3
    for path in paths:
        assert venv.resolve() in path.parents and ROOT not in path.parents, path

    cli = venv / "bin" / "ddp-fsdp-bench"
    help_text = _run([cli, "--help"], cwd=work, env=env).stdout
    assert "strategy" in help_text and "fsdp" in help_text and "gpt_tiny" in help_text

    _run([cli, "model=mlp", "steps=3", "warmup_steps=1", "repeats=1", "runs=1", "tracking=off"], cwd=work, env=env, timeout=180)
    sweeps = [p.parent for p in (work / "outputs").glob("*/sweep.json")]
    assert len(sweeps) == 1, sorted(p.name for p in (work / "outputs").iterdir())
    (result,) = sweeps[0].glob("cells/*/result.json")
    summary = json.loads(result.read_text())["summary"]
    assert summary["measured_steps"] == 2 and summary["throughput_samples_per_s"] > 0
    assert (sweeps[0] / "report.md").exists()

    # The follow-up commands take the sweep directory from anywhere (here: a relative path from tmp_path).
    rel = os.path.relpath(sweeps[0], tmp_path)
    status = _run([py, "-m", "launcher.status", rel], cwd=tmp_path, env=env).stdout
    assert "1 done" in status
    report = _run([py, "-m", "launcher.report", rel], cwd=tmp_path, env=env).stdout
    assert "report.md" in report
    # It ran with tracking=off: sync is given a store (without one it refuses, having nothing to sync to).
    _run([py, "-m", "launcher.sync", rel, "--tracking-uri", f"sqlite:///{work / 'synced.db'}"], cwd=tmp_path, env=env)
    assert (work / "synced.db").exists()
    assert not (tmp_path / "outputs").exists()  # nothing new lands in the directory the commands ran in
