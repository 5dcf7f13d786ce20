"""Slurm's command output, parsed without a cluster: literal lines as sinfo, sacct, squeue and
scontrol printed them on the test cluster (slurm-wlm 22.05), plus the sbatch parameters that
containers need."""

import socket
import time

import pytest

from contract.spec import Layout
from launcher.cluster.base import CANCELLED_BY_LAUNCHER, Allocation
from launcher.cluster.colocation import overlaps
from launcher.cluster.slurm import accounting
from launcher.cluster.slurm import backend as slurm_backend
from launcher.cluster.slurm.accounting import (
    expand_array_ids,
    merge_records,
    parse_sacct_times,
    parse_states,
    slurm_status,
)
from launcher.cluster.slurm.resources import parse_max_array_size
from launcher.cluster.slurm.settings import ContainerConfig, ContainerRuntime, SlurmSettings
from launcher.cluster.slurm.submit import group_key, groups, slurm_parameters
from launcher.plan.cell import Cell, CellStatus
from launcher.state import SweepState
from launcher.track import reconcile

SACCT_STATES = """\
46389281_0|COMPLETED
46389281_1|COMPLETED
46389290_3|RUNNING
46389290_4|FAILED
46389291|CANCELLED by 0
46389292|OUT_OF_MEMORY
46389293|REQUEUED
46389293|RUNNING
46389285_[0-4%2]|CANCELLED by 0
"""
SQUEUE = """\
46389285_[2-4%2]|PENDING
46389285_1|RUNNING
"""
SCONTROL_CONFIG = """\
Configuration data as of 2026-11-22T23:16:57
AccountingStorageBackupHost = (null)
ClusterName             = localcluster
MaxArraySize            = 5
MaxJobCount             = 10000
"""
SACCT_TIMES = """\
46389281_1|2026-11-22T23:16:13|2026-11-22T23:16:23|node1
46389283_0|2026-11-22T23:16:32|2026-11-22T23:16:44|node[1-2]
46389284_0|Unknown|Unknown|None assigned
"""


def test_sacct_and_squeue_lines_become_cell_statuses():
    raw = parse_states(SACCT_STATES)
    assert {k: slurm_status(v) for k, v in raw.items()} == {
        "46389281_0": CellStatus.done, "46389281_1": CellStatus.done, "46389290_3": CellStatus.running,
        "46389290_4": CellStatus.failed, "46389291": CellStatus.cancelled, "46389292": CellStatus.failed,
        "46389293": CellStatus.running,  # a requeued job: the last record wins
        **{f"46389285_{i}": CellStatus.cancelled for i in range(5)},  # never-started array tasks, folded
    }
    assert parse_states(SQUEUE) == {"46389285_2": "PENDING", "46389285_3": "PENDING", "46389285_4": "PENDING",
                                    "46389285_1": "RUNNING"}
    assert slurm_status("PREEMPTED") is CellStatus.pending and slurm_status("NODE_FAIL") is CellStatus.failed
    assert slurm_status("SOMETHING_NEW") is CellStatus.failed


def test_array_id_folding():
    assert expand_array_ids("12_[0-2,5%4]") == ["12_0", "12_1", "12_2", "12_5"]
    assert expand_array_ids("12_7") == ["12_7"] and expand_array_ids("12") == ["12"]


def test_scontrol_show_config_gives_max_array_size():
    assert parse_max_array_size(SCONTROL_CONFIG) == 5
    assert parse_max_array_size("ClusterName = x\n") is None


def test_sacct_times_and_overlap_on_shared_hosts():
    times = parse_sacct_times(SACCT_TIMES)
    assert set(times) == {"46389281_1", "46389283_0"}  # not started: left out
    start, end, hosts = times["46389283_0"]
    assert end - start == 12 and hosts == ["node1", "node2"]
    a = Allocation(0, frozenset({"node1"}), 0.0, 100.0)
    b = Allocation(1, frozenset({"node1", "node2"}), 50.0, 150.0)
    c = Allocation(2, frozenset({"node3"}), 0.0, 150.0)
    d = Allocation(3, frozenset({"node1"}), 100.5, 120.0)  # back to back with a: not counted
    found = overlaps([a, b, c, d], {0: "a", 1: "b", 2: "c", 3: "d"})
    assert found[0] == "co-located with [b] on node1 (50% of its run)"
    assert found[1].startswith("co-located with [")
    assert 2 not in found


def _cell(index, **cluster):
    return Cell(index=index, name=f"c{index}", dirname=f"{index:02d}", overrides=[], strategy="ddp",
                     precision="fp32", model="gpt_tiny", cluster=SlurmSettings(**cluster), layout=Layout())


def test_cells_group_only_when_every_sbatch_parameter_matches_and_arrays_are_split():
    cells = [_cell(0, timeout_min=5), _cell(1, timeout_min=7), _cell(2, timeout_min=5), _cell(3, timeout_min=5),
             _cell(4, timeout_min=5, setup=["module load cuda"])]
    assert group_key(cells[0]) == group_key(cells[2]) != group_key(cells[1])
    assert [[c.index for c in g] for g in groups(cells, None)] == [[0, 2, 3], [1], [4]]
    assert [[c.index for c in g] for g in groups(cells, 2)] == [[0, 2], [3], [1], [4]]


def test_container_parameters_for_pyxis_apptainer_and_slurms_oci():
    pyxis = SlurmSettings(container=ContainerConfig(runtime=ContainerRuntime.pyxis, image="nvcr.io#nvidia/pytorch:24.05-py3",
                                                    mounts=["/data:/data"]), gpus_per_node=8, tasks_per_node=8)
    params = slurm_parameters(pyxis, Layout(nodes=2, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12), "s")
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in params["srun_args"]
    assert "--container-mounts=/data:/data" in params["srun_args"]
    assert params["gpus_per_node"] == 8 and params["exclusive"] is True and params["nodes"] == 2
    assert pyxis.python_command() == "python"
    apptainer = SlurmSettings(container=ContainerConfig(runtime=ContainerRuntime.apptainer, image="/img/bench.sif",
                                                        mounts=["/scratch"]), gpus_per_node=4)
    assert apptainer.python_command() == "apptainer exec --nv --bind /scratch /img/bench.sif python"
    oci = SlurmSettings(container=ContainerConfig(runtime=ContainerRuntime.oci, image="/shared/bundles/cpu"))
    assert slurm_parameters(oci, Layout(nodes=2), "s")["srun_args"][-1] == "--container=/shared/bundles/cpu"
    assert oci.python_command() == "python"  # the bundle's own (scripts/oci-bundle)
    assert "exclusive" not in slurm_parameters(SlurmSettings(exclusive=False), Layout(), "s")


def test_a_job_unknown_to_queue_and_accounting_becomes_lost_after_a_grace_period(tmp_path):
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="slurm", argv=[], cells=[_cell(0), _cell(1)])
    for cell, age_s in zip(state.cells, (5.0, slurm_backend.LOST_AFTER_S + 5), strict=True):
        cell.job_id, cell.status, cell.submitted_at = "99", CellStatus.pending, time.time() - age_s
        slurm_backend._follow(state, cell, None)
    assert state.cells[0].status is CellStatus.pending  # accounting may lag
    assert state.cells[1].status is CellStatus.lost


@pytest.mark.parametrize("version, words", [(1, "older"), (99, "newer")])
def test_sweep_documents_of_other_versions_are_refused_with_what_to_do(tmp_path, version, words):
    from launcher.state import StateError

    text = '{"cells": []}' if version == 1 else f'{{"version": {version}, "cells": []}}'
    (tmp_path / "sweep.json").write_text(text)
    with pytest.raises(StateError, match=words) as info:
        SweepState.load(tmp_path)
    assert "Fix:" in str(info.value)


def test_the_sweep_document_round_trips(tmp_path):
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="slurm", argv=["x"],
                       cells=[_cell(0, timeout_min=5, setup=["module load x"]), _cell(1)])
    state.cells[0].status = CellStatus.failed
    (tmp_path / "cells").mkdir()  # a real sweep has it; a document without it is refused as a partial copy
    state.save()
    again = SweepState.load(tmp_path)
    assert again == state and again.cells[0].status is CellStatus.failed
    assert again.cells[0].cluster.setup == ["module load x"] and not list(tmp_path.glob("*.pkl"))


def test_foreign_use_is_judged_only_over_a_long_enough_window():
    from launcher.cluster.colocation import foreign_use

    busy = {"foreign_cpu_share": 0.4, "measured_steps": 100, "step_time_ms_p50": 50.0}  # a 5 s window
    assert foreign_use(busy) == "other processes used 40% of its cores during the measured window"
    assert foreign_use({**busy, "step_time_ms_p50": 5.0}) is None  # 0.5 s: start-up blips, 10 ms ticks
    assert foreign_use({**busy, "foreign_cpu_share": 0.05}) is None
    assert "its GPUs" in foreign_use({**busy, "foreign_gpu_share": 0.3})


# ---- one reconciliation with Slurm: every record of a job (sacct -X -D), and the live queue ------
# Literal output of the test cluster: a 2-node job on node[1-2] while node2 was set down
# (scontrol update nodename=node2 state=down), requeued by Slurm, then run again and completed.
SACCT_NODE_FAIL_REQUEUED = """\
46562236|NODE_FAIL|node[1-2]|2026-11-24T23:17:40|2026-11-24T23:17:44
46562236|PENDING|None assigned|Unknown|Unknown
"""
SACCT_NODE_FAIL_RUNNING_AGAIN = """\
46562236|NODE_FAIL|node[1-2]|2026-11-24T23:17:40|2026-11-24T23:17:44
46562236|RUNNING|node[1-2]|2026-11-24T23:17:56|Unknown
"""
SACCT_NODE_FAIL_COMPLETED = """\
46562236|NODE_FAIL|node[1-2]|2026-11-24T23:17:40|2026-11-24T23:17:44
46562236|COMPLETED|node[3-4]|2026-11-24T23:17:56|2026-11-24T23:18:31
"""
# A held array of 5 after `scancel 46562237_3`: accounting still folds task 3 into the pending
# record; only the queue shows that it left.
SACCT_ARRAY_ONE_CANCELLED = "46562237_[0-4]|PENDING|None assigned|Unknown|Unknown\n"
SQUEUE_ARRAY_ONE_CANCELLED = "46562237_[0-2,4]|PENDING\n"


def _slurm_sweep(tmp_path, n=1, job_ids=("46562236",)):
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="slurm", argv=[],
                       cells=[_cell(i) for i in range(n)], submitter="elsewhere:1")
    for cell, job in zip(state.cells, job_ids, strict=True):
        cell.job_id, cell.status, cell.submitted_at = job, CellStatus.pending, time.time()
        state.cell_dir(cell).mkdir(parents=True)
    return state


def _follow(monkeypatch, state, sacct_text, squeue_text):
    monkeypatch.setattr(accounting, "job_records", lambda ids: merge_records(sacct_text, squeue_text, ids))
    return reconcile.refresh(state)


def test_a_requeued_job_is_followed_to_done_with_its_restart_counted(tmp_path, monkeypatch):
    state = _slurm_sweep(tmp_path)
    cell = state.cells[0]
    # The moment the old code read: accounting's last record NODE_FAIL; the queue holds the requeue.
    _follow(monkeypatch, state, SACCT_NODE_FAIL_REQUEUED.splitlines()[0], "46562236|PENDING\n")
    assert (cell.status, cell.restarts, cell.error) == (CellStatus.pending, 1, None)
    assert cell.history == ["NODE_FAIL on node[1-2]"]
    _follow(monkeypatch, state, SACCT_NODE_FAIL_RUNNING_AGAIN, "46562236|RUNNING\n")
    assert (cell.status, cell.restarts) == (CellStatus.running, 1)
    # It completed but wrote no result: failed, and only that makes it failed.
    _follow(monkeypatch, state, SACCT_NODE_FAIL_COMPLETED, "")
    assert cell.status is CellStatus.failed and "without writing result.json" in cell.error
    (state.cell_dir(cell) / "result.json").write_text("{}")
    _follow(monkeypatch, state, SACCT_NODE_FAIL_COMPLETED, "")
    assert (cell.status, cell.restarts, cell.error, cell.failure_class) == (CellStatus.done, 1, None, None)
    times = _follow(monkeypatch, state, SACCT_NODE_FAIL_COMPLETED, "").times
    assert times["46562236"][2] == ["node3", "node4"]  # interference reads the start that measured


def test_a_cancelled_job_still_completing_is_no_requeue():
    [rec] = merge_records("46562247_1|CANCELLED by 0|node2|2026-11-24T23:30:30|2026-11-24T23:30:35\n",
                          "46562247_1|COMPLETING\n", ["46562247_1"]).values()
    assert (rec.restarts, rec.history, rec.state) == (0, (), "COMPLETING")


def test_a_cell_that_looked_failed_follows_slurm_back(tmp_path, monkeypatch):
    """Every cell is reconciled, finished or not: a NODE_FAIL seen before the requeue is not final."""
    state = _slurm_sweep(tmp_path)
    cell = state.cells[0]
    _follow(monkeypatch, state, SACCT_NODE_FAIL_REQUEUED.splitlines()[0], "")  # queue empty for a moment
    assert cell.status is CellStatus.failed and cell.failure_class == "node_failure"
    _follow(monkeypatch, state, SACCT_NODE_FAIL_RUNNING_AGAIN, "46562236|RUNNING\n")
    assert (cell.status, cell.failure_class, cell.error) == (CellStatus.running, None, None)


def test_a_pending_array_task_cancelled_by_hand_is_cancelled_at_once(tmp_path, monkeypatch):
    ids = [f"46562237_{i}" for i in range(5)]
    state = _slurm_sweep(tmp_path, 5, ids)
    _follow(monkeypatch, state, SACCT_ARRAY_ONE_CANCELLED, SQUEUE_ARRAY_ONE_CANCELLED)
    assert [c.status for c in state.cells] == [CellStatus.pending] * 3 + [CellStatus.cancelled, CellStatus.pending]
    assert "left the queue before it started" in state.cells[3].error
    # A later --cancel keeps the reason of a cell that was already cancelled.
    monkeypatch.setattr("launcher.cluster.slurm.accounting.cancel", lambda ids: None)
    from launcher.commands import status

    cancelled = status.cancel(state)
    assert [c.index for c in cancelled] == [0, 1, 2, 4]
    assert "left the queue" in state.cells[3].error and state.cells[0].error == CANCELLED_BY_LAUNCHER


def test_a_task_cancelled_before_accounting_folded_its_array_is_cancelled(tmp_path, monkeypatch):
    # `scancel 46562278_1` within a second of sbatch: accounting folds only the tasks left.
    ids = [f"46562278_{i}" for i in range(3)]
    state = _slurm_sweep(tmp_path, 3, ids)
    _follow(monkeypatch, state, "46562278_[0,2]|PENDING|None assigned|Unknown|Unknown\n", "46562278_[0,2]|PENDING\n")
    assert [c.status for c in state.cells] == [CellStatus.pending, CellStatus.cancelled, CellStatus.pending]


def test_cancelled_by_hand_and_time_limit_name_their_reason(tmp_path, monkeypatch):
    state = _slurm_sweep(tmp_path, 2, ("46389291", "46389294"))
    _follow(monkeypatch, state, "46389291|CANCELLED by 0|node1|2026-11-22T23:16:13|2026-11-22T23:16:20\n"
                                "46389294|TIMEOUT|node2|2026-11-22T23:16:13|2026-11-22T23:26:13\n", "")
    assert [c.status for c in state.cells] == [CellStatus.cancelled] * 2
    assert "cancelled outside the launcher (by root (uid 0): scancel)" in state.cells[0].error
    assert "time limit (cluster.timeout_min=60)" in state.cells[1].error
    assert [c.failure_class for c in state.cells] == [None, None]


def test_a_planned_cell_whose_submitter_is_gone_is_not_planned_for_good(tmp_path):
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="slurm", argv=[], cells=[_cell(0)],
                       submitter=f"{socket.gethostname()}:999999999")
    state.cell_dir(state.cells[0]).mkdir(parents=True)
    reconcile.refresh(state)
    assert state.cells[0].status is CellStatus.cancelled and "never submitted" in state.cells[0].error


SINFO_NODES = """\
node1|debug*|2|4000|(null)|(null)|idle
node2|debug*|2|4000|(null)|(null)|idle
node3|debug*|2|4000|(null)|(null)|idle
node4|debug*|2|4000|(null)|(null)|idle
gpu1|gpu|64|512000|gpu:h100:8(S:0-1)|ib,nvme|mixed
gpu2|gpu|64|256000|gpu:h100:8(S:0-1)|ib|idle
"""


def _planned(*overrides):
    from launcher.plan import grid, planner

    points, swept = grid.expand(["model=gpt_tiny", "runs=1", "cluster=slurm", *overrides], False)
    return planner.plan(grid.compose(points, swept))[0]


def test_requests_are_checked_against_the_nodes_before_sbatch():
    from launcher.cluster.slurm.resources import check_capacity, parse_nodes

    nodes = parse_nodes(SINFO_NODES)
    assert nodes["gpu1"].gpu_count("h100") == 8 and nodes["gpu1"].features == {"ib", "nvme"}
    assert check_capacity(_planned("cluster.mem_gb=3"), "debug", nodes) == []
    [err] = check_capacity(_planned("cluster.mem_gb=100"), "debug", nodes)
    assert "102400 MB of memory per node (cluster.mem_gb=100)" in err and "4000 MB" in err and "Fix:" in err
    [err] = check_capacity(_planned("nodes=2", 'cluster.exclude="node[2-4]"'), "debug", nodes)
    assert "only 1 of the 4 node(s)" in err and "nodes<=1" in err
    [err] = check_capacity(_planned("cluster.tasks_per_node=3"), "debug", nodes)
    assert "3 CPUs per node" in err and "2 CPUs" in err
    [err] = check_capacity(_planned("nodes=2", 'cluster.nodelist="node[1-3]"'), "debug", nodes)
    assert "names 3 nodes" in err
    assert check_capacity(_planned("nodes=2", 'cluster.nodelist="node[1-2]"'), "debug", nodes) == []
    [err] = check_capacity(_planned("nodes=2", "cluster.constraint=nvme", "cluster.partition=gpu"), "gpu", nodes)
    assert "only 1 of the 2 node(s)" in err and "cluster.constraint=nvme" in err


def test_accounts_and_qos_from_sacctmgr_and_the_enforcement_setting():
    from launcher.cluster.slurm.resources import parse_associations, parse_enforce

    assert parse_enforce("AccountingStorageEnforce = none\nClusterName = localcluster\n") == set()
    assert parse_enforce("AccountingStorageEnforce = limits,qos\n") == {"limits", "qos", "associations"}
    assert parse_associations("root|normal\n") == ({"root"}, {"normal"})
    assert parse_associations("proj1|normal,high\nproj2|normal\n") == ({"proj1", "proj2"}, {"normal", "high"})


def test_series_labels_show_every_value_they_group():
    from launcher.report.rows import grouped, series_labels

    rows = [{"cell": f"strategy=ddp cluster.timeout_min={t} nodes=1", "series": "s", "model": "m", "world_size": 1,
             "strategy": "ddp", "nodes": 1, "status": "done", "throughput_samples_per_s": 10.0 + t,
             "settings": {"strategy": "ddp", "cluster.timeout_min": str(t), "nodes": "1"}} for t in (5, 7)]
    assert series_labels(rows) == {"s": "strategy=ddp cluster.timeout_min=5,7"}
    assert grouped(rows)[0]["cell"].startswith("strategy=ddp cluster.timeout_min=5,7 nodes=1")


def test_a_cancelled_cell_keeps_its_numbers_out_of_every_mean():
    from launcher.report.rows import grouped, throughput

    rows = [{"cell": f"strategy=ddp seed={s}", "series": "s", "model": "m", "world_size": 1, "strategy": "ddp",
             "nodes": 1, "status": st, "throughput_samples_per_s": tp, "settings": {"seed": str(s)}}
            for s, st, tp in ((1, "done", 10.0), (2, "done", 12.0), (3, "cancelled", 50.0))]
    assert throughput(rows[2]) is None
    [row] = grouped(rows)
    assert row["throughput_samples_per_s"] == 11.0 and row["runs"] == 2 and row["runs_planned"] == 3


def test_resource_checks_resolve_without_changing_the_cell():
    """A GPU cell that leaves its cores, memory and GPU memory open gets its partition's share of each,
    as a Resolved value: the check changes nothing, the caller applies it (launcher/preflight.py)."""
    from launcher.cluster.base import ResourceCheck
    from launcher.cluster.slurm.resources import as_resolved, parse_sinfo, resolve

    (part,) = parse_sinfo("gpu*|2|1:00:00|64|512000|gpu:h100:8(S:0-1)\n").values()
    cell = Cell(index=3, name="c3", dirname="03", overrides=[], strategy="ddp", precision="bf16", model="gpt_tiny",
                cluster=SlurmSettings(gpus_per_node=8, tasks_per_node=8), layout=Layout(tasks_per_node=8, gpus_per_node=8))
    before = (cell.layout.cpus_per_task, cell.cluster.mem_gb, cell.cluster.gpu_mem_gib)
    resolved = resolve(cell, part)
    assert (resolved.cpus_per_task, resolved.mem_gb, resolved.gpu_mem_gib) == (8, 500.0, 79.6)
    assert as_resolved(cell, resolved).layout.cpus_per_task == 8
    assert (cell.layout.cpus_per_task, cell.cluster.mem_gb, cell.cluster.gpu_mem_gib) == before  # untouched
    ResourceCheck(resolved={3: resolved}).apply([cell])
    assert (cell.layout.cpus_per_task, cell.cluster.mem_gb, cell.cluster.gpu_mem_gib) == (8, 500.0, 79.6)
    # What the cell gave itself stays: only settings left open are resolved.
    own = Cell(index=4, name="c4", dirname="04", overrides=[], strategy="ddp", precision="bf16", model="gpt_tiny",
               cluster=SlurmSettings(gpus_per_node=8, tasks_per_node=8, cpus_per_task=2, mem_gb=64, gpu_mem_gib=40),
               layout=Layout(tasks_per_node=8, gpus_per_node=8, cpus_per_task=2))
    assert resolve(own, part) == type(resolved)()


def test_a_slurm_cells_reproduce_sh_runs_its_ranks_under_srun_translated(tmp_path):
    """reproduce.sh on Slurm: one task per rank in an allocation of the cell's shape, each translating
    Slurm's variables before python -m jobs (launcher/cluster/slurm/ranks.py)."""
    from launcher.cluster.base import write_reproduce
    from launcher.cluster.slurm.backend import SlurmBackend

    cell = _planned("nodes=2", "cluster.tasks_per_node=2", "cluster.cpus_per_task=3")
    launch = SlurmBackend().rank_launch(cell)
    assert launch.startswith("srun --nodes=2 --ntasks-per-node=2 --cpus-per-task=3 ")
    assert launch.endswith(" -m launcher.cluster.slurm.ranks")
    text = write_reproduce(tmp_path, launch).read_text()
    assert f'exec {launch} "$cell/spec.json" --out "$out"' in text and 'out="${1:-$cell/reproduced}"' in text
