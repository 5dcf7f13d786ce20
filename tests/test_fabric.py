"""The fabric probe (jobs/fabric.py, launcher/probe.py, launcher/forecast/fabric.py): nccl-tests'
figures and the fit on literal numbers, the cores a rank has from literal /proc and cgroup files,
literal sinfo output, 4 real gloo ranks as 2 emulated nodes, and a kept record reused without a
probe job. A whole local sweep with its probe on 2 ranks (report, MLflow, the kept record) is
tests/test_local_e2e.py's parity sweep; on Slurm, tests/test_slurm.py's nodes sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract import fabric as figures
from contract.spec import Layout
from jobs import fabric
from launcher.forecast import fabric as kept_fabric
from tests.conftest import FAST
from tests.ranks import run_ranks

# ---- nccl-tests' figures and the fit, on literal numbers ----------------------------------------


def test_bus_factors_are_nccl_tests():
    """doc/PERFORMANCE.md's "Summary": all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n."""
    assert figures.bus_factor("all_reduce", 8) == 1.75 and figures.bus_factor("all_reduce", 2) == 1.0
    assert figures.bus_factor("all_gather", 8) == 0.875 and figures.bus_factor("reduce_scatter", 4) == 0.75


def test_a_line_of_the_table():
    # 128 MiB all-reduced by 8 ranks in 1 ms: algbw 134.2 GB/s (GB = 1e9), busbw 1.75x that.
    line = figures.point("all_reduce", "inter_node", 8, 134217728, 0.001)
    assert line["algbw_gb_per_s"] == pytest.approx(134.217728) and line["busbw_gb_per_s"] == pytest.approx(234.881024)
    assert line["time_us"] == pytest.approx(1000.0) and line["count"] == 33554432
    # The whole array of an all-gather is a multiple of the ranks: 1 KiB over 3 ranks is 85 floats each.
    assert figures.whole_count(1024, 3) == 255 and figures.whole_count(4, 8) == 8


def test_the_fit_recovers_latency_and_bandwidth():
    # t = 20 us + S x 1.5 / 100 GB/s (all-reduce over 4 ranks), exact.
    points = [(s, 20e-6 + s * 1.5 / 100e9) for s in figures.sizes(1024, 64 * 1024**2, 4)]
    found = figures.fit("all_reduce", 4, points)
    assert found.latency_us == pytest.approx(20.0, rel=1e-6)
    assert found.bandwidth_gb_per_s == pytest.approx(100.0, rel=1e-6) and found.fit_error < 1e-9
    # A point 30% off moves the fit and shows in its error.
    noisy = figures.fit("all_reduce", 4, [*points[:3], (points[3][0], points[3][1] * 1.3), *points[4:]])
    assert 0.05 < noisy.fit_error < 0.3


def test_the_fit_keeps_latency_non_negative_and_says_when_size_does_not_matter():
    # Times whose line would cross zero below the smallest size: a negative intercept, so alpha = 0 and
    # beta = sum(r^2) / sum(r) with r = bus bytes / time (the 1/t^2-weighted slope through the origin):
    # r = 5e8, 4.545e8, 4.878e8 B/s -> 0.4816 GB/s.
    found = figures.fit("all_gather", 2, [(1000, 1e-6), (2000, 2.2e-6), (4000, 4.1e-6)])
    assert found.latency_us == 0.0 and found.bandwidth_gb_per_s == pytest.approx(0.48155, rel=1e-3)
    flat = figures.fit("all_reduce", 2, [(1024, 50e-6), (4096, 50e-6), (16384, 50e-6)])
    assert flat.bandwidth_gb_per_s is None and flat.latency_us == pytest.approx(50.0)


def test_the_default_probe_is_small_and_the_full_one_covers_the_range():
    cpu_sizes, iters, _ = figures.plan(gpu=False, full=False)
    assert cpu_sizes[0] == 1024 and cpu_sizes[-1] == 4 * 1024**2 and len(cpu_sizes) == 7 and iters == 5
    assert figures.plan(gpu=False, full=True)[0][-1] == 64 * 1024**2
    assert figures.plan(gpu=True, full=False)[0][-1] == 256 * 1024**2
    assert figures.plan(gpu=True, full=True)[0][-1] >= 256 * 1024**2


# ---- the cores a rank really has ------------------------------------------------------------------

def test_cgroup_quotas_are_read_in_both_versions(tmp_path):
    assert fabric.parse_cpu_max("max 100000\n") is None and fabric.parse_cpu_max("150000 100000") == 1.5
    assert fabric.parse_cfs("-1\n", "100000\n") is None and fabric.parse_cfs("200000", "100000") == 2.0
    v1 = "4:memory:/process_api/c764\n3:cpuset:/\n1:cpu,cpuacct:/slurm/uid_0/job_12\n0::/\n"
    assert fabric.cgroup_paths(v1) == {"v1": "/slurm/uid_0/job_12", "v2": "/"}
    # v2: a quota above this process's cgroup limits it too; the smallest one holds.
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/job.scope\n")
    for folder, text in (("", "max 100000"), ("system.slice", "50000 100000"), ("system.slice/job.scope", "max 100000")):
        (tmp_path / "fs" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / folder / "cpu.max").write_text(text)
    assert fabric.cgroup_cpus(tmp_path / "fs", proc) == 0.5
    proc.write_text("1:cpu:/\n")  # v1 without a quota (this test machine's own files)
    (tmp_path / "fs" / "cpu").mkdir()
    (tmp_path / "fs" / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "fs" / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert fabric.cgroup_cpus(tmp_path / "fs", proc) is None


def _rank(rank, node, kernel, cpus, quota=None):
    return {"rank": rank, "node": node, "host": f"h{kernel}", "kernel": kernel, "cpus": cpus, "cgroup_cpus": quota,
            "threads": 1}


def test_emulated_nodes_sharing_cores_are_said():
    machines = fabric.cores_per_rank([_rank(r, r // 2, "k", [0, 1]) for r in range(4)])
    assert machines["k"]["cores_per_rank"] == 0.5 and machines["k"]["nodes"] == 2
    notes = fabric.distortions(machines, nodes=2)
    assert len(notes) == 2 and "emulated on one machine" in notes[0] and "0.5 core per rank" in notes[1]
    # Real nodes with a core per rank each: nothing to say. A cgroup quota below the affinity caps it.
    real = fabric.cores_per_rank([_rank(0, 0, "a", [0, 1, 2, 3], 4.0), _rank(1, 1, "b", [0, 1, 2, 3], 1.5)])
    assert real["b"]["cores_per_rank"] == 1.5 and fabric.distortions(real, nodes=2) == []


# ---- on Slurm: what names the nodes, and the cells after the probe ---------------------------------

def test_the_partitions_nodes_name_the_hardware_and_the_cells_start_after_the_probe(tmp_path):
    from launcher.cluster.slurm import submit
    from launcher.cluster.slurm.resources import describe_nodes, parse_nodes
    from launcher.cluster.slurm.settings import SlurmSettings

    text = ("node1|debug*|2|3900|(null)|(null)|idle\nnode2|debug*|2|3900|(null)|(null)|allocated\n"
            "gpu1|gpu|64|512000|gpu:h100:8(S:0-1)|ib|mixed\n")
    nodes = parse_nodes(text)
    # The nodes' state is left out: a busy node is the same hardware.
    assert describe_nodes(nodes, {"debug"}) == "node1 2 CPUs 3900 MB no GPUs; node2 2 CPUs 3900 MB no GPUs"
    assert describe_nodes(nodes, {"gpu"}) == "gpu1 64 CPUs 512000 MB h100:8"
    # sbatch --dependency: the probe's job, beside a dependency of the site's own.
    cluster = SlurmSettings(additional_parameters={"dependency": "afterok:7"})
    executor = submit.slurm_executor(tmp_path, cluster, Layout(nodes=2), "s", after=["12", "13"])
    assert executor.parameters["additional_parameters"]["dependency"] == "afterok:7,afterany:12:13"
    assert "dependency" not in submit.slurm_executor(tmp_path, SlurmSettings(), Layout(), "s"
                                                     ).parameters["additional_parameters"]


# ---- real gloo ranks ------------------------------------------------------------------------------

def test_four_gloo_ranks_as_two_nodes_report_both_scopes(tmp_path):
    spec = fabric.ProbeSpec(out_dir=str(tmp_path), layout=Layout(nodes=2, tasks_per_node=2, cpus_per_task=1),
                            sizes_bytes=[1024, 64 * 1024], iters=2, warmup_iters=1, collective_timeout_s=60)
    results = run_ranks(spec, 4, nodes=2, entry="jobs.fabric")
    assert all("error" not in r for r in results), results
    result = results[0]
    assert json.loads((tmp_path / fabric.RESULT_FILE).read_text()) == json.loads(json.dumps(result))
    seen = {(p["scope"], p["collective"], p["size_bytes"]) for p in result["points"]}
    assert seen == {(s, c, b) for s in fabric.SCOPES for c in fabric.COLLECTIVES for b in (1024, 64 * 1024)}
    for p in result["points"]:
        assert p["ranks"] == (2 if p["scope"] == "intra_node" else 4) and p["time_us"] > 0
        assert p["algbw_gb_per_s"] == pytest.approx(p["size_bytes"] / (p["time_us"] / 1e6) / 1e9)
        assert p["busbw_gb_per_s"] == pytest.approx(p["algbw_gb_per_s"] * figures.bus_factor(p["collective"], p["ranks"]))
    assert {(f["scope"], f["collective"]) for f in result["fits"]} == {(s, c) for s in fabric.SCOPES
                                                                      for c in fabric.COLLECTIVES}
    assert [c["rank"] for c in result["cores"]] == [0, 1, 2, 3] and all(c["cpus"] for c in result["cores"])
    assert any("emulated on one machine" in n for n in result["distortions"])  # 2 nodes, one machine
    assert 0 < result["probe_s"] < result["job_s"]


def test_a_kept_record_of_the_same_nodes_and_software_is_reused(tmp_path, capsys):
    """Planned cells meet a record kept for their cluster, shape, nodes and software: it is copied into
    the sweep and no probe job starts; a record of other software does not stand for them."""
    from launcher import probe
    from launcher.cluster.backends import backend_for
    from launcher.plan import grid, planner
    from launcher.sweep import prepare

    points, swept = grid.expand([*FAST, "fabric.probe=auto", "nodes=2", f"output_root={tmp_path}"], True)
    cells = planner.plan(grid.compose(points, swept))
    state = prepare(cells, ["test"])
    backend, cell = backend_for("local"), cells[0]
    wanted = kept_fabric.identity(backend.noise_floor_key(cell.cluster), cell.layout, backend.nodes_fingerprint([cell]),
                                  cell.cluster)
    result = {"shape": {"nodes": 2, "tasks_per_node": 1}, "fits": [], "points": [], "measured_at": "2026-01-02T03:04:05",
              "probe_s": 0.5, "job_s": 4.0, "cores_per_rank": 1.0}
    kept_fabric.keep(tmp_path, kept_fabric.Probed(tmp_path / "earlier", {"identity": wanted}, result), "earlier")
    other = {**wanted, "software": {**wanted["software"], "torch": "0.0"}}
    assert kept_fabric.kept(tmp_path, other) is None and kept_fabric.kept(tmp_path, wanted)["sweep"] == "earlier"
    assert probe.before_cells(state, state.cells, cells[0].config) == []
    assert "kept from sweep earlier (2026-01-02)" in capsys.readouterr().out
    (copied,) = kept_fabric.read_sweep(state.path)
    assert copied.result == result and copied.source.startswith("kept from sweep earlier")
    assert not (state.path / "submitit").exists()  # no job was submitted


def test_the_probes_fits_become_the_performance_models_links_the_largest_shape_winning():
    from launcher.forecast import perfmodel

    def probed(nodes, tasks, fits):
        result = {"shape": {"nodes": nodes, "tasks_per_node": tasks}, "fits": fits, "measured_at": "t"}
        return kept_fabric.Probed(Path(f"{nodes}x{tasks}"), {"identity": {"shape": f"{nodes}x{tasks}"}, "job_id": "7"},
                                  result)

    small = probed(1, 2, [{"collective": "all_reduce", "scope": "intra_node", "latency_us": 80.0,
                           "bandwidth_gb_per_s": 0.5}])
    large = probed(2, 2, [{"collective": "all_reduce", "scope": "intra_node", "latency_us": 120.0,
                           "bandwidth_gb_per_s": 1.25},
                          {"collective": "all_gather", "scope": "inter_node", "latency_us": 300.0,
                           "bandwidth_gb_per_s": None}])
    links = kept_fabric.model_fabric([large, small])
    assert links.link("all_reduce", perfmodel.INTRA) == perfmodel.Link(0.12, 1.25e6)  # 2x2 over 1x2
    assert links.link("all_reduce", perfmodel.INTER) == perfmodel.Link(0.12, 1.25e6)  # no inter figure: intra's
    assert links.link("all_gather", perfmodel.INTER).bytes_per_ms == float("inf")  # size did not matter
    assert links.link("reduce_scatter", perfmodel.INTRA) is None and "1x2, 2x2" in links.source
    # 4 MB all-reduced over 4 ranks in 2 calls: 2 x 0.12 ms + 4e6 x 2(3)/4 / 1.25e6 ms.
    moved = perfmodel.Collective("all_reduce", 4e6, 4, perfmodel.INTRA, calls_per_step=2)
    assert links.ms([moved]) == pytest.approx(2 * 0.12 + 4e6 * 1.5 / 1.25e6)
    assert kept_fabric.model_fabric([probed(1, 2, [])]) is None


def test_nodes_the_probe_found_on_one_machine_share_its_cores_at_every_shape(tmp_path):
    from launcher.forecast import inputs
    from tests.ranks import make_spec

    def probed(nodes, machines):
        result = {"shape": {"nodes": nodes, "tasks_per_node": 1}, "fits": [], "machines": machines}
        return kept_fabric.Probed(Path(f"{nodes}x1"), {"identity": {"shape": f"{nodes}x1"}}, result)

    # As the Slurm test cluster's probe of 3 nodes wrote it: node1..node3 on one boot id, 2 CPUs.
    one = {"7fff": {"cgroup_cpus": None, "cpus": 2.0, "hosts": ["node1", "node2", "node3"], "nodes": 3, "ranks": 3,
                    "threads_per_rank": 1}}
    two = {"a": {**one["7fff"], "hosts": ["n1"], "cgroup_cpus": 1.5}, "b": {**one["7fff"], "hosts": ["n2"]}}
    assert kept_fabric.one_machine_cpus([probed(3, one)]) == 2.0
    assert kept_fabric.one_machine_cpus([probed(3, one), probed(2, two)]) is None  # real nodes somewhere
    assert kept_fabric.one_machine_cpus([probed(1, one)]) is None  # one node tells nothing about nodes
    spec = make_spec(tmp_path, nodes=8, world_size=8)
    assert not spec.emulate_nodes and spec.layout.world_size == 8
    assert inputs.cores_per_rank(spec, cpus=64.0, one_machine_cpus=2.0) == 0.25  # 8 ranks on 2 CPUs
    assert inputs.cores_per_rank(spec, cpus=64.0) == 1.0
