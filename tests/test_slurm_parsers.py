"""Slurm's command output, parsed without a cluster: literal lines as sinfo, sacct, squeue and
scontrol printed them on the test cluster (slurm-wlm 22.05), plus the sbatch parameters that
containers need."""

import time

import pytest

from jobs.spec import Layout
from launcher import status
from launcher.interference import Allocation, overlaps
from launcher.schema import ClusterConfig, ContainerConfig, ContainerRuntime
from launcher.slurm import expand_array_ids, parse_max_array_size, parse_sacct_times, parse_states
from launcher.state import CellState, CellStatus, SweepState, slurm_status
from launcher.submit import group_key, groups, python_command, slurm_parameters

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
    return CellState(index=index, name=f"c{index}", dirname=f"{index:02d}", overrides=[], strategy="ddp",
                     precision="fp32", model="gpt_tiny", cluster=ClusterConfig(**cluster), layout=Layout())


def test_cells_group_only_when_every_sbatch_parameter_matches_and_arrays_are_split():
    cells = [_cell(0, timeout_min=5), _cell(1, timeout_min=7), _cell(2, timeout_min=5), _cell(3, timeout_min=5),
             _cell(4, timeout_min=5, setup=["module load cuda"])]
    assert group_key(cells[0]) == group_key(cells[2]) != group_key(cells[1])
    assert [[c.index for c in g] for g in groups(cells, None)] == [[0, 2, 3], [1], [4]]
    assert [[c.index for c in g] for g in groups(cells, 2)] == [[0, 2], [3], [1], [4]]


def test_container_parameters_for_pyxis_and_apptainer():
    pyxis = ClusterConfig(container=ContainerConfig(runtime=ContainerRuntime.pyxis, image="nvcr.io#nvidia/pytorch:24.05-py3",
                                                    mounts=["/data:/data"]), gpus_per_node=8, tasks_per_node=8)
    params = slurm_parameters(pyxis, Layout(nodes=2, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12), "s")
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in params["srun_args"]
    assert "--container-mounts=/data:/data" in params["srun_args"]
    assert params["gpus_per_node"] == 8 and params["exclusive"] is True and params["nodes"] == 2
    assert python_command(pyxis) == "python"
    apptainer = ClusterConfig(container=ContainerConfig(runtime=ContainerRuntime.apptainer, image="/img/bench.sif",
                                                        mounts=["/scratch"]), gpus_per_node=4)
    assert python_command(apptainer) == "apptainer exec --nv --bind /scratch /img/bench.sif python"
    assert "exclusive" not in slurm_parameters(ClusterConfig(exclusive=False), Layout(), "s")


def test_a_job_unknown_to_queue_and_accounting_becomes_lost_after_a_grace_period(tmp_path):
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="slurm", argv=[], cells=[_cell(0), _cell(1)])
    for cell, age_s in zip(state.cells, (5.0, status.LOST_AFTER_S + 5), strict=True):
        cell.job_id, cell.status, cell.submitted_at = "99", CellStatus.pending, time.time() - age_s
    assert status._settle(state, state.cells[0], None) is CellStatus.pending  # accounting may lag
    assert status._settle(state, state.cells[1], None) is CellStatus.lost


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
    state.save()
    again = SweepState.load(tmp_path)
    assert again == state and again.cells[0].status is CellStatus.failed
    assert again.cells[0].cluster.setup == ["module load x"] and not list(tmp_path.glob("*.pkl"))


def test_foreign_use_is_judged_only_over_a_long_enough_window():
    from launcher.interference import foreign_use

    busy = {"foreign_cpu_share": 0.4, "measured_steps": 100, "step_time_ms_p50": 50.0}  # a 5 s window
    assert foreign_use(busy) == "other processes used 40% of its cores during the measured window"
    assert foreign_use({**busy, "step_time_ms_p50": 5.0}) is None  # 0.5 s: start-up blips, 10 ms ticks
    assert foreign_use({**busy, "foreign_cpu_share": 0.05}) is None
    assert "its GPUs" in foreign_use({**busy, "foreign_gpu_share": 0.3})
