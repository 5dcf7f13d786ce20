"""slurm/local-cluster.sh itself: up/down/up over kept state, a job, failures, cluster knobs.

Every test here brings up a cluster of its own (own directory, own port offset, 2 nodes), beside
the suite's shared one (started by scripts/test), which it never touches; it is purged at the end.
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "slurm" / "local-cluster.sh"
NODES = 2
MAX_ARRAY_SIZE = 5
BASE_PORTS = (7806, 7817, 7819, *range(7821, 7821 + NODES))  # MariaDB, slurmctld, slurmdbd, slurmd


def _skip_reason():
    if os.geteuid() != 0:
        return "slurm/local-cluster.sh needs root (namespaces, bind mounts, packages)"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "Slurm is not installed and apt-get is not available to install it"
    return None


@pytest.fixture(autouse=True)
def _needs_root():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)


def _port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_offset():
    """A port offset (not 0, the suite's cluster) whose ports are all free, below the jobs' range."""
    for offset in range(600 + os.getpid() % 7 * 100, 2100, 100):
        if all(_port_free(p + offset) for p in BASE_PORTS):
            return offset
    pytest.fail("no free port offset for a second local cluster")


class Cluster:
    """One private instance of slurm/local-cluster.sh."""

    def __init__(self, directory, offset, **knobs):
        self.dir = directory
        self.offset = offset
        self.conf = f"{directory}/etc/slurm.conf"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SQUEUE_", "SACCT_", "SINFO_"))}
        self.env = {**base, "SLURM_LOCAL_DIR": directory, "SLURM_LOCAL_PORT_OFFSET": str(offset),
                    "SLURM_LOCAL_NODES": str(NODES), "SLURM_LOCAL_MAX_ARRAY_SIZE": str(MAX_ARRAY_SIZE),
                    "SLURM_LOCAL_TIMEOUT": "180", **knobs}
        self.slurm_env = {**base, "SLURM_CONF": self.conf}

    def script(self, *args, timeout=600, **knobs):
        return subprocess.run(["bash", str(SCRIPT), *args, self.dir], capture_output=True, text=True,
                              timeout=timeout, env={**self.env, **knobs})

    def up(self, **knobs):
        r = self.script("up", **knobs)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"export SLURM_CONF={self.conf}"], r.stdout
        return r

    def slurm(self, *cmd, check=True, timeout=120):
        """A Slurm client command against this cluster only (SLURM_CONF set)."""
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=self.slurm_env)
        if check:
            assert r.returncode == 0, f"{cmd}: {r.stderr}"
        return r

    def wait_running(self, job_ids, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.slurm("squeue", "-h", "-o", "%i %T %N", "-j", ",".join(job_ids)).stdout
            rows = {i: (state, nodes) for i, state, *nodes in (line.split(" ", 2) for line in out.splitlines())}
            if all(rows.get(j, ("",))[0] == "RUNNING" for j in job_ids):
                return {j: rows[j][1][0] if rows[j][1] else "" for j in job_ids}
            time.sleep(0.5)
        pytest.fail(f"jobs {job_ids} not all running after {timeout}s: {out}")


@pytest.fixture
def cluster():
    directory = tempfile.mkdtemp(prefix="slurm-local-test-", dir="/tmp")
    os.chmod(directory, 0o755)  # munged (user munge) must reach its key below it
    c = Cluster(directory, _free_offset())
    try:
        yield c
    finally:
        r = c.script("down", "--purge")
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(directory), os.listdir(directory)


def _sbatch(cluster, *args):
    r = cluster.slurm("sbatch", "--parsable", "-o", "/dev/null", *args)
    return r.stdout.strip().split(";")[0]


def test_up_down_up_keeps_state_and_runs_jobs(cluster):
    cluster.up()
    first = _sbatch(cluster, "-N1", "--wait", "--wrap", "true")

    again = cluster.up()  # idempotent while up
    assert "already up" in again.stderr

    r = cluster.script("down")
    assert r.returncode == 0, r.stderr
    assert cluster.script("status").returncode == 3  # down, state kept
    assert os.path.exists(f"{cluster.dir}/munge/munge.key")

    cluster.up()  # a restart over the kept state (munge key, slurmctld state, accounting)
    out = cluster.slurm("srun", f"-N{NODES}", f"-n{NODES}", "hostname", timeout=60).stdout.split()
    assert sorted(out) == [f"node{i}" for i in range(1, NODES + 1)]
    second = _sbatch(cluster, f"-N{NODES}", "--wait", "--wrap", "srun hostname")
    assert int(second) > int(first)  # job ids continue where they stopped
    states = cluster.slurm("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", f"{first},{second}").stdout
    assert sorted(states.split()) == sorted([f"{first}|COMPLETED", f"{second}|COMPLETED"])
    assert cluster.script("status").returncode == 0


def test_exclusive_jobs_get_whole_nodes_and_arrays_are_capped(cluster):
    cluster.up()
    conf = Path(cluster.conf).read_text()
    assert f"MaxArraySize={MAX_ARRAY_SIZE}\n" in conf

    # --exclusive is honoured: one exclusive job per node, the next one waits for a node.
    jobs = [_sbatch(cluster, "--exclusive", "-N1", "-n1", "--wrap", "sleep 30") for _ in range(NODES)]
    nodes = cluster.wait_running(jobs)
    assert sorted(nodes.values()) == [f"node{i}" for i in range(1, NODES + 1)]
    for j in jobs:
        assert "OverSubscribe=NO" in cluster.slurm("scontrol", "show", "job", j).stdout
    waiting = _sbatch(cluster, "-N1", "-n1", "--wrap", "true")
    time.sleep(3)  # two scheduling passes (sched_interval=2)
    state = cluster.slurm("squeue", "-h", "-o", "%T %r", "-j", waiting).stdout.split()
    assert state[0] == "PENDING", state
    cluster.slurm("scancel", *jobs, waiting)

    # Without --exclusive, 1-CPU jobs share a node core by core.
    shared = [_sbatch(cluster, "-w", "node1", "-n1", "--wrap", "sleep 30") for _ in range(2)]
    assert set(cluster.wait_running(shared).values()) == {"node1"}
    cluster.slurm("scancel", *shared)

    # MaxArraySize=5: indices 0-4 are accepted, an array reaching index 5 is refused.
    array = _sbatch(cluster, f"--array=0-{MAX_ARRAY_SIZE - 1}", "--wrap", "true")
    assert array.isdigit()
    r = cluster.slurm("sbatch", "-o", "/dev/null", f"--array=0-{MAX_ARRAY_SIZE}", "--wrap", "true", check=False)
    assert r.returncode != 0
    assert re.search(r"array", r.stderr, re.I), r.stderr


def test_failed_up_exits_nonzero_without_export_and_leaves_nothing_running(cluster):
    # A bad knob: refused before anything starts.
    r = cluster.script("up", SLURM_LOCAL_MAX_ARRAY_SIZE="0")
    assert r.returncode != 0 and "export" not in r.stdout
    assert "SLURM_LOCAL_MAX_ARRAY_SIZE" in r.stderr

    # A port taken by another service: refused before anything starts.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 7817 + cluster.offset))
        s.listen()
        r = cluster.script("up")
    assert r.returncode == 1 and "export" not in r.stdout
    assert "already in use" in r.stderr

    # Daemons that cannot get ready in time: up fails and stops what it started.
    r = cluster.script("up", SLURM_LOCAL_TIMEOUT="1")
    assert r.returncode == 1 and "export" not in r.stdout, r.stdout
    assert "ERROR" in r.stderr
    assert "stopping the daemons started so far" in r.stderr
    assert not list(Path(cluster.dir, "pids").glob("*.pid"))
    assert cluster.script("status").returncode == 3

    # And the next up over what the failed one left works.
    cluster.up()
