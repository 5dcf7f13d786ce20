"""Against the real Slurm test cluster (slurm/local-cluster.sh, started by scripts/test).

Skipped, with the reason, only where that cluster could not be brought up.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime

import pytest
import torch
from mlflow.tracking import MlflowClient

from launcher import finish, sync
from launcher.__main__ import main
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.cluster.slurm.resources import max_array_size
from launcher.commands import status
from launcher.plan.cell import CellStatus
from launcher.report.collect import collect, looks_of
from launcher.state import SweepState
from tests.stores import existing_store

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FAST = ["model=gpt_tiny", "model.seq_len=32", "model.vocab_size=256", "batch_size=4", "cluster=slurm", "runs=1",
        "cluster.timeout_min=10", "fabric.probe=off"]


def _slurm_reason():
    if os.environ.get("SLURM_TESTS_UNAVAILABLE"):
        return "local Slurm cluster could not start: " + os.environ["SLURM_TESTS_UNAVAILABLE"]
    if not os.environ.get("SLURM_CONF") or not shutil.which("sinfo"):
        return "no Slurm cluster: run the tests with scripts/test (it starts slurm/local-cluster.sh)"
    if subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode != 0:
        return "sinfo fails: the Slurm cluster is not answering"
    return None


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    reason = _slurm_reason()
    if reason:
        pytest.skip(reason)


def submit(tmp_path, *overrides, name="sweep"):
    existing_store(tmp_path)
    code = main(["-m", *FAST, *overrides, f"output_root={tmp_path}", f"sweep_dir={tmp_path / name}"])
    assert code == 0
    return SweepState.load(tmp_path / name)


def sacct(job_ids, fields):
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", fields, "-j", ",".join(job_ids)],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def test_nodes_sweep_gets_per_point_allocations(tmp_path, capsys):
    """...and the 2-node shape its fabric probe: an sbatch job of that shape, which the cells wait for
    (afterany), so that none measures it; the report shows it and the output root keeps it."""
    t0 = time.monotonic()
    state = submit(tmp_path, "strategy=ddp,fsdp", "nodes=1,2", "steps=6", "warmup_steps=2", "fabric.probe=auto")
    submit_s = time.monotonic() - t0
    out = capsys.readouterr().out
    assert "2 sbatch call(s)" in out  # one job array per resource shape, not one sbatch per cell
    assert all(c.job_id for c in state.cells)
    assert submit_s < 30  # fire-and-forget: returned after submission, not after the jobs
    assert status.wait(state, timeout_s=240)
    assert [c.status for c in state.cells] == ["done"] * 4, status.render(state)
    check_fabric_probe_ran_first(state, tmp_path)

    # sacct: the 2-node cells really got 2 nodes.
    rows = {r[0]: r for r in sacct([c.job_id for c in state.cells], "JobID,NNodes,NodeList,State")}
    for cell in state.cells:
        assert rows[cell.job_id][1] == str(cell.nodes) and rows[cell.job_id][3] == "COMPLETED"
        result = json.loads((state.cell_dir(cell) / "result.json").read_text())
        assert len(set(result["rank_masters"])) == 1  # every rank agreed on MASTER_ADDR:PORT
        assert len(set(result["rank_hosts"])) == cell.nodes  # one rank per node, on distinct nodes
        assert result["rank_masters"][0].split(":")[0] == result["rank_hosts"][0]  # first host is master
        assert result["summary"]["world_size"] == cell.world_size

    client = MlflowClient(tracking_uri=state.tracking_uri)
    runs = client.search_runs([state.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == state.parent_run_id]
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert all(r.data.metrics.get("throughput_samples_per_s", 0) > 0 for r in children)
    assert {r.data.tags["hostnames"] for r in children if r.data.tags["nodes"] == "2"} <= {
        f"node{a},node{b}" for a in range(1, 5) for b in range(a + 1, 5)}
    check_run_spans_job(client, state, state.cells)


def check_fabric_probe_ran_first(state, output_root):
    asked = json.loads((state.path / "fabric" / "2x1" / "probe.json").read_text())
    assert asked["identity"]["cluster"] == "slurm:default" and "node1" in asked["identity"]["nodes"]
    two_nodes = [c.job_id for c in state.cells if c.nodes == 2]
    rows = sacct([asked["job_id"], *two_nodes], "JobID,NNodes,Start,End,State")
    probe = next(r for r in rows if r[0] == asked["job_id"])
    assert probe[1] == "2" and probe[4] == "COMPLETED"
    assert all(datetime.fromisoformat(probe[3]) <= datetime.fromisoformat(r[2]) for r in rows if r[0] != probe[0])
    finish.finalize(state)
    assert f"measured by this sweep (job {asked['job_id']})" in (state.path / "report.md").read_text()
    assert json.loads((output_root / "fabrics.json").read_text())["slurm:default 2x1"]["sweep"] == state.name


# A run starts when its rank 0 begins (after Slurm started the job, and the job's Python its
# imports) and ends as rank 0 logs its end, before Slurm records the job's end. sacct keeps whole
# seconds; the slack allows for the start-up of a Python process on loaded cores.
JOB_START_SLACK_S = 60


def check_run_spans_job(client, state, cells, records: str | None = None):
    """Each cell's MLflow run starts and ends with its Slurm job as sacct reports it (the first
    start of a requeued job, its last end)."""
    out = records or subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,Start,End", "-j",
                                     ",".join(c.job_id for c in cells)], capture_output=True, text=True,
                                    check=True).stdout
    spans: dict[str, list[float]] = {}
    for job_id, start, end in (line.split("|") for line in out.splitlines() if line):
        first = spans.setdefault(job_id, [datetime.fromisoformat(start).timestamp(), 0.0])
        first[1] = datetime.fromisoformat(end).timestamp()
    for cell in cells:
        run = client.get_run(cell.run_id).info
        start_s, end_s = spans[cell.job_id]
        print(f"{cell.name}: job {cell.job_id} sacct {start_s:.0f}..{end_s:.0f}, "
              f"MLflow run {run.start_time / 1000:.3f}..{run.end_time / 1000:.3f}")
        assert start_s <= run.start_time / 1000 <= start_s + JOB_START_SLACK_S, (cell.name, start_s, run.start_time)
        assert run.start_time < run.end_time <= 1000 * (end_s + 1), (cell.name, end_s, run.end_time)


def test_concurrent_jobs_on_the_same_nodes_do_not_collide(tmp_path):
    # Four 2-node jobs pinned to node1+node2, one CPU per rank: two run at once on each node pair
    # (2 CPUs per node), and all test nodes share one loopback, so any port clash would show.
    state = submit(tmp_path, "seed=1,2,3,4", "nodes=2", "steps=40", "warmup_steps=2", "tracking=off",
                   "cluster.cpus_per_task=1", "cluster.exclusive=false",
                   "+cluster.additional_parameters.nodelist='node[1-2]'")
    assert status.wait(state, timeout_s=300)
    assert [c.status for c in state.cells] == ["done"] * 4, status.render(state)
    ports = set()
    for cell in state.cells:
        result = json.loads((state.cell_dir(cell) / "result.json").read_text())
        ports.add(result["rank_masters"][0])
    assert len(ports) == 4
    spans = [(datetime.fromisoformat(s), datetime.fromisoformat(e))
             for _, s, e in sacct([c.job_id for c in state.cells], "JobID,Start,End")]
    overlapping = sum(1 for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1])
    assert overlapping >= 1, spans  # they really ran at the same time


def test_cancel_running_job_then_resubmit(tmp_path):
    # A long job: cancel it while it runs; it must be reported cancelled (no hang), then resubmit it
    # with the same spec and MLflow run and let it finish.
    state = submit(tmp_path, "steps=400", "warmup_steps=2")
    cell = state.cells[0]
    deadline = time.monotonic() + 60
    while cell.status != "running" and time.monotonic() < deadline:
        status.refresh(state)
        time.sleep(1)
    assert cell.status == "running"
    t0 = time.monotonic()
    assert [c.job_id for c in status.cancel(state)] == [cell.job_id]
    assert status.wait(state, timeout_s=60)
    assert cell.status == "cancelled" and time.monotonic() - t0 < 60
    client = MlflowClient(tracking_uri=state.tracking_uri)
    assert client.get_run(cell.run_id).info.status == "KILLED"

    first_job = cell.job_id
    again = status.resubmit(state)
    assert [c.index for c in again] == [0] and cell.job_id != first_job and cell.resubmits == 1
    assert status.wait(state, timeout_s=300)
    assert cell.status == "done", status.render(state)
    assert client.get_run(cell.run_id).info.status == "FINISHED"
    # the status command renders the finished sweep from a fresh load
    assert status.main([state.sweep_dir]) == 0


def test_unknown_partition_and_too_many_nodes_are_refused(tmp_path, capsys):
    assert main(["cluster=slurm", "cluster.partition=nosuch", f"output_root={tmp_path}"]) == 2
    assert main(["cluster=slurm", "nodes=5", f"output_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "cluster.partition='nosuch': no such partition" in err and "debug" in err
    assert "nodes=5: partition debug allows at most 4" in err
    assert not any(tmp_path.iterdir())


def test_each_cell_gets_its_own_time_limit(tmp_path):
    # Held jobs: accepted by sbatch with their parameters, never started.
    state = submit(tmp_path, "cluster.timeout_min=5,7", "tracking=off", "+cluster.additional_parameters.hold=true")
    try:
        rows: dict = {}
        deadline = time.monotonic() + 30
        while len(rows) < 2 and time.monotonic() < deadline:  # accounting lags sbatch by a moment
            rows = {r[0]: r[1] for r in sacct([c.job_id for c in state.cells], "JobID,TimelimitRaw")}
            time.sleep(0.5)
        assert [rows[c.job_id] for c in state.cells] == ["5", "7"], rows
        assert [c.cluster.timeout_min for c in SweepState.load(state.sweep_dir).cells] == [5, 7]
    finally:
        status.cancel(state)


def test_timeout_auto_asks_each_cell_for_what_its_configuration_used_or_is_forecast_to(tmp_path, capsys):
    """cluster.timeout_min=auto: after a sweep of ddp, a sweep of ddp and fsdp asks for ddp's measured
    time and fsdp's forecast one (launcher/forecast/timelimit.py), sbatch gets them, none is stopped."""
    from launcher.forecast import timelimit

    fixed = [o for o in FAST if not o.startswith("cluster.timeout_min")]
    small = [*fixed, "steps=6", "warmup_steps=2", "tracking=off", "wait=true", f"output_root={tmp_path}"]
    assert main(["-m", *small, "strategy=ddp", f"sweep_dir={tmp_path / 'first'}"]) == 0
    first = SweepState.load(tmp_path / "first")
    assert main(["-m", *small, "strategy=ddp,fsdp", "cluster.timeout_min=auto", f"sweep_dir={tmp_path / 'auto'}"]) == 0
    state = SweepState.load(tmp_path / "auto")
    ddp, fsdp = state.cells
    assert ddp.time_asked.startswith("measured") and fsdp.time_asked.startswith("forecast"), state.cells
    assert ddp.cluster.timeout_min == timelimit.minutes_for(first.cells[0].time_used_s, ddp.cluster.signal_delay_s)
    rows = {r[0]: r[1:] for r in sacct([c.job_id for c in state.cells], "JobID,TimelimitRaw,ElapsedRaw,State")}
    print({c.name: (c.time_asked, rows[c.job_id]) for c in state.cells})  # sacct's figures, for the record
    assert [rows[c.job_id][0] for c in state.cells] == [str(c.cluster.timeout_min) for c in state.cells]
    assert all(c.status is CellStatus.done and c.restarts == 0 and rows[c.job_id][2] == "COMPLETED" for c in state.cells)
    report = (state.path / "report.md").read_text()
    assert "## Time limits (cluster.timeout_min=auto)" in report and "No cell was stopped at its limit." in report


def test_arrays_are_split_at_the_clusters_max_array_size(tmp_path, capsys):
    size = max_array_size()
    assert size is not None and size < 8, "scripts/test starts the cluster with SLURM_LOCAL_MAX_ARRAY_SIZE=5"
    seeds = ",".join(str(i) for i in range(size + 2))
    state = submit(tmp_path, f"seed={seeds}", "steps=4", "warmup_steps=1", "tracking=off",
                   "cluster.exclusive=false", "cluster.cpus_per_task=1")
    assert "2 sbatch call(s)" in capsys.readouterr().out
    arrays = {c.job_id.split("_")[0] for c in state.cells}
    assert len(arrays) == 2
    assert status.wait(state, timeout_s=300)
    assert [c.status for c in state.cells] == ["done"] * (size + 2), status.render(state)
    # every cell ran exactly once: one accounting record per cell, each COMPLETED
    rows = sacct(sorted(arrays), "JobID,State")
    assert sorted(r[0] for r in rows) == sorted(c.job_id for c in state.cells)
    assert {r[1] for r in rows} == {"COMPLETED"}


def test_cancel_records_every_cell_and_none_stays_pending(tmp_path):
    state = submit(tmp_path, "seed=1,2,3,4,5,6,7", "tracking=off", "+cluster.additional_parameters.hold=true")
    cancelled = status.cancel(state)
    assert len(cancelled) == 7
    again = SweepState.load(state.sweep_dir)
    status.refresh(again)  # held array tasks that never started have no accounting record of their own
    assert [c.status for c in again.cells] == [CellStatus.cancelled] * 7, status.render(again)
    assert status.wait(again, timeout_s=10)  # ends at once
    assert "7 cancelled" in status.render(again)


def _colocated_sweep(tmp_path, name, *extra):
    state = submit(tmp_path, "seed=1,2", "steps=60", "warmup_steps=2", "cluster.cpus_per_task=1",
                   "+cluster.additional_parameters.nodelist=node1", *extra, name=name)
    assert status.wait(state, timeout_s=300)
    assert [c.status for c in state.cells] == ["done"] * 2, status.render(state)
    finish.finalize(state)
    return SweepState.load(state.sweep_dir)


def test_cells_sharing_a_node_are_flagged_and_exclusive_cells_are_not(tmp_path):
    shared = _colocated_sweep(tmp_path, "shared", "cluster.exclusive=false")
    spans = [(datetime.fromisoformat(s), datetime.fromisoformat(e))
             for _, s, e in sacct([c.job_id for c in shared.cells], "JobID,Start,End")]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans  # they did run at the same time
    for cell, other in zip(shared.cells, reversed(shared.cells), strict=True):
        assert cell.interference and f"co-located with [{other.name}] on node1" in cell.interference
    # The report's table (the seeds are one series: one row) and its per-cell CSV say so.
    assert "co-located: co-located with" in (shared.path / "report.md").read_text()
    assert (shared.path / "cells.csv").read_text().count("co-located with") == 2
    client = MlflowClient(tracking_uri=shared.tracking_uri)
    assert all("co-located" in client.get_run(c.run_id).data.tags["interference"] for c in shared.cells)

    # The default (whole nodes): the same two cells run one after the other, and nothing is flagged.
    alone = _colocated_sweep(tmp_path, "alone")
    spans = [(datetime.fromisoformat(s), datetime.fromisoformat(e))
             for _, s, e in sacct([c.job_id for c in alone.cells], "JobID,Start,End")]
    assert spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0], spans
    assert [c.interference for c in alone.cells] == [None, None]
    assert "co-located" not in (alone.path / "report.md").read_text()


def test_busy_master_port_through_the_launcher_is_port_in_use(tmp_path, capsys):
    """A real listener holds the port the next job will derive from its id (contract.rendezvous.port_for_job):
    the head rank refuses it within seconds instead of a rendezvous that never completes, and the
    cell's class is port_in_use, with its fix, in sweep.json and in status."""
    import socket

    from contract.rendezvous import port_for_job

    probe = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"],
                           capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    subprocess.run(["scancel", probe], check=True)
    listeners = []
    for job_id in range(int(probe) + 1, int(probe) + 4):  # the next ids, in case another job comes first
        sock = socket.socket()
        sock.bind(("", port_for_job(str(job_id))))
        sock.listen()
        listeners.append(sock)
    try:
        state = submit(tmp_path, "steps=4", "warmup_steps=1", "tracking=off")
        assert status.wait(state, timeout_s=180)
    finally:
        for sock in listeners:
            sock.close()
    cell = state.cells[0]
    assert int(cell.job_id) - int(probe) in (1, 2, 3)
    assert cell.status == "failed" and cell.failure_class == "port_in_use", (cell.error, cell.failure_class)
    assert "already in use" in cell.error, cell.error
    capsys.readouterr()
    assert status.main([str(tmp_path / "sweep")]) == 1
    assert "port_in_use: MASTER_PORT was taken" in capsys.readouterr().out


# ---- status follows Slurm: requeues, cancels, impossible requests ----------------------------------

def _wait_for(state, cells, wanted, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status.refresh(state)
        if all(c.status == wanted for c in cells):
            return
        time.sleep(1)
    raise AssertionError(f"not {wanted} after {timeout_s} s:\n{status.render(state, all_cells=True)}")


def _squeue_nodes(job_id):
    out = subprocess.run(["squeue", "-h", "-o", "%N", "-j", job_id], capture_output=True, text=True).stdout.strip()
    return out


def test_a_node_taken_down_mid_cell_is_requeued_then_done_and_not_resubmitted(tmp_path, capsys):
    state = submit(tmp_path, "nodes=2", "steps=300", "warmup_steps=2", "cluster.cpus_per_task=1")
    cell = state.cells[0]
    _wait_for(state, [cell], CellStatus.running)
    deadline = time.monotonic() + 30
    while not (state.cell_dir(cell) / "ranks" / "rank1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # both ranks have started: the node failure hits a cell at work
    node = expand_nodelist(_squeue_nodes(cell.job_id))[1]
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test"], check=True)
    try:
        assert status.wait(state, timeout_s=240)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    records = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State,NodeList", "-j", cell.job_id],
                             capture_output=True, text=True, check=True).stdout
    print(f"sacct -X -D:\n{records}")
    assert [line.split("|")[1] for line in records.splitlines()] == ["NODE_FAIL", "COMPLETED"], records
    assert (cell.status, cell.restarts, cell.error, cell.failure_class) == (CellStatus.done, 1, None, None)
    assert cell.history == [f"NODE_FAIL on {records.splitlines()[0].split('|')[2]}"]
    run = MlflowClient(tracking_uri=state.tracking_uri).get_run(cell.run_id)
    print(f"MLflow: {run.info.status} {json.dumps(run.data.tags, sort_keys=True)}")
    assert run.info.status == "FINISHED" and run.data.tags["restarts"] == "1"
    assert "failure_class" not in run.data.tags and "error" not in run.data.tags
    assert run.data.tags["requeued_after"].startswith("NODE_FAIL on node")
    # The run spans both attempts: from the first start (the one the node failure ended) to the last end.
    check_run_spans_job(MlflowClient(tracking_uri=state.tracking_uri), state, [cell], subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,Start,End", "-j", cell.job_id],
        capture_output=True, text=True, check=True).stdout)
    first_job = cell.job_id
    assert status.main([state.sweep_dir, "--resubmit-failed"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "resubmitted 0 cell(s)" in out and "done after 1 requeue(s) by Slurm (NODE_FAIL on node" in out
    assert SweepState.load(state.sweep_dir).cells[0].job_id == first_job


def test_a_pending_task_cancelled_by_hand_is_cancelled_with_its_reason(tmp_path):
    state = submit(tmp_path, "seed=1,2,3", "+cluster.additional_parameters.hold=true")
    try:
        by_hand = state.cells[1]
        subprocess.run(["scancel", by_hand.job_id], check=True)
        t0 = time.monotonic()
        while by_hand.status is not CellStatus.cancelled and time.monotonic() - t0 < 10:
            # As a user asks: status answers without importing MLflow, whose runs a detached process settles.
            said = subprocess.run([sys.executable, "-c", "import sys; from launcher.status import main; main(sys.argv[1:]); "
                                   "print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow')",
                                   state.sweep_dir], capture_output=True, text=True, timeout=120)
            assert said.stdout.splitlines()[-1] == "no mlflow", said.stdout + said.stderr
            state = SweepState.load(state.path)  # accounting may not know a just-submitted array for a second
            by_hand = state.cells[1]
            time.sleep(0.5)
        assert by_hand.status is CellStatus.cancelled, status.render(state)
        assert finish.wait_for_settled(state.path)
        state = SweepState.load(state.path)  # with the runs the settler created
        by_hand = state.cells[1]
        assert "left the queue before it started" in by_hand.error
        assert [c.status for c in state.cells] == [CellStatus.pending, CellStatus.cancelled, CellStatus.pending]
        client = MlflowClient(tracking_uri=state.tracking_uri)
        run = client.get_run(by_hand.run_id)
        assert run.info.status == "KILLED" and "left the queue" in run.data.tags["cancel_reason"]
    finally:
        status.cancel(state)
    # --cancel cancels the others and keeps the reason of the one cancelled by hand.
    assert "left the queue" in by_hand.error
    assert [c.error for c in state.cells if c is not by_hand] == ["cancelled by launcher.status --cancel"] * 2
    print(status.render(state, all_cells=True))


def test_cancel_mid_sweep_is_one_thing_everywhere(tmp_path, capsys):
    state = submit(tmp_path, "steps=8,2000", "warmup_steps=2")
    quick, slow = state.cells
    _wait_for(state, [quick], CellStatus.done, timeout_s=120)
    _wait_for(state, [slow], CellStatus.running)
    client = MlflowClient(tracking_uri=state.tracking_uri)
    quick_before = client.get_run(quick.run_id).data.metrics
    assert status.main([state.sweep_dir, "--cancel"]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "cancelled 1 cell(s)" in out
    again = SweepState.load(state.sweep_dir)
    assert status.wait(again, timeout_s=60)
    assert [c.status for c in again.cells] == [CellStatus.done, CellStatus.cancelled]
    assert again.cells[1].error == "cancelled by launcher.status --cancel" and again.cells[1].failure_class is None
    # Every path reaches the one finishing step: sync settles the runs, writes the report, closes the parent.
    assert sync.main([state.sweep_dir]) == 0
    runs = {r.info.run_id: r for r in client.search_runs([state.experiment_id])}
    final = SweepState.load(state.sweep_dir)  # the cancelled cell's run was created by --cancel, at its job's start
    kept, killed, parent = (runs[final.cells[0].run_id], runs[final.cells[1].run_id], runs[state.parent_run_id])
    print(f"MLflow: {kept.info.status} {kept.data.tags.get('cell')}; {killed.info.status} "
          f"cancel_reason={killed.data.tags.get('cancel_reason')!r}; parent {parent.info.status}")
    assert killed.info.status == "KILLED" and killed.data.tags["cancel_reason"] == "cancelled by launcher.status --cancel"
    assert "failure_class" not in killed.data.tags and "error" not in killed.data.tags
    assert kept.info.status == "FINISHED" and kept.data.metrics == quick_before  # numbers unchanged
    assert parent.info.status == "KILLED"  # the cells that did not finish were all cancelled
    rows = collect(SweepState.load(state.sweep_dir))
    assert [r["status"] for r in rows] == ["done", "cancelled"]
    assert (again.path / "report.md").exists()
    sacct_lines = sacct([c.job_id for c in again.cells], "JobID,State")
    print(f"sacct: {sacct_lines}")
    assert [s.split()[0] for _, s in sacct_lines] == ["COMPLETED", "CANCELLED"]


def _queued_jobs() -> set[str]:
    """The jobs in the queue, by job id (an array by its array job id: its tasks start, end and change
    their own ids between two reads, the array's id stays)."""
    out = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_an_impossible_memory_request_is_refused_before_sbatch(tmp_path, capsys):
    # What it means: this refusal submitted no job. Jobs of earlier tests may end (and leave the queue)
    # between the two reads; only a job that was not there before would be this command's.
    before = _queued_jobs()
    assert main(["cluster=slurm", "model=gpt_tiny", "runs=1", "cluster.mem_gb=100", f"output_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert "102400 MB of memory per node (cluster.mem_gb=100)" in err and "4000 MB" in err and "Fix:" in err
    assert not any(tmp_path.iterdir())  # no sweep directory, no submitit folder: sbatch was never called
    assert not _queued_jobs() - before, "the refused request submitted a job"
    # What the check cannot know, sbatch still refuses: a clear error, and the cells failed with its reason.
    code = main(["-m", *FAST, "seed=1,2", "+cluster.additional_parameters.gres=gpu:1", f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 'refused'}"])
    captured = capsys.readouterr()
    print(captured.err)
    assert code == 1 and "Traceback" not in captured.err and "sbatch refused 2 cell(s)" in captured.err
    state = SweepState.load(tmp_path / "refused")
    assert [c.status for c in state.cells] == [CellStatus.failed] * 2
    assert all(c.failure_class == "submit_refused" and "sbatch refused the job" in c.error for c in state.cells)
    client = MlflowClient(tracking_uri=state.tracking_uri)
    assert {client.get_run(c.run_id).info.status for c in state.cells} == {"FAILED"}
    assert status.wait(state, timeout_s=5)  # nothing stays planned


def test_the_same_sweep_twice_is_refused_while_the_first_runs(tmp_path, capsys):
    args = ["-m", *FAST, "seed=1,2", "tracking=off", "+cluster.additional_parameters.hold=true",
            f"output_root={tmp_path}"]
    assert main(args) == 0
    first = SweepState.load(next(tmp_path.glob("*/sweep.json")).parent)
    try:
        time.sleep(1.1)  # a new timestamped sweep directory
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"the same sweep is already running: {first.sweep_dir}" in err and "--allow-concurrent" in err
        assert main([*args, "--allow-concurrent"]) == 0
        assert len(list(tmp_path.glob("*/sweep.json"))) == 2
    finally:
        for path in tmp_path.glob("*/sweep.json"):
            status.cancel(SweepState.load(path.parent))


class SlowOnNode(torch.nn.Module):
    """A small token model that sleeps ``delay_ms`` in every forward on node ``slow_node`` only: a node
    made slow on purpose (the ranks know their node as Slurm names it, SLURMD_NODENAME)."""

    def __init__(self, vocab_size: int = 256, width: int = 64, slow_node: str = "", delay_ms: float = 0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.head = torch.nn.Linear(width, vocab_size)
        self.delay_s = delay_ms / 1e3 if os.environ.get("SLURMD_NODENAME") == slow_node else 0.0

    def forward(self, x):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.head(self.embed(x))


def test_runs_spread_over_nodes_and_a_slow_node_is_named(tmp_path):
    """runs=auto on Slurm: the first round's runs of each grid point land on different nodes (sacct),
    status --wait submits the next round where a comparison is open (its runs excluding the nodes used),
    and node2, slowed on purpose, is named with the cells it touched."""
    from launcher.report import findings, nodes

    state = submit(tmp_path, *[o for o in FAST if not o.startswith(("model", "runs="))], "strategy=ddp,fsdp",
                   "runs=auto", "runs_min=3", "runs_max=5", "model=custom", f"model._target_={__name__}.SlowOnNode",
                   "model.input=tokens", "model.seq_len=32", "model.vocab_size=256", "+model.params.vocab_size=256",
                   "+model.params.slow_node=node2", "+model.params.delay_ms=500", "steps=8", "warmup_steps=2",
                   "tracking=off")
    first = list(state.cells)
    assert [c.placed for c in first] == [f"nodelist=node{n}" for n in (1, 2, 2, 3, 3, 4)]
    assert status.wait(state, timeout_s=480), status.render(state)
    assert all(c.status is CellStatus.done for c in state.cells), status.render(state)
    ran_on = {c.job_id: r[1] for c in state.cells for r in sacct([c.job_id], "JobID,NodeList") if r[0] == c.job_id}
    for name in ("strategy=ddp", "strategy=fsdp"):
        runs = [c for c in first if c.name.startswith(name + " ")]
        assert len({ran_on[c.job_id] for c in runs}) == 3, ran_on  # three runs, three nodes
    design = state.design
    assert design.stopped, design  # decided, stopped early, or runs_max: said, never silent
    for cell in state.cells[len(first):]:  # a second round's runs avoid the nodes of the first
        used = {ran_on[c.job_id] for c in first if c.name.split(" run=")[0] == cell.name.split(" run=")[0]}
        assert cell.placed == f"exclude={','.join(sorted(used))}" and ran_on[cell.job_id] not in used
    rows = collect(state)
    slow = nodes.slow_nodes(rows)
    print(findings.findings(rows, looks=looks_of(state)))
    assert list(slow) == ["node2"], slow
    assert {c.split(" (")[0] for c in slow["node2"]} == {"strategy=ddp run=2", "strategy=fsdp run=1"} | {
        c.name for c in state.cells[len(first):] if "node2" in ran_on[c.job_id]}
