"""Composition of every config group and override; validation errors that name the fix."""

import pytest

from contract.spec import InputKind, Precision, Sharding, Strategy
from launcher.__main__ import main
from launcher.cluster.slurm import submit
from launcher.plan.grid import CONF_DIR, SweepError, compose, expand, search_path
from launcher.plan.planner import plan

GROUPS = {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in CONF_DIR.iterdir() if g.is_dir()}
# Options that need more than their own file to be valid (refused on CPU, or need a node count).
NEEDS = {
    ("strategy", "hsdp"): ["nodes=2", "cluster.tasks_per_node=2"],
    ("strategy", "fsdp_offload"): ["cluster=slurm", "cluster.gpus_per_node=1"],
    ("precision", "fp16"): ["cluster=slurm", "cluster.gpus_per_node=1"],
    ("model", "custom"): ["model.target=torch.nn.Linear"],
}


def one(*overrides):
    points, swept = expand(list(overrides), multirun=False)
    return compose(points, swept)[0].config


# Options that read files; tests/test_data.py composes them with real files.
FILE_BACKED = {("data", "token_file"), ("data", "image_folder")}


@pytest.mark.parametrize("group, option", [(g, o) for g, opts in GROUPS.items() for o in opts
                                           if g != "experiment" and (g, o) not in FILE_BACKED])
def test_every_group_option_composes(group, option):
    cfg = one(f"{group}={option}", *NEEDS.get((group, option), []))
    assert getattr(cfg, group) is not None


def test_defaults_and_overrides_are_typed():
    cfg = one()
    assert cfg.strategy.name is Strategy.ddp and cfg.precision.name is Precision.fp32
    assert cfg.model.input is InputKind.tokens and cfg.cluster.name == "local"
    cfg = one("strategy=zero2", "nodes=3", "batch_size=4", "model.seq_len=64", "strategy.bucket_cap_mb=50",
              "precision=bf16", "cluster.tasks_per_node=2")
    assert cfg.strategy.sharding is Sharding.grad_op and cfg.nodes == 3 and cfg.batch_size == 4
    assert cfg.model.seq_len == 64 and cfg.precision.name is Precision.bf16 and cfg.cluster.tasks_per_node == 2


def test_grid_expansion_and_resources_per_point():
    points, swept = expand(["strategy=ddp,fsdp", "nodes=1,2", "cluster=slurm", "cluster.tasks_per_node=2", "runs=1"],
                           multirun=True)
    cells = plan(compose(points, swept))
    assert [c.name for c in cells] == ["strategy=ddp nodes=1", "strategy=ddp nodes=2",
                                       "strategy=fsdp nodes=1", "strategy=fsdp nodes=2"]
    assert [c.layout.world_size for c in cells] == [2, 4, 2, 4]
    # two resource shapes -> two job arrays on Slurm
    assert len(submit.groups(cells, None)) == 2


def test_one_record_per_cell_from_planning_to_the_sweep_document(tmp_path):
    """The cell planning makes is the cell the sweep document keeps and tracks: no conversion, every
    planned field read back equal, and only the whole resolved config left out of sweep.json (its
    spec.json keeps it); a cell read back says so when asked for it."""
    import json

    from launcher.plan.cell import Cell, NotPlannedHere
    from launcher.state import STATE_FILE, SweepState

    points, swept = expand(["strategy=ddp,fsdp", "nodes=1,2", "cluster.tasks_per_node=2", "runs=1"], multirun=True)
    cells = plan(compose(points, swept))
    assert all(type(c) is Cell and c.cluster is c.config.cluster for c in cells)
    (tmp_path / "cells").mkdir()
    state = SweepState(name="s", sweep_dir=str(tmp_path), cluster="local", argv=[], cells=cells)
    state.save()
    assert "resolved" not in json.loads((tmp_path / STATE_FILE).read_text())["cells"][0]
    back = SweepState.load(tmp_path).cells
    assert back == cells and [c.strategy for c in back] == ["ddp", "ddp", "fsdp", "fsdp"]
    assert [c.layout.world_size for c in back] == [2, 4, 2, 4] and back[3].cluster == cells[3].cluster
    with pytest.raises(NotPlannedHere, match="spec.json"):
        back[0].config  # noqa: B018 - the property is what raises


def test_runs_are_independent_launches_interleaved_over_the_sweep():
    """runs=3 (the default): every grid point three times, run 1 of every point first, so a drift of
    the machine reaches every configuration alike; on Slurm the runs of one resource shape are
    separate tasks of one array (their own placement), each with its own directory."""
    points, swept = expand(["strategy=ddp,fsdp", "cluster=slurm"], multirun=True)
    cells = plan(compose(points, swept))
    assert [c.name for c in cells] == [f"strategy={s} run={r}" for r in (1, 2, 3) for s in ("ddp", "fsdp")]
    assert [c.run for c in cells] == [1, 1, 2, 2, 3, 3] and len({c.dirname for c in cells}) == 6
    assert cells[0].config == cells[2].config == cells[4].config  # the same configuration, launched 3 times
    (group,) = submit.groups(cells, None)
    assert len(group) == 6 and [c.run for c in cells] == [1, 1, 2, 2, 3, 3]
    with pytest.raises(SweepError, match="runs"):
        plan(compose(*expand(["strategy=ddp,ddp"], multirun=True)))
    with pytest.raises(SweepError, match="runs=3"):
        compose(*expand(["runs=0"], multirun=False))


# Bad input: the corpus lives in tests/test_bad_input.py.


def test_sweep_without_multirun_is_refused():
    with pytest.raises(SweepError, match="add -m"):
        expand(["strategy=ddp,fsdp"], multirun=False)


def test_duplicate_points_are_refused():
    points, swept = expand(["nodes=1,1"], multirun=True)
    with pytest.raises(SweepError, match="run twice"):
        plan(compose(points, swept))


def test_help_lists_groups(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "strategy" in out and "zero2" in out and "gpt2-small" in out


FAST_PATH_CASES = [
    ["seed=3"], ["lr=0.5", "nodes=2"], ["strategy=fsdp", "strategy.sharding=grad_op", "strategy.prefetch=2"],
    ["cluster=slurm", "cluster.partition=gpu", "cluster.timeout_min=7", "cluster.mem_gb=3"],
    ["model.params.n_layer=3", "wait=true", "cluster.cpus_per_task=null"], ["optimizer=sgd", "lr_scaling=sqrt"],
    ["tracking.uri=sqlite:////tmp/x/mlflow.db", "precision=bf16", "precision.mode=params", "strategy=fsdp"],
]


@pytest.mark.parametrize("overrides", FAST_PATH_CASES, ids=[" ".join(c) for c in FAST_PATH_CASES])
def test_value_overrides_set_directly_give_hydras_own_config(overrides, monkeypatch):
    import launcher.plan.grid

    fast = compose([overrides], [])[0].config
    monkeypatch.setattr(launcher.plan.grid, "_fast_apply", lambda base, parsed: None)
    assert compose([overrides], [])[0].config == fast


def test_a_thousand_point_grid_composes_each_point_as_asked():
    # (bench/thousand.py times it: about a second for 1000 points)
    cells = plan(compose(*expand(["seed=range(0,250)", "strategy=ddp,fsdp", "nodes=1,2", "runs=1"], multirun=True)))
    assert len(cells) == 1000 and len({c.config.seed for c in cells}) == 250
    assert {(c.config.strategy.label, c.layout.nodes) for c in cells} == {("ddp", 1), ("ddp", 2), ("fsdp", 1),
                                                                           ("fsdp", 2)}


def test_plan_prints_cells_resources_and_predicted_state_and_creates_nothing(tmp_path, capsys):
    out_root = tmp_path / "out"
    assert main(["--plan", "-m", "+experiment=resnet50_ddp_vs_fsdp_cpu", f"output_root={out_root}"]) == 0
    out = capsys.readouterr().out
    assert "12 cell(s)" in out and "23,712,932" in out  # 4 points x 3 runs; ResNet-50 with 100 classes, meta build
    rows: dict[str, str] = {}
    for line in out.splitlines():  # the cells' table comes first (the traffic table names the cells again)
        if line.startswith("| ") and "strategy=" in line:
            rows.setdefault(line.split("|")[2].strip(), line)
    assert "90.46 MiB" in rows["strategy=ddp precision=fp32 run=1"]  # every parameter on every rank
    assert "45.23 MiB" in rows["strategy=fsdp precision=fp32 run=3"]  # half of them on each of 2 ranks
    assert "one after another" in out
    assert not out_root.exists()


def test_named_experiments_compose_with_their_grids():
    for name, cells in (("resnet50_ddp_vs_fsdp_cpu", 4), ("gpt2_strategies_cpu", 6), ("scaling_cpu", 4),
                        ("resnet50_ddp_vs_fsdp", 4), ("gpt2_strategies", 6), ("scaling", 8)):
        planned = plan(compose(*expand([f"+experiment={name}", "runs=1"], multirun=True)))
        assert len(planned) == cells, name
    # a command-line value of the experiment's grid key wins
    planned = plan(compose(*expand(["+experiment=scaling_cpu", "nodes=2"], multirun=True)))
    assert {c.layout.nodes for c in planned} == {2}


def test_a_site_config_dir_adds_its_own_cluster_and_experiment(tmp_path):
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mysite.yaml").write_text("name: local\ntasks_per_node: 2\ntimeout_min: 9\n")
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "nightly.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /cluster: mysite\nsteps: 22\n"
        "hydra:\n  sweeper:\n    params:\n      seed: 1,2,3\n")
    extra = search_path([tmp_path])
    planned = plan(compose(*expand(["+experiment=nightly", "runs=1"], True, extra), extra=extra))
    assert [c.config.seed for c in planned] == [1, 2, 3]
    assert {(c.config.cluster.timeout_min, c.layout.tasks_per_node, c.config.steps) for c in planned} == {(9, 2, 22)}


SITE_SETTINGS = '''
from dataclasses import dataclass, field

from launcher.plan.clusterschema import ClusterConfig, shell


@dataclass
class KubeSettings(ClusterConfig):
    name: str = "kube"
    namespace: str = field(default="bench", metadata=shell("plain"))
'''
# A pod runner rehearsed on this machine: the backend starts each cell's and each probe's ranks itself,
# from their spec files, with the one-machine helpers (launcher/cluster/processes.py), through what its
# pods would run (pod.py: torchrun over ``python -m jobs FILE``).
SITE_BACKEND = '''
from pathlib import Path

from launcher.cluster import processes
from launcher.cluster.base import Wording
from launcher.cluster.onemachine import OneMachineBackend


def pod(cluster, ranks):
    """The command before a spec file: a pod of ``ranks`` ranks (kube_site/pod.py), here on this machine."""
    return f"{cluster.python_command()} -m kube_site.pod {ranks}"


class KubeBackend(OneMachineBackend):
    name = "kube"
    words = Wording(where="in its pods", scheduler="the pod runner", submitter="the pod runner")

    def rank_launch(self, cell):
        return pod(cell.cluster, cell.world_size)

    def _start(self, state, cells, after_each_cell, interrupts, after):
        processes.run_cells(state, cells, self.rank_launch, after_each_cell, interrupts)

    def start_probe(self, state, cell, spec):
        return processes.run_probe(Path(spec.out_dir), cell.cluster, pod(cell.cluster, cell.world_size), spec)

    def describe_submission(self, cells, folder, max_array_size):
        return [f"kube: {len(cells)} job(s) in namespace {cells[0].cluster.namespace}"]
'''
SITE_POD = '''
"""What a pod runs: ``python -m kube_site.pod RANKS FILE [ARGS]``, the spec file it was given
recorded beside it (pod.json), then FILE's ranks under torchrun, each ``python -m jobs FILE``."""
import json
import os
import sys
from pathlib import Path

ranks, spec_file, *rest = sys.argv[1:]
Path(spec_file).with_name("pod.json").write_text(json.dumps({"spec_file": spec_file, "ranks": int(ranks)}))
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                          "--nproc-per-node", ranks, "-m", "jobs", spec_file, *rest])
'''
SITE_RUN = ["model=gpt_tiny", "model.seq_len=32", "model.vocab_size=256", "batch_size=4", "steps=4", "warmup_steps=2",
            "repeats=1", "runs=1", "nodes=1", "cluster.tasks_per_node=2", "tracking.enabled=false", "fabric.probe=always"]


@pytest.mark.slow
def test_a_sites_backend_is_its_package_an_entry_point_and_its_conf_file(tmp_path):
    """The rehearsal of a new backend, done for real outside the repository: a package with its
    settings (its own key, shell-checked), its backend and what its pods run, found through the entry
    point group, and its conf file in a site's config directory. No file of the project is edited: the
    schema reads its keys, refuses another backend's (Slurm's account and partition), --plan runs
    through it, and a sweep runs its fabric probe and its cell from their spec files through it."""
    import json
    import os
    import subprocess
    import sys

    from contract import programs
    from launcher.cluster.registry import ENTRY_POINT_GROUP

    site = tmp_path / "site"
    (site / "kube_site").mkdir(parents=True)
    (site / "kube_site" / "__init__.py").write_text("")
    (site / "kube_site" / "settings.py").write_text(SITE_SETTINGS)
    (site / "kube_site" / "backend.py").write_text(SITE_BACKEND)
    (site / "kube_site" / "pod.py").write_text(SITE_POD)
    meta = site / "kube_site-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: kube-site\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nkube = kube_site\n")
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "kube.yaml").write_text("defaults:\n  - kube_schema\n  - _self_\nname: kube\n"
                                                            "namespace: team-a\n")
    # the site's package beside this checkout's (the ranks, started by the pods, inherit it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def launcher(*args: str, out: str = "out") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher", "--config-dir", str(tmp_path / "conf"), "cluster=kube",
                               f"output_root={tmp_path / out}", *args], capture_output=True, text=True, env=env,
                              timeout=300)

    planned = launcher("--plan", "cluster.namespace=team-b")
    assert planned.returncode == 0, planned.stderr
    assert "kube: 3 job(s) in namespace team-b" in planned.stdout  # the default 3 runs
    wrong = launcher("--plan", "cluster.account=x")
    assert wrong.returncode == 2 and "cluster.account is read only by cluster=slurm" in wrong.stderr, wrong.stderr
    nodes = launcher("--plan", "cluster.partition=gpu")  # Slurm's placement keys are Slurm's, not every backend's
    assert nodes.returncode == 2 and "cluster.partition is read only by cluster=slurm" in nodes.stderr, nodes.stderr
    hostile = launcher("--plan", "cluster.namespace='a;b'")
    assert hostile.returncode == 2 and "cluster.namespace" in hostile.stderr, hostile.stderr
    assert not (tmp_path / "out").exists()

    ran = launcher("-m", "strategy=ddp", *SITE_RUN, f"sweep_dir={tmp_path / 'sweep'}", out="runs")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    (cell_dir,) = (tmp_path / "sweep" / "cells").iterdir()
    (probe_dir,) = (tmp_path / "sweep" / "fabric").iterdir()
    assert json.loads((cell_dir / "result.json").read_text())["summary"]["world_size"] == 2
    assert json.loads((probe_dir / "fabric.json").read_text())["fits"]  # the probe's figures
    # what each pod was given: the cell's spec.json, the probe's spec file; no pickle anywhere
    assert json.loads((cell_dir / "pod.json").read_text()) == {"spec_file": str(cell_dir / "spec.json"), "ranks": 2}
    assert json.loads((probe_dir / "pod.json").read_text()) == {"spec_file": str(probe_dir / programs.SPEC_FILE),
                                                                "ranks": 2}
    assert json.loads((probe_dir / programs.SPEC_FILE).read_text())["program"] == "fabric"
    assert "-m kube_site.pod 2" in (cell_dir / "reproduce.sh").read_text()
    assert not list(tmp_path.rglob("*.pkl"))


def test_a_cells_cluster_settings_are_read_back_as_its_backends_class():
    """sweep.json keeps each cell's settings; they are read back as the class of the backend they
    name. A record from before settings were per backend (every backend's keys in one class) reads
    back while the keys it does not have hold their defaults, and is refused when one was set."""
    from contract.codec import from_plain, to_plain
    from launcher.cluster.slurm.settings import ContainerConfig, ContainerRuntime, SlurmSettings
    from launcher.plan.clusterschema import ClusterConfig, settings_class

    slurm = SlurmSettings(account="a", container=ContainerConfig(ContainerRuntime.pyxis, "img"), partition="gpu")
    assert from_plain(ClusterConfig, to_plain(slurm)) == slurm
    earlier = {**to_plain(SlurmSettings()), "name": "local"}
    assert type(from_plain(ClusterConfig, earlier)) is settings_class("local")
    with pytest.raises(ValueError, match="unknown field.*account"):
        from_plain(ClusterConfig, {**earlier, "account": "a"})
