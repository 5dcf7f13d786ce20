"""The node health probe on the real Slurm test cluster (4 nodes sharing this machine's cores).

One node is slowed on purpose: its slurmd is moved into a CPU cgroup with a small quota (cgroup v1's
``cpu.cfs_quota_us`` or v2's ``cpu.max``), which every job step it starts inherits (the test cluster
runs ``proctrack/linuxproc``, no cgroup plugin of its own). One ``launcher.health`` run names it; a
``health=auto`` sweep then runs without it (judged by that recent probe) and says so; with the quota
lifted, a probe flags nothing and the next ``health=auto`` sweep has the node back. About 2 minutes.
"""

import contextlib
import json
import os
from pathlib import Path

import pytest

from launcher.commands import health as command
from launcher.report import health
from launcher.state import SweepState
from tests.test_slurm import slurm_cluster, submit  # noqa: F401  (module fixture: skip without Slurm)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLOW_NODE = "node3"
KEY = "slurm:default"
QUOTA_CPUS = 0.1  # of the machine's 2 cores, against the share a loaded machine leaves the other nodes


def _cpu_cgroup_root() -> tuple[Path, str] | None:
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        return v2, "v2"
    return None


@contextlib.contextmanager
def slowed(node: str, cpus: float):
    """``node``'s slurmd, and so every job step it starts, held to ``cpus`` CPUs; put back afterwards."""
    found = _cpu_cgroup_root()
    if found is None:
        pytest.skip("no writable CPU cgroup (v1 cpu controller or v2 with cpu enabled) to slow a node with")
    root, version = found
    pid = (Path(os.environ["SLURM_CONF"]).parent.parent / "run" / f"slurmd-{node}.pid").read_text().strip()
    group = root / f"health-test-{node}"
    group.mkdir(exist_ok=True)
    if version == "v1":
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    else:
        (group / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
    (group / "cgroup.procs").write_text(pid)
    try:
        yield
    finally:
        for leftover in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(leftover)
        with contextlib.suppress(OSError):
            group.rmdir()


def probe(tmp_path, capsys) -> tuple[int, dict, str]:
    # The default partition, as the sweeps below ask for it: one ledger (slurm:default), as the fabric's key.
    code = command.main(["cluster=slurm", f"output_root={tmp_path}", "health.repeats=4"])
    out = capsys.readouterr().out
    return code, health.read(health.ledger_path(tmp_path, KEY))[-1], out


def test_a_slowed_node_is_named_excluded_by_health_auto_and_back_after_a_clean_probe(tmp_path, capsys):
    with slowed(SLOW_NODE, QUOTA_CPUS):
        code, record, out = probe(tmp_path, capsys)
        assert code == 1 and record["verdicts"]["flagged"] == [SLOW_NODE], out
        assert f"scontrol update nodename={SLOW_NODE} state=drain" in out
        assert record["nodes"][SLOW_NODE]["cgroup_cpus"] == pytest.approx(QUOTA_CPUS)  # the probe saw the quota
        assert command.check(health.ledger_path(tmp_path, KEY), SLOW_NODE) == 1

        state = submit(tmp_path, "nodes=1", "runs=2", "steps=4", "warmup_steps=1", "health=auto", name="with-health")
        assert all(SLOW_NODE in (c.cluster.exclude or "") for c in state.cells)
        said = capsys.readouterr().out
        assert "as the probe of" in said and f"health: excluded {SLOW_NODE}" in said  # the recent probe, reused
    from launcher import finish
    from launcher.commands import status

    assert status.wait(state, timeout_s=300)
    finish.finalize(SweepState.load(state.path))
    hosts = {h for c in state.cells for h in json.loads((state.cell_dir(c) / "result.json").read_text())["rank_hosts"]}
    assert hosts and SLOW_NODE not in hosts
    report = (state.path / "report.md").read_text()
    assert "## Node health" in report and f"**excluded {SLOW_NODE}**" in report
    assert "](plots/health-default.png)" in report and (state.path / "plots" / "health-default.png").exists()

    # The quota lifted: a probe of the healthy cluster flags nothing, and the next sweep has the node back.
    code, record, out = probe(tmp_path, capsys)
    assert code == 0 and record["verdicts"]["flagged"] == [] and "nothing flagged" in out, out
    back = submit(tmp_path, "nodes=1", "runs=1", "steps=4", "warmup_steps=1", "health=auto", name="back")
    notes = json.loads((back.path / health.SWEEP_FILE).read_text())["probes"][0]
    assert notes["excluded"] == [] and notes["back"] == [SLOW_NODE], notes
    assert not any(c.cluster.exclude for c in back.cells)
    assert command.check(health.ledger_path(tmp_path, KEY), SLOW_NODE) == 0
    assert status.wait(back, timeout_s=300)
    finish.finalize(SweepState.load(back.path))
    assert f"back after a clean probe: {SLOW_NODE}" in (back.path / "report.md").read_text()
    shown = "\n".join(health.show(health.read(health.ledger_path(tmp_path, KEY))))
    assert f"| {SLOW_NODE} |" in shown and "1 of 2" in shown  # slow in the probe under the quota
