"""The CPU worker image, built by the project's own script and used: the main job runs inside it.

Needs root, podman, runc and mmdebstrap (Debian's packages; scripts/build-cpu-image installs them
where apt reaches Debian's mirrors) and a torch CPU wheel on local disk; skipped with the reason
where any is missing. The first build takes about 2.5 minutes; later ones reuse the cached layers.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.__main__ import main
from launcher.plan.cell import CellStatus
from launcher.state import SweepState
from tests.conftest import FAST

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
# Explicit rlimits: podman's defaults (nofile 1048576) need CAP_SYS_RESOURCE, which this kind of host drops.
RUN = [*PODMAN, "run", "--rm", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
BUILD_TIMEOUT_S = 600


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mmdebstrap and podman's rootful storage)"
    tools = [t for t in ("podman", "runc", "mmdebstrap") if not shutil.which(t)]
    if tools:
        return (f"{', '.join(tools)} not installed: apt-get install -y podman runc mmdebstrap, then "
                f"scripts/build-cpu-image builds the image")
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("image")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "build-cpu-image")], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env={**os.environ, "WORK_DIR": str(work)})
    if done.returncode != 0 and "torch" in done.stderr and "wheel" in done.stderr:
        pytest.skip(f"no torch CPU wheel on local disk: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_main_job_runs_inside_the_cpu_image(image, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [*RUN, "-v", f"{out}:{out}", "-w", str(out), image,
           "ddp-fsdp-bench", "-m", *FAST, "strategy=ddp,fsdp", f"output_root={out}", f"sweep_dir={out / 'sweep'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    state = SweepState.load(out / "sweep")
    assert [c.status for c in state.cells] == [CellStatus.done, CellStatus.done]
    assert (out / "sweep" / "report.md").exists() and (out / "mlflow.db").exists()
    # The ranks ran the image's Python, not this checkout's.
    probe = subprocess.run([*RUN, image, "python", "-c", "import sys, torch; print(sys.executable, torch.__version__)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    executable, version = probe.stdout.split()
    assert version.endswith("+cpu") and not executable.startswith(str(ROOT))


def test_a_slurm_cell_runs_in_the_image_through_slurms_oci_support(image, tmp_path):
    """cluster.container.runtime=oci: every task of the cell starts inside an OCI bundle made from
    the image (scripts/oci-bundle), through the test cluster's own oci.conf and runc."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        pytest.skip("no Slurm cluster: run the tests with scripts/test (it starts slurm/local-cluster.sh)")
    if not (Path(conf).parent / "oci.conf").exists():
        pytest.skip("the Slurm cluster has no oci.conf: slurm/local-cluster.sh writes one where runc is installed")
    bundle = tmp_path / "bundle"
    made = subprocess.run(["bash", str(ROOT / "scripts" / "oci-bundle"), image, str(bundle), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    code = main(["-m", *FAST, "strategy=ddp,fsdp", "nodes=2", "cluster=slurm", "cluster.timeout_min=10", "wait=true",
                 "cluster.container.runtime=oci", f"cluster.container.image={bundle}", f"output_root={tmp_path / 'out'}",
                 f"sweep_dir={tmp_path / 'out' / 'sweep'}"])
    state = SweepState.load(tmp_path / "out" / "sweep")
    assert code == 0 and [c.status for c in state.cells] == [CellStatus.done] * 2, [(c.name, c.error) for c in state.cells]
    script = next((state.path / "submitit").glob("*_submission.sh")).read_text()
    assert f"--container={bundle}" in script
    for cell in state.cells:
        result = json.loads((state.cell_dir(cell) / "result.json").read_text())
        # Both ranks, on two nodes, ran the image's Python (its venv), not this checkout's.
        assert result["tags"]["python_executable"] == "/opt/venv/bin/python", result["tags"]
        assert len(set(result["rank_hosts"])) == 2
    acct = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,JobName,State,NodeList,Start,End", "-j",
                           ",".join(c.job_id for c in state.cells)], capture_output=True, text=True, check=True)
    print(acct.stdout)
    assert "COMPLETED" in acct.stdout
