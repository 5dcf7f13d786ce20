"""The newer commands refuse what they cannot honour, keep their records and say what happened:
exit codes, the words of an empty result, shared records kept aside when damaged, a relative store
made absolute once. The hostile-input corpus of these commands is at the end of this file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.records import read_keyed, update_keyed
from launcher.forecast import fabric
from launcher.plan.cell import CellStatus
from launcher.report import findings, noisefloor
from launcher.report.collect import collect
from launcher.state import SweepState
from launcher.track import tracking
from tests.test_compare import BASE, make_sweep


def test_every_cell_flagged_for_interference_is_said_as_such(tmp_path):
    flagged = {k: "other processes took 83% of the cores" for k in BASE}
    sweep = make_sweep(tmp_path, "a", BASE, flagged=flagged)
    text = findings.findings(collect(SweepState.load(sweep)))
    assert "No cell finished with a result" not in text and "No series was measured" not in text
    assert "Every configuration with a result was flagged for interference (4 of 4)" in text
    failed = make_sweep(tmp_path, "b", {})
    text = findings.findings(collect(SweepState.load(failed)))
    assert "No configuration has a result: every run ended without one (0/3 done, oom)." in text


def test_status_exit_codes_say_done_failed_or_undecided(tmp_path):
    from launcher.commands.status import exit_code

    state = SweepState.load(make_sweep(tmp_path, "a", BASE))
    assert exit_code(state) == 0
    state.cells[0].status = CellStatus.running
    assert exit_code(state) == 3
    state.cells[1].status = CellStatus.failed
    assert exit_code(state) == 1


def test_a_damaged_shared_record_is_kept_aside_named_and_never_overwritten(tmp_path, capsys):
    for name in (fabric.KEPT_FILE, noisefloor.FLOOR_FILE, noisefloor.DRIFT_FILE):
        cut = '{"slurm:gpu 2x8": {"identity": {"cluster": "slurm:gpu"'  # other clusters' records, cut short
        (tmp_path / name).write_text(cut)
        assert read_keyed(tmp_path / name) == {}  # a reader leaves it as it is, and names it
        err = capsys.readouterr().err
        assert (tmp_path / name).read_text() == cut and str(tmp_path / name) in err and "not overwritten" in err
        assert update_keyed(tmp_path / name, lambda r: {**r, "local:vm": {"x": 1}})  # an update keeps it aside
        (aside,) = tmp_path.glob(f"{name}.damaged-*")
        assert aside.read_text() == cut and aside.name in capsys.readouterr().err
        assert json.loads((tmp_path / name).read_text()) == {"local:vm": {"x": 1}}
        assert aside.read_text() == cut  # still there for a person to recover
        aside.unlink()


def test_a_relative_sqlite_store_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tracking.absolute_uri("sqlite:///outputs/x.db") == f"sqlite:///{tmp_path / 'outputs' / 'x.db'}"
    assert tracking.absolute_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert tracking.absolute_uri("http://host:5000") == "http://host:5000"


# ---- one shell-safety rule, and a walk over the schema so that no setting is missed ---------------

def _text_settings() -> list[str]:
    """Every key of the schema whose value can hold text: str, a list or dict of it, or Any."""
    from launcher.plan.schema import Config
    from launcher.plan.schemakeys import field_type, schema_keys

    found = []
    for key in schema_keys():  # every backend's cluster settings among them
        types: list = [Config]
        for part in key.split("."):
            classes = [v for t in types for v in (t.subtypes() if hasattr(t, "subtypes") else [t])]
            types = [t for t in (field_type(c, part) for c in classes) if t is not None]
        if any(word in repr(types) for word in ("str", "Any", "dict", "list")):
            found.append(key)
    return found


def test_every_text_setting_of_the_schema_is_said_to_reach_a_shell_or_not():
    from launcher.plan.clusterschema import ClusterConfig
    from launcher.plan.shellsafe import NOT_SHELL_BOUND, shell_bound

    SHELL_BOUND = shell_bound(*ClusterConfig.subtypes())
    found = _text_settings()
    unsaid = [k for k in found if k not in SHELL_BOUND and k not in NOT_SHELL_BOUND]
    assert not unsaid, f"say in launcher/plan/shellsafe.py whether these reach a script or a file name: {unsaid}"
    assert not set(SHELL_BOUND) & set(NOT_SHELL_BOUND)
    assert not {*SHELL_BOUND, *NOT_SHELL_BOUND} - set(found)  # no stale entry


def _with(setting: str, value: str):

    from launcher.plan.clusterschema import settings_class
    from launcher.plan.schema import Config

    config = Config()
    config.cluster = settings_class("slurm")()
    *path, last = setting.split(".")
    owner = config
    for part in path:
        owner = getattr(owner, part)
    current = getattr(owner, last)
    setattr(owner, last, [value] if isinstance(current, list) else {"reservation": value}
            if isinstance(current, dict) else value)
    return config


def test_every_shell_bound_setting_refuses_a_new_line():
    from contract.spec import ConfigError
    from launcher.plan.clusterschema import settings_class
    from launcher.plan.shellsafe import check_config, shell_bound

    check_config(_with("cluster.partition", "gpu"))  # a plain value passes
    for setting in shell_bound(settings_class("slurm")):
        try:
            check_config(_with(setting, "n1\n#SBATCH --wrap=reboot"))
        except ConfigError as exc:
            assert setting in str(exc) and "Fix:" in str(exc), exc
        else:
            raise AssertionError(f"{setting} took a newline that would add a line to the job script")


def test_a_report_directory_named_after_an_experiment_stays_under_outputs(tmp_path, monkeypatch, capsys):
    from launcher.report.__main__ import main as report_main

    monkeypatch.chdir(tmp_path)
    for name in ("../../x", "..", "a/b", "x\ny"):
        assert report_main(["--experiment", name]) == 2
        err = capsys.readouterr().err
        assert "--experiment=" in err and "one file name" in err and "Traceback" not in err
    assert not list(tmp_path.rglob("*"))


# ---- the corpus: hostile inputs to the newer commands, in-process ---------------------------------
# Each case: (command, argv, exit code, text the message must hold: the setting, flag or file). Paths
# in argv: {A} a finished sweep, {B} another, {RUN} a sweep still running, {EMPTY} a sweep without a
# result, {CUT} a sweep whose sweep.json is cut, {FILE} a plain file, {NOPE} a path that is not there.
# Every case also checks: no traceback, and nothing created or lost under the test's directory.

AUTO = ["runs=auto", "-m", "strategy=ddp,fsdp"]
SEARCH = ["cells=auto", "-m", "strategy=ddp,fsdp"]
CORPUS = [
    # runs=auto and its limits
    ("run", [*AUTO, "runs_max=1000000"], 2, "runs_max=1000000: is beyond limits.runs=50"),
    ("run", [*AUTO, "runs_max=50", "limits.looks=4"], 2, "raise limits.looks=6"),
    ("run", [*AUTO, "runs_budget_min=inf"], 2, "runs_budget_min=inf"),
    ("run", [*AUTO, "runs_budget_min=nan"], 2, "runs_budget_min=nan"),
    ("run", [*AUTO, "runs_budget_min=-5"], 2, "runs_budget_min=-5"),
    ("run", [*AUTO, "runs_budget_min=soon"], 2, "runs_budget_min='soon'"),
    ("run", [*AUTO, "runs_budget_min=100000"], 2, "limits.budget_min=10080"),
    ("run", [*AUTO, "runs_min=1"], 2, "runs_min=1"),
    ("run", [*AUTO, "runs_min=5", "runs_max=4"], 2, "runs_max=4"),
    ("run", [*AUTO, "runs_max=lots"], 2, "runs_max='lots': is neither a number of runs nor auto"),
    ("run", [*AUTO, "runs_max=true"], 2, "runs_max=True"),
    ("run", ["runs=3", "runs_max=8", "-m", "strategy=ddp,fsdp"], 2, "runs_max=8: is read only with runs=auto"),
    ("run", ["runs=-1"], 2, "runs=-1"),
    ("run", ["runs=maybe"], 2, "runs"),
    ("run", ["runs=500"], 2, "limits.runs=500"),
    ("run", [*AUTO, "limits.cells=3"], 2, "limits.cells=3"),
    ("run", ["limits.cells=0"], 2, "limits.cells=0"),
    ("run", ["limits.budget_min=nan"], 2, "limits.budget_min=nan"),
    ("run", ["nodes=100000", "--plan"], 2, "limits.nodes=100000"),
    ("run", ["nodes=20", "--plan"], 2, "limits.local_ranks_per_core"),
    ("run", ["cluster.timeout_min=100000"], 2, "cluster.timeout_min=100000"),
    ("run", ["cluster.timeout_min=1.5"], 2, "cluster.timeout_min=1.5: is neither a whole number of minutes nor auto"),
    ("run", ["cluster.timeout_min=automatic"], 2, "cluster.timeout_min='automatic'"),
    ("run", ["cluster.timeout_min=0"], 2, "cluster.timeout_min=0"),
    ("run", ["cluster.timeout_min=true"], 2, "cluster.timeout_min=True"),
    # cells=auto and its limits
    ("run", [*SEARCH, "cells_max=0"], 2, "cells_max=0"),
    ("run", [*SEARCH, "cells_max=-3"], 2, "cells_max=-3"),
    ("run", [*SEARCH, "cells_max=true"], 2, "cells_max"),
    ("run", [*SEARCH, "batch_size=1,2,4", "cells_max=1"], 2, "below the pilot's"),
    ("run", [*SEARCH, "cells_budget_min=0"], 2, "cells_budget_min=0"),
    ("run", [*SEARCH, "cells_budget_min=-5"], 2, "cells_budget_min=-5"),
    ("run", [*SEARCH, "cells_budget_min=nan"], 2, "cells_budget_min=nan"),
    ("run", [*SEARCH, "cells_budget_min=inf"], 2, "cells_budget_min=inf"),
    ("run", [*SEARCH, "cells_budget_min=100000"], 2, "limits.budget_min=10080"),
    ("run", ["cells=auto"], 2, "this grid has one"),
    ("run", ["cells=auto", "runs=auto", "baseline={A}"], 2, "this grid has one"),
    ("run", ["cells=some", "-m", "strategy=ddp,fsdp"], 2, "cells=some"),
    ("run", ["cells=-1", "-m", "strategy=ddp,fsdp"], 2, "cells=-1"),
    ("run", ["cells_max=5", "-m", "strategy=ddp,fsdp"], 2, "cells_max=5: is read only with cells=auto"),
    ("run", ["cells_budget_min=5", "-m", "strategy=ddp,fsdp"], 2, "is read only with cells=auto"),
    ("run", ["cells=auto,all", "-m", "strategy=ddp,fsdp"], 2, "cells differs between grid points"),
    ("run", [*SEARCH, "runs=auto", "nodes=1,2,4", "baseline={A}"], 2, "holds another grid"),
    ("run", [*SEARCH, "runs=auto", "baseline={CUT}"], 2, "baseline="),
    # baseline=
    ("run", ["runs=3", "baseline={A}", "-m", "strategy=ddp,fsdp"], 2, "baseline="),
    ("run", [*AUTO, "baseline={NOPE}"], 2, "holds no sweep.json"),
    ("run", [*AUTO, "baseline={FILE}"], 2, "holds no sweep.json"),
    ("run", [*AUTO, "baseline={CUT}"], 2, "baseline="),
    ("run", [*AUTO, "baseline={EMPTY}"], 2, "no cell of that sweep has a result"),
    ("run", [*AUTO, "nodes=1,2", "model=mlp", "baseline={A}"], 2, "none of its configurations can be compared"),
    ("run", [*AUTO, "nodes=1,2", "cluster.tasks_per_node=2", "model=gpt_tiny", "batch_size=8", "steps=99",
                  "baseline={A}"], 2, "settings differ in 3 keys (batch_size, cluster.tasks_per_node, steps)"),
    ("run", [*AUTO, "nodes=1,2", "model=gpt_tiny", "batch_size=4", "baseline={A}"], 2,
     "different world sizes (A: 2, B: 1)"),
    # models: values no cell could take (forecast axes included, below)
    ("run", ["model.params.n_layer=-3"], 2, "model.params.n_layer=-3"),
    ("run", ["+model.config.n_layer=2"], 2, "model.config.n_layer=2"),
    ("run", ["model.params.dropout=1.5"], 2, "model.params.dropout=1.5"),
    # fabric.* and cluster.declared
    ("run", ["fabric.probe=sometimes"], 2, "fabric.probe"),
    ("run", ["fabric.full=maybe"], 2, "fabric.full"),
    ("run", ["+fabric.sizes=3"], 2, "fabric.sizes"),
    ("run", ["cluster.declared=maybe"], 2, "cluster.declared"),
    ("run", ["cluster.declared=true", "cluster.gpus_per_node=8", "cluster.tasks_per_node=8", "--plan"], 2,
     "cluster.declared=True"),
    ("run", ["cluster.declared=true", "cluster.gpus_per_node=2", "cluster.tasks_per_node=2",
                  "cluster.gpu_mem_gib=-1", "--plan"], 2, "cluster.gpu_mem_gib=-1"),
    # another backend's node settings: Slurm's alone, refused naming Slurm
    ("run", ["cluster=torchrun", "cluster.partition=gpu", "--plan"], 2,
     "cluster.partition is read only by cluster=slurm (a setting of the slurm backend)"),
    ("run", ["cluster.nodelist=n1", "--plan"], 2, "cluster.nodelist is read only by cluster=slurm"),
    ("run", ["cluster=torchrun", "cluster.gpu_type=h100", "--plan"], 2, "cluster.gpu_type='h100'"),
    # values that reach a script or a path
    ("run", ["cluster=slurm", 'cluster.nodelist="n1\n#SBATCH --wrap=reboot"', "--plan"], 2, "cluster.nodelist"),
    ("run", ['sweep_dir="{NOPE}\nx"', "--plan"], 2, "sweep_dir="),
    # --compare, --gate, --threshold, --record-drift
    ("report", ["--compare", "{A}", "{A}"], 2, "compared with itself"),
    ("report", ["--compare", "{A}", "{A}/", "--gate"], 2, "compared with itself"),
    ("report", ["{A}", "--gate"], 2, "--gate only mean(s) something with --compare"),
    ("report", ["{A}", "--threshold", "0.1"], 2, "--threshold only mean(s) something with --compare"),
    ("report", ["--compare", "{A}", "{B}", "--threshold", "nan"], 2, "--threshold nan"),
    ("report", ["--compare", "{A}", "{B}", "--threshold", "-0.05"], 2, "--threshold -0.05"),
    ("report", ["--compare", "{A}", "{B}", "--threshold", "inf"], 2, "--threshold inf"),
    ("report", ["--compare", "{A}", "{B}", "--threshold", "2"], 2, "--threshold 2"),
    ("report", ["--compare", "{A}", "{B}", "--threshold", "abc"], 2, "--threshold"),
    ("report", ["--compare", "{A}", "{B}", "--gate", "--record-drift"], 2, "--gate and --record-drift"),
    ("report", ["--compare", "{A}", "{RUN}", "--record-drift"], 2, "--record-drift takes an A/A pair"),
    ("report", ["--compare", "{A}", "{FILE}"], 2, "holds no sweep.json"),
    ("report", ["--compare", "{CUT}", "{A}"], 2, "sweep.json"),
    ("report", ["--experiment", "../../x"], 2, "--experiment='../../x'"),
    ("report", ["--compare", "{A}", "{B}", "{A}"], 2, "--compare takes its two sweeps itself"),
    # launcher.forecast
    ("forecast", ["{A}", "model.params.n_layer=-3"], 2, "model.params.n_layer=-3"),
    ("forecast", ["{A}", "nodes=0"], 2, "nodes=0"),
    ("forecast", ["{A}", "strategy=bogus"], 2, "strategy/bogus"),
    ("forecast", ["{A}", "nodes=100000"], 2, "limits.nodes"),
    ("forecast", ["{A}", "+model.config.n_layer=2"], 2, "model.config.n_layer"),
    ("forecast", ["{A}", "--bogus"], 2, "--bogus"),
    ("forecast", ["{A}", "{B}"], 2, "give one sweep directory"),
    ("forecast", ["{CUT}", "nodes=2"], 2, "sweep.json"),
    # launcher.sync
    ("sync", ["{CUT}"], 2, "sweep.json"),
    ("sync", ["{A}", "--tracking-uri", "ftp://nowhere/x"], 2, "ftp://"),
    ("sync", ["{NOPE}"], 2, "sweep.json"),
]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    paths = {"A": make_sweep(root, "a", BASE), "B": make_sweep(root, "b", BASE),
             "RUN": make_sweep(root, "run", BASE), "EMPTY": make_sweep(root, "empty", {}),
             "CUT": make_sweep(root, "cut", BASE), "FILE": root / "plain.txt", "NOPE": root / "nope"}
    state = SweepState.load(paths["RUN"])
    state.cells[0].status = CellStatus.running
    state.save()
    text = (paths["CUT"] / "sweep.json").read_text()
    (paths["CUT"] / "sweep.json").write_text(text[: len(text) // 2])
    paths["FILE"].write_text("not a sweep\n")
    return root, {k: str(v) for k, v in paths.items()}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"/" for p in sorted(root.rglob("*"))}


def _main(command: str):
    """The ``main`` of a case's command, named as the one list names it (launcher/commands/__init__.py);
    tests/test_house.py fails when a command of that list has no case in a corpus of this file."""
    from launcher.commands import main_of

    return main_of(command)


@pytest.mark.parametrize("command, argv, code, says", CORPUS, ids=[f"{c[0]} {' '.join(c[1])}"[:80] for c in CORPUS])
def test_hostile_input(command, argv, code, says, sweeps, tmp_path, monkeypatch, capsys):
    root, paths = sweeps
    argv = [a.format(**paths) for a in argv]
    out = tmp_path / "out"
    if command == "run":
        argv.append(f"output_root={out}")
    monkeypatch.chdir(tmp_path)  # a default outputs/ would appear here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = _tree(root)
    try:
        got = _main(command)(argv)
    except SystemExit as exc:  # argparse's own refusal (a flag's value of the wrong type)
        got = exc.code
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert got == code, said
    assert says in captured.err, said
    assert "Traceback" not in said
    assert _tree(root) == before  # nothing created or lost beside the sweeps
    assert not list(tmp_path.rglob("*"))  # nothing created where the command ran, no output_root


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 40


def test_a_comparable_baseline_passes_the_check_before_the_first_job(sweeps, tmp_path, capsys):
    from launcher.__main__ import main

    _, paths = sweeps
    # The same grid with one setting under test (the hand-made baseline's ranks per node are not among
    # its overrides, so cluster.tasks_per_node is the one setting apart): compared by name.
    assert main([*AUTO, "nodes=1,2", "cluster.tasks_per_node=2", "model=gpt_tiny", "batch_size=4",
                 f"baseline={paths['A']}", "--plan", f"output_root={tmp_path / 'out'}"]) == 0, capsys.readouterr().err


# ---- health and history: launcher.health, launcher.history and the node ledger they read ------------
# The corpus: (command, argv, exit code, text the message must hold). launcher.health's argv gets
# output_root=<the test's out/> first; {FILE} a plain file, {NOPE} no such path, {DIR} a directory,
# {FOREIGN} a ledger of one line of other JSON, {LEDGER} a good ledger of one probe.

def _many_local_nodes() -> str:
    import os

    return f"health.nodes={8 * (os.cpu_count() or 1) + 1}"  # one past the sweep's 8 ranks per core


HEALTH_CORPUS = [
    ("health", ["--plan", "cluster=slurm", "cluster.declared=true", "health.nodes=10", "health.nodes_per_job=0"], 2,
     "health.nodes_per_job=0"),
    ("health", ["health.nodes=0"], 2, "health.nodes=0"),
    ("health", ["health.nodes=4;touch x"], 2, "health.nodes='4;touch x'"),
    ("health", ["health.nodes=three"], 2, "health.nodes='three'"),
    ("health", ["health.repeats=-1"], 2, "health.repeats=-1"),
    ("health", ["health.repeats=0"], 2, "health.repeats=0"),
    ("health", ["cluster.gpus_per_node=-1"], 2, "cluster.gpus_per_node=-1"),
    ("health", ["cluster.gpus_per_node=4;touch x"], 2, "cluster.gpus_per_node"),
    ("health", ["cluster.declared=maybe"], 2, "cluster.declared"),
    ("health", ["cluster.declared=true"], 2, "cluster.declared"),
    ("health", ["--plan", "cluster=slurm", "cluster.declared=true"], 2, "health.nodes"),
    ("health", ["cluster=slurm", "cluster.nodelist=n1;touch x"], 2, "cluster.nodelist='n1;touch x'"),
    ("health", ["cluster=slurm", "cluster.nodelist=n1\n#SBATCH --wrap=reboot"], 2, "cluster.nodelist"),
    ("health", ["cluster=slurm", "cluster.partition=gpu$(reboot)"], 2, "cluster.partition"),
    ("health", ["cluster=slurm", "cluster.exclude=n1 n2"], 2, "cluster.exclude"),
    ("health", ["cluster=slurm", "cluster.python=python3\nreboot"], 2, "cluster.python"),
    ("health", ["cluster.nodelist=n1"], 2, "cluster.nodelist"),  # cluster=local reads no node list
    ("health", ["cluster.timeout_min=0"], 2, "cluster.timeout_min=0"),
    ("health", ["cluster.timeout_min=auto"], 2, "cluster.timeout_min='auto'"),
    ("health", ["tracking.enabled=maybe"], 2, "tracking.enabled"),
    ("health", ["cluster=pbs"], 2, "cluster='pbs'"),
    ("health", [_many_local_nodes()], 2, "limits.local_ranks_per_core"),
    ("health", ["health.nodes=2000"], 2, "health.nodes=2000"),
    ("health", ["cluster=slurm", "health.nodes=3"], 2, "health.nodes"),
    ("health", ["health.margin=nan"], 2, "health.margin"),
    ("health", ["health.dcgm=maybe"], 2, "health.dcgm"),
    ("health", ["nodes=3"], 2, "did you mean health.nodes"),
    ("health", ["--show", "--last", "abc"], 2, "--last"),
    ("health", ["--show", "--last", "0"], 2, "--last 0"),
    ("health", ["--last", "3"], 2, "--last 3: only means something with --show"),
    ("health", ["--shwo"], 2, "did you mean --show"),
    ("health", ["--sh"], 2, "--sh: is not a flag"),  # never an abbreviation
    ("health", ["--check"], 2, "--check"),
    ("health", ["--check", ""], 2, "--check ''"),
    ("health", ["--check", "cluster=slurm"], 2, "--check 'cluster=slurm'"),
    ("health", ["--show", "--check", "n1"], 2, "--show and --check"),
    ("history", ["--ledger", "{LEDGER}", "--out", "{FILE}"], 2, "--out="),
    ("history", ["--ledger", "{LEDGER}", "--out", ""], 2, "--out=''"),
    ("history", ["--ledger", "{NOPE}"], 2, "--ledger="),
    ("history", ["--ledger", "{DIR}"], 2, "--ledger="),
    ("history", ["--ledger", "{FOREIGN}"], 2, "line 1: JSON of another shape"),
    ("history", ["--shwo"], 2, "--shwo: is not a flag"),
    ("history", ["--ledger"], 2, "--ledger"),
    ("history", ["nightly", "--ledger", "{LEDGER}"], 2, "one of them"),
]


def _probe_record(slow: str | None = None, measured_at: str = "2026-11-27T20:00:00", nodes: int = 4):
    import random

    from launcher.report import health
    from tests.test_health import fleet

    result = {**fleet(random.Random(9), nodes=nodes, slow=slow, factor=0.3), "measured_at": measured_at}
    return health.record("local:x", result, health.judge(result), {"nodes": []})


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory):
    from launcher.report import health

    root = tmp_path_factory.mktemp("ledgers")
    good = root / "health-local_x.jsonl"
    health.append(good, _probe_record())
    (root / "foreign.jsonl").write_text('{"hello": "world"}\n')
    (root / "plain.txt").write_text("not a ledger\n")
    (root / "dir").mkdir()
    return root, {"LEDGER": str(good), "FOREIGN": str(root / "foreign.jsonl"), "FILE": str(root / "plain.txt"),
                  "NOPE": str(root / "nope.jsonl"), "DIR": str(root / "dir")}


@pytest.mark.parametrize("command, argv, code, says", HEALTH_CORPUS,
                         ids=[f"{c[0]} {' '.join(c[1])}"[:80] for c in HEALTH_CORPUS])
def test_health_and_history_refuse_hostile_input(command, argv, code, says, ledgers, tmp_path, monkeypatch, capsys):
    root, paths = ledgers
    argv = [a.format(**paths) for a in argv]
    if command == "health":
        argv = [f"output_root={tmp_path / 'out'}", *argv]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = _tree(root)
    got = _main(command)(argv)
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert got == code, said
    assert says in captured.err, said
    assert "Traceback" not in said
    assert _tree(root) == before
    assert not list(tmp_path.rglob("*")), list(tmp_path.rglob("*"))


def test_the_health_corpus_covers_every_flag_and_both_commands():
    assert len(HEALTH_CORPUS) >= 40
    flags = {a for _, argv, _, _ in HEALTH_CORPUS for a in argv if a.startswith("--")}
    assert {"--show", "--check", "--last", "--plan", "--out", "--ledger"} <= flags


def _ledger_of(tmp_path, *lines: str) -> Path:
    from launcher.healthprobe import cluster_key
    from launcher.plan.clusterschema import settings_class
    from launcher.report import health

    path = health.ledger_path(tmp_path, cluster_key(settings_class("local")()))
    path.write_text("".join(lines))
    return path


def _line(record) -> str:
    return json.dumps(record, sort_keys=True) + "\n"


def _check(tmp_path, capsys, node: str) -> tuple[int, str]:
    from launcher.health import main

    code = main([f"output_root={tmp_path}", "--check", node])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_check_is_undecided_when_the_nodes_latest_probe_line_is_cut_short(tmp_path, capsys):
    """n0 clean in an older probe, flagged by the latest, whose line was cut short: --check must not
    answer from the older probe (0, the node kept in service), nor call the node bad on a damaged
    record (1, drained): undecided, exit 3, the line named; the ledger left as it was."""
    flagged = _line(_probe_record(slow="n0", measured_at="2026-11-28T06:00:00"))
    path = _ledger_of(tmp_path, _line(_probe_record()), flagged[: len(flagged) // 2])
    before = path.read_bytes()
    code, said = _check(tmp_path, capsys, "n0")
    assert code == 3, said
    assert "line 2" in said and path.name in said and "undecided" in said and "Traceback" not in said
    assert path.read_bytes() == before


def test_check_answers_from_the_latest_good_probe_when_the_damaged_line_cannot_be_the_nodes(tmp_path, capsys):
    """A line of other JSON that does not name n0, after the probe that flagged it: named, set aside,
    and the answer stands (1); a line of other JSON that names n0 leaves it undecided (3)."""
    path = _ledger_of(tmp_path, _line(_probe_record(slow="n0")), '{"note": "hand-written"}\n')
    code, said = _check(tmp_path, capsys, "n0")
    assert code == 1 and "line 2: JSON of another shape" in said and "flagged by the probe" in said, said
    path.write_text(path.read_text() + '["n0", "drain me"]\n')
    code, said = _check(tmp_path, capsys, "n0")
    assert code == 3 and "line 3" in said and "Traceback" not in said, said
    code, said = _check(tmp_path, capsys, "n9")  # never probed, no damaged line can hold it
    assert code == 0 and "no probe" in said, said


def test_show_sets_aside_a_cut_line_and_other_json_and_shows_the_good_probes(tmp_path, capsys):
    from launcher.health import main

    good = _line(_probe_record())
    path = _ledger_of(tmp_path, good, good[:40] + "\n", '{"nodes": 3}\n', '[1, 2]\n', good)
    before = path.read_bytes()
    assert main([f"output_root={tmp_path}", "--show"]) == 0
    captured = capsys.readouterr()
    assert "2 probe(s)" in captured.out and "| n0 |" in captured.out
    for line in ("line 2: cut short", "line 3: JSON of another shape", "line 4: JSON of another shape"):
        assert line in captured.err, captured.err
    assert path.name in captured.err and "Traceback" not in captured.out + captured.err
    assert path.read_bytes() == before  # set aside in the reading, nothing lost from the file


def test_a_nan_figure_is_set_aside_alone_and_its_probe_kept(tmp_path, capsys):
    from launcher.report import healthledger

    record = _probe_record()
    record["nodes"]["n1"]["figures"]["matmul_gflops"] = float("nan")
    record["nodes"]["n1"]["repeats"]["copy_gb_per_s"][0] = float("inf")
    path = _ledger_of(tmp_path, _line(_probe_record()), _line(record))
    read = healthledger.read_ledger(path)
    err = capsys.readouterr().err
    assert len(read.records) == 2 and not read.damaged
    assert "nodes.n1.figures.matmul_gflops" in err and "nodes.n1.repeats.copy_gb_per_s" in err
    kept = read.records[1][1]["nodes"]["n1"]
    assert kept["figures"]["matmul_gflops"] is None and kept["figures"]["copy_gb_per_s"] > 0
    assert len(kept["repeats"]["copy_gb_per_s"]) == 4


def test_a_probe_appended_after_a_cut_line_starts_its_own_line_and_keeps_the_damaged_one(tmp_path, capsys):
    from launcher.report import health, healthledger

    good = _line(_probe_record())
    path = _ledger_of(tmp_path, good, good[:50])  # a writer killed mid-line: no line end
    health.append(path, _probe_record(slow="n0", measured_at="2026-11-28T07:00:00"))
    read = healthledger.read_ledger(path)
    assert [n for n, _ in read.records] == [1, 3] and [n for n, _ in read.damaged] == [2]
    assert path.read_text().splitlines()[1] == good[:50]  # still there for a person
    assert "line 2" in capsys.readouterr().err


def test_history_of_a_ledger_names_its_damaged_lines_and_uses_the_good_probes(tmp_path, capsys):
    pytest.importorskip("signal_processing_algorithms")
    from launcher.history import main

    lines = [_line(_probe_record(measured_at=f"2026-11-{20 + i:02d}T03:00:00")) for i in range(5)]
    path = _ledger_of(tmp_path, *lines[:2], lines[2][:60] + "\n", '{"cluster": 1}\n', *lines[2:])
    code = main(["--ledger", str(path), "--out", str(tmp_path / "h")])
    captured = capsys.readouterr()
    assert code in (0, 3), captured.out + captured.err
    assert "line 3: cut short" in captured.err and "line 4: JSON of another shape" in captured.err
    assert "Traceback" not in captured.out + captured.err and (tmp_path / "h" / "report.md").exists()


def test_three_probes_started_in_the_same_second_get_three_folders_and_three_records(tmp_path):
    """Three processes take a probe's folder with the same time stamp at once, then append their
    records: three folders, three ledger lines, each naming its own folder."""
    import subprocess
    import sys

    ledger = tmp_path / "health-local_x.jsonl"
    code = ("import sys; from pathlib import Path; from contract.records import new_folder; "
            "from launcher.report import healthledger; "
            "f = new_folder(Path(sys.argv[1]) / 'health', '2026-11-28_06-00-00'); "
            "healthledger.append(Path(sys.argv[2]), {'folder': str(f)})")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(ledger)]) for _ in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    folders = sorted(p.name for p in (tmp_path / "health").iterdir())
    assert folders == ["2026-11-28_06-00-00", "2026-11-28_06-00-00-2", "2026-11-28_06-00-00-3"]
    kept = sorted(json.loads(line)["folder"] for line in ledger.read_text().splitlines())
    assert [Path(k).name for k in kept] == folders


def test_the_commands_refuse_in_real_processes_with_their_exit_codes(tmp_path):
    """As HealthCheckProgram and a shell run them: a mistyped flag, --check without a node, and a
    damaged latest probe, each its exit code and message, no traceback."""
    import subprocess
    import sys

    flagged = _line(_probe_record(slow="n0"))
    path = _ledger_of(tmp_path, _line(_probe_record()), flagged[:100])
    before = _tree(tmp_path)
    for argv, code, says in ((["launcher.health", "--shwo"], 2, "did you mean --show"),
                             (["launcher.health", f"output_root={tmp_path}", "--check"], 2, "--check"),
                             (["launcher.health", f"output_root={tmp_path}", "--check", "n0"], 3, "line 2"),
                             (["launcher.history", "--ledger", str(tmp_path / "nope"), "--shwo"], 2, "--shwo")):
        done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
        assert done.returncode == code, done.stdout + done.stderr
        assert says in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert _tree(tmp_path) == before and path.exists()  # nothing made, nothing lost


# ---- specs, records and exit codes: python -m jobs, a backend not installed, reproduce.sh, damaged
# entries of shared records, exit codes that say what happened, the interpreter setting -------------
# Paths in argv: {SPEC} a valid cell spec (its out_dir {CELL}, a cell directory holding it), {OTHER}
# another cell's directory, {KUBE} a sweep whose cells ran on a backend not installed here, {A} and
# {B} finished sweeps, {EMPTY} a sweep whose cells all failed, {WAITING} one whose cells have not
# ended, {NOPE} a path that is not there, {OUT} a store's path under the test's own directory.

def _spec_plain() -> dict:
    from contract import spec
    from contract.codec import to_plain

    return to_plain(spec.RunSpec(cell="strategy=ddp", out_dir="{CELL}", strategy=spec.StrategySpec(),
                                 precision=spec.PrecisionSpec(), model=spec.ModelSpec(), data=spec.DataSpec(),
                                 train=spec.TrainSpec(), layout=spec.Layout(), checkpoint=spec.CheckpointSpec()))


def _spec_with(path: str, value) -> dict:
    """The valid spec with ``path`` (dotted) set to ``value``."""
    spec = _spec_plain()
    *parents, last = path.split(".")
    node = spec
    for part in parents:
        node = node[part]
    node[last] = value
    return spec


# (argv, the spec written to {SPEC} for this case (None: the valid one), exit code, text the message holds)
JOBS_CORPUS = [
    (["{SPEC}"], _spec_with("train.batch_size", 0), 2, "batch_size=0"),
    (["{SPEC}"], _spec_with("train.steps", -1), 2, "steps=-1"),
    (["{SPEC}"], _spec_with("train.lr", float("nan")), 2, "train.lr=nan"),
    (["{SPEC}"], _spec_with("train.lr", float("inf")), 2, "train.lr=inf"),
    (["{SPEC}"], _spec_with("train.lr", -0.1), 2, "lr=-0.1"),
    (["{SPEC}"], _spec_with("train.warmup_steps", -3), 2, "warmup_steps=-3"),
    (["{SPEC}"], _spec_with("train.warmup_steps", 40), 2, "warmup_steps=40"),
    (["{SPEC}"], _spec_with("train.repeats", 0), 2, "repeats=0"),
    (["{SPEC}"], _spec_with("train.grad_accum_steps", 0), 2, "grad_accum_steps=0"),
    (["{SPEC}"], _spec_with("train.stepz", 30), 2, "did you mean steps?"),
    (["{SPEC}"], _spec_with("strategy.bucket_capmb", 25.0), 2, "did you mean bucket_cap_mb?"),
    (["{SPEC}"], _spec_with("strategy.bucket_cap_mb", float("nan")), 2, "strategy.bucket_cap_mb=nan"),
    (["{SPEC}"], _spec_with("strategy.prefetch", -1), 2, "strategy.prefetch=-1"),
    (["{SPEC}"], _spec_with("layout.nodes", 0), 2, "layout.nodes=0"),
    (["{SPEC}"], _spec_with("layout.tasks_per_node", -2), 2, "layout.tasks_per_node=-2"),
    (["{SPEC}"], _spec_with("collective_timeout_s", 0.0), 2, "collective_timeout_s=0.0"),
    (["{SPEC}"], _spec_with("data.num_workers", -1), 2, "data.num_workers=-1"),
    (["{SPEC}"], _spec_with("checkpoint.every_steps", -5), 2, "checkpoint.every_steps=-5"),
    (["{SPEC}"], _spec_with("model.params", {"dropout": float("nan")}), 2, "model.params.dropout=nan"),
    (["{SPEC}"], _spec_with("model.name", "gpt_tinyy"), 2, "model.name='gpt_tinyy'"),
    (["{SPEC}"], _spec_with("strategy.name", "zero9"), 2, "zero9"),
    (["{SPEC}"], ["not", "a", "spec"], 2, "not a readable cell spec"),
    (["{NOPE}"], None, 2, "not a readable cell spec"),
    (["{SPEC}"], {"program": "fabrik", "spec": {}}, 2, "not a readable probe spec"),  # contract/programs.py
    (["{SPEC}"], {"program": "fabric", "spec": {"out_dir": "x", "layout": {"nodez": 2}}}, 2, "nodez"),
    (["{SPEC}", "--otu", "{OTHER}"], None, 2, "did you mean --out?"),
    (["{SPEC}", "--ou", "{OTHER}"], None, 2, "did you mean --out?"),  # never an abbreviation
    ([], None, 2, "spec"),
    (["{SPEC}", "--out", "{CELL}"], None, 2, "--out {CELL}"),  # the spec's own out_dir: the sweep's figures
    (["{SPEC}", "--out", "{OTHER}"], None, 2, "a cell's own directory"),  # another cell's directory
    (["{SPEC}", "--out", "{SPEC}"], None, 2, "is a file, not a folder"),  # an output path that is a file
    (["{SPEC}"], _spec_with("out_dir", "{CELL}/result.json"), 2, "out_dir {CELL}/result.json"),
    (["{SPEC}"], _spec_with("train.steps", "many"), 2, "expected int, got 'many'"),
    (["{SPEC}"], _spec_with("layout", "two nodes"), 2, "not a readable cell spec"),
]


@pytest.mark.parametrize("argv, spec, code, says", JOBS_CORPUS,
                         ids=[f"jobs {' '.join(c[0])} {json.dumps(c[1])[-40:] if c[1] else ''}" for c in JOBS_CORPUS])
def test_python_m_jobs_refuses_a_bad_spec_or_flag_before_any_rank(argv, spec, code, says, tmp_path, monkeypatch,
                                                                  capsys):
    from jobs.__main__ import main

    cell, other = tmp_path / "sweep" / "cells" / "00-ddp", tmp_path / "sweep" / "cells" / "01-fsdp"
    paths = {"CELL": str(cell), "OTHER": str(other), "SPEC": str(cell / "spec.json"), "NOPE": str(tmp_path / "nope")}
    for d in (cell, other):
        d.mkdir(parents=True)
        (d / "spec.json").write_text(json.dumps(_spec_plain()).replace("{CELL}", str(d)))
        (d / "result.json").write_text('{"summary": {"throughput_samples_per_s": 1.0}}')
    if spec is not None:
        (cell / "spec.json").write_text(json.dumps(spec).replace("{CELL}", str(cell)))
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    try:
        got = main([a.format(**paths) for a in argv])
    except SystemExit as exc:  # the parser's own refusal
        got = exc.code
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert got == code, said
    assert says.format(**paths) in captured.err, said
    assert "Traceback" not in said
    assert _tree(tmp_path) == before  # nothing created, nothing written over


def test_a_valid_spec_passes_its_own_checks_as_written_by_the_launcher():
    from contract.codec import from_plain
    from contract.spec import RunSpec

    from_plain(RunSpec, _spec_plain()).validate()  # the corpus's base is valid: each case refuses its one change


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    paths = {"A": make_sweep(root, "a", BASE), "B": make_sweep(root, "b", BASE), "EMPTY": make_sweep(root, "empty", {}),
             "WAITING": make_sweep(root, "waiting", {}), "KUBE": make_sweep(root, "kube", BASE)}
    state = SweepState.load(paths["WAITING"])
    for cell in state.cells:
        cell.status = CellStatus.running
    state.save()
    document = json.loads((paths["KUBE"] / "sweep.json").read_text())
    for cell in document["cells"]:
        cell["cluster"]["name"] = "kube"  # a site's backend, its package not installed here
    (paths["KUBE"] / "sweep.json").write_text(json.dumps(document))
    return root, {k: str(v) for k, v in paths.items()}


RECORDS_CORPUS = [
    # a backend that is not installed: named, with how to install it, by every command that reads the sweep
    ("status", ["{KUBE}"], 2, "cluster=kube, a backend not installed here"),
    ("report", ["{KUBE}"], 2, "cluster=kube, a backend not installed here"),
    ("report", ["--compare", "{A}", "{KUBE}"], 2, "entry point ddp_fsdp_bench.backends: kube"),
    ("sync", ["{KUBE}"], 2, "cluster=kube, a backend not installed here"),
    ("sync", ["{KUBE}", "--tracking-uri", "sqlite:///{OUT}/x.db"], 2, "install the package that provides the 'kube'"),
    ("forecast", ["{KUBE}", "nodes=4"], 2, "cluster=kube, a backend not installed here"),
    # exit codes that say no more than happened
    ("report", ["--compare", "{A}", "{B}"], 3, "undecided: no row of"),  # every row inconclusive (drift dominates)
    ("report", ["--compare", "{A}", "{WAITING}"], 3, "cell(s) not ended"),
    ("sync", ["{EMPTY}"], 1, "has no results"),
    ("sync", ["{EMPTY}", "--tracking-uri", "sqlite:///{OUT}/x.db"], 1, "no run was created"),
    ("sync", ["{WAITING}"], 3, "has no results yet"),
    # the interpreter: a path and its arguments, never shell
    ("run", ['cluster.python="python3; touch x"', "--plan"], 2, "cluster.python='python3; touch x'"),
    ("run", ['cluster.python="python3 $(touch x)"', "--plan"], 2, "cluster.python"),
    ("run", ["cluster.python=\"python3 'a b'\"", "--plan"], 2, "cluster.setup"),
    ("run", ["cluster=slurm", 'cluster.python="python3 && reboot"', "--plan"], 2, "cluster.python"),
    ("run", ["cluster=torchrun", 'cluster.python="python3|tee x"', "--plan"], 2, "cluster.python"),
]


@pytest.mark.parametrize("command, argv, code, says", RECORDS_CORPUS,
                         ids=[f"{c[0]} {' '.join(c[1])}"[:80] for c in RECORDS_CORPUS])
def test_specs_records_and_exit_codes(command, argv, code, says, records, tmp_path, monkeypatch, capsys):
    root, paths = records
    argv = [a.format(**paths, OUT=tmp_path) for a in argv]
    if command == "run":
        argv.append(f"output_root={tmp_path / 'out'}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = _tree(root)
    try:
        got = _main(command)(argv)
    except SystemExit as exc:
        got = exc.code
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert got == code, said
    assert says in captured.err, said
    assert "Traceback" not in said
    assert _tree(root) == before  # no run, record or file created, nothing lost
    assert not list(tmp_path.rglob("*"))  # no store, no outputs/


# The command lines of every command, read by one Parser (launcher/commands/command.py): a mistyped flag
# refused naming the closest, never an abbreviation, a flag's value checked, a word too many named;
# nothing read, created or written. Paths as in RECORDS_CORPUS ({A} ran with tracking=off).
COMMAND_LINE_CORPUS = [
    ("run", ["--plna"], 2, "did you mean --plan?"),
    ("run", ["--multi", "strategy=ddp,fsdp"], 2, "did you mean --multirun?"),
    ("run", ["--allow-concurent", "--plan"], 2, "did you mean --allow-concurrent?"),
    ("run", ["--config-dir", "{OUT}/nope", "--plan"], 2, "--config-dir"),
    ("run", ["--plan", "--config-dir"], 2, "--config-dir"),
    ("run", ["-mx"], 2, "-m/--multirun"),
    ("status", ["{A}", "--wiat"], 2, "did you mean --wait?"),
    ("status", ["{A}", "--can"], 2, "--can: is not a flag"),  # never an abbreviation of --cancel
    ("status", ["{A}", "--timeout-s", "60"], 2, "--timeout-s 60: only means something with --wait"),
    ("status", ["{A}", "--wait", "--timeout-s", "nan"], 2, "--timeout-s nan"),
    ("status", ["{A}", "--wait", "--timeout-s", "-1"], 2, "--timeout-s -1"),
    ("status", ["{A}", "--wait", "--timeout-s", "soon"], 2, "--timeout-s"),
    ("status", ["{A}", "{B}"], 2, "more than python -m launcher.status takes"),
    ("status", [], 2, "sweep_dir"),
    ("sync", ["{A}"], 2, "ran with tracking=off"),  # nothing to sync to: refused, not a success
    ("sync", ["{A}", "--tracking-url", "sqlite:///{OUT}/x.db"], 2, "did you mean --tracking-uri?"),
    ("sync", [], 2, "sweep_dir"),
    ("report", ["--comapre", "{A}", "{B}"], 2, "did you mean --compare?"),
    ("report", ["--compare", "{A}"], 2, "--compare"),
    ("report", [], 2, "one of them"),
    ("forecast", ["{A}", "nodes=4", "--verfy"], 2, "did you mean --verify?"),
    ("forecast", ["{A}", "--ver"], 2, "--ver: is not a flag"),
    ("forecast", [], 2, "give one sweep directory"),
    ("health", ["--plna"], 2, "did you mean --plan?"),
    ("history", ["--ledgr", "x"], 2, "did you mean --ledger?"),
]


@pytest.mark.parametrize("command, argv, code, says", COMMAND_LINE_CORPUS,
                         ids=[f"{c[0]} {' '.join(c[1])}"[:80] for c in COMMAND_LINE_CORPUS])
def test_every_command_line_is_read_by_one_parser(command, argv, code, says, records, tmp_path, monkeypatch, capsys):
    test_specs_records_and_exit_codes(command, argv, code, says, records, tmp_path, monkeypatch, capsys)


def test_an_interpreter_with_its_arguments_is_taken(tmp_path, capsys):
    import sys

    from launcher.__main__ import main

    assert main([f'cluster.python="{sys.executable} -X utf8"', "--plan", f"output_root={tmp_path}"]) == 0, \
        capsys.readouterr().err


def test_a_forecast_of_a_runs_auto_sweep_drops_its_runs_auto_settings(records):
    from launcher.commands.forecast import target_cells

    _, paths = records
    state = SweepState.load(paths["A"])
    state.argv = ["python -m launcher", "runs=auto", "-m", "strategy=ddp,fsdp", "runs_min=4", "runs_max=8",
                  "runs_budget_min=60", f"baseline={paths['B']}", "model=gpt_tiny", "batch_size=4"]
    cells = target_cells(state, ["nodes=2"])  # was: "runs_min=4: is read only with runs=auto, and runs=1"
    assert [c.name for c in cells] == ["strategy=ddp nodes=2", "strategy=fsdp nodes=2"]


DRIFT_GOOD = [{"metric": m, "d2": 0.0004, "within": 0.0001, "pair": f"p{i}", "at": "2026-11-27"}
              for m in ("throughput", "step_time", "peak_memory") for i in range(4)]


def test_one_nan_entry_of_sweep_drift_is_set_aside_and_the_clusters_record_kept(tmp_path, capsys):
    good = noisefloor.load_drift(_drift(tmp_path / "good", DRIFT_GOOD), "local:vm")
    nan = {"metric": "throughput", "d2": float("nan"), "within": 0.0, "pair": "p9", "at": "2026-11-28"}
    cut = {"metric": "step_time", "d2": "0.0004"[:3] + "x", "within": 0.0001, "pair": "p9"}
    root = _drift(tmp_path / "damaged", [*DRIFT_GOOD, nan, cut])
    before = (root / noisefloor.DRIFT_FILE).read_text()
    got = noisefloor.load_drift(root, "local:vm")
    err = capsys.readouterr().err
    assert got is not None and good is not None and got.cv == good.cv and got.df == good.df  # the good 12 entries
    assert "local:vm[12]" in err and "NaN or infinity" in err and '"d2": "0.0x"' in err and "Traceback" not in err
    assert (root / noisefloor.DRIFT_FILE).read_text() == before  # a read changes nothing
    # The next update keeps both damaged entries aside, as they were, and every good entry in the record.
    noisefloor.record_drift(root, "local:vm", [{"metric": "throughput", "d2": 0.0, "within": 0.0}], "new")
    (aside,) = root.glob(f"{noisefloor.DRIFT_FILE}.damaged-*")
    assert json.loads(aside.read_text().replace("NaN", '"nan"')) == {"local:vm[12]": {**nan, "d2": "nan"},
                                                                     "local:vm[13]": cut}
    kept = json.loads((root / noisefloor.DRIFT_FILE).read_text())["local:vm"]
    assert all(e in kept for e in DRIFT_GOOD) and len(kept) == len(DRIFT_GOOD) + 1


def _drift(root: Path, entries: list) -> Path:
    root.mkdir()
    (root / noisefloor.DRIFT_FILE).write_text(json.dumps({"local:vm": entries, "slurm:gpu": DRIFT_GOOD}))
    return root


def test_a_nan_entry_of_forecast_errors_and_of_fabrics_is_set_aside_alone(tmp_path, capsys):
    from launcher.forecast import forecastrecord

    entries = [{"sweep": "s1", "cell": f"c{i}", "kind": "loo", "predicted": 100.0, "measured": 90.0 + i,
                "log_error": 0.01 * i, "at": "2026-11-27"} for i in range(5)]
    (tmp_path / forecastrecord.RECORD_FILE).write_text(
        json.dumps({"local:vm": [*entries[:2], {**entries[2], "log_error": float("nan")}, *entries[3:]]}))
    assert forecastrecord.errors(tmp_path, "local:vm") == [*entries[:2], *entries[3:]]
    assert "local:vm[2]" in capsys.readouterr().err
    identity = {"cluster": "local:vm", "shape": "1x2", "nodes": "n1", "software": {}}
    other = {**identity, "shape": "2x2"}
    (tmp_path / fabric.KEPT_FILE).write_text(json.dumps({
        "local:vm 1x2": {"identity": identity, "result": {"fits": [{"alpha_us": 5.0}]}},
        "local:vm 2x2": {"identity": other, "result": {"fits": [{"alpha_us": float("inf")}]}}}))
    assert fabric.kept(tmp_path, identity) is not None and fabric.kept(tmp_path, other) is None
    err = capsys.readouterr().err
    assert "local:vm 2x2" in err and "NaN or infinity" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """One real cell on this machine (gpt_tiny, a few steps): its reproduce.sh is run for real."""
    from launcher.__main__ import main
    from tests.conftest import FAST

    root = tmp_path_factory.mktemp("tiny")
    assert main([*FAST, "tracking=off", f"output_root={root}", f"sweep_dir={root / 'sweep'}"]) == 0
    return SweepState.load(root / "sweep")


def test_reproduce_sh_run_in_its_own_cell_never_writes_over_the_sweeps_figures(tiny_sweep):
    import subprocess

    (cell,) = tiny_sweep.cells
    cell_dir = tiny_sweep.cell_dir(cell)
    figures = {name: (cell_dir / name).read_bytes() for name in ("result.json", "metrics.jsonl")}
    before = _tree(tiny_sweep.path)
    for out in (".", str(cell_dir), "../" + cell_dir.name):
        done = subprocess.run(["sh", "reproduce.sh", out], cwd=cell_dir, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "a cell's own directory" in done.stderr and "Traceback" not in done.stderr
        assert _tree(tiny_sweep.path) == before  # nothing run, nothing made (no reproduced/ either)
    # Run as written, from the cell's own directory: the ranks again, into reproduced/ beside it.
    done = subprocess.run(["sh", "reproduce.sh"], cwd=cell_dir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((cell_dir / "reproduced" / "result.json").read_text())["summary"]
    assert {name: (cell_dir / name).read_bytes() for name in figures} == figures


def test_a_forecast_that_forecasts_nothing_exits_1_saying_so(tiny_sweep, tmp_path, monkeypatch, capsys):
    from launcher.commands.forecast import main

    monkeypatch.chdir(tmp_path)
    before = _tree(tiny_sweep.path)
    # Two ranks, where the sweep measured one: no collective was measured, and no fabric probe ran.
    assert main([str(tiny_sweep.path), "nodes=2"]) == 1
    captured = capsys.readouterr()
    assert "nothing could be forecast" in captured.err and "Traceback" not in captured.out + captured.err
    assert "no latency and bandwidth for its collectives" in captured.out  # the table says why
    assert _tree(tiny_sweep.path) == before and not list(tmp_path.iterdir())


def test_the_specs_records_and_exit_codes_corpus_is_large_enough():
    assert len(JOBS_CORPUS) + len(RECORDS_CORPUS) >= 40


# ---- backends, stores and compilers: a site's entry points and config files, the tracking store's
# deadline, a compiler for compile=true ---------------------------------------------------------------
# The site's cases run `python -m launcher...` with the site's directory on PYTHONPATH (its packages
# and .dist-info, as pip installs them: tests/test_config.py's kube backend is the model). {SITE} the
# site's config directory (cluster/kube.yaml), {A} a sweep run on cluster=local, {KUBE} one whose
# cells name cluster=kube, {SLURM} one whose cells name cluster=slurm.

def _site_package(root: Path, dist: str, entry_points: str, package: str | None = None) -> None:
    """An installed distribution: its .dist-info (METADATA, entry_points.txt) and, when given, its
    package with tests/test_config.py's kube settings and backend."""
    from tests.test_config import SITE_BACKEND, SITE_SETTINGS

    name, version = dist.split()
    meta = root / f"{name.replace('-', '_')}-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (meta / "entry_points.txt").write_text(f"[ddp_fsdp_bench.backends]\n{entry_points}\n")
    if package:
        (root / package).mkdir()
        for module, text in (("__init__", ""), ("settings", SITE_SETTINGS), ("backend", SITE_BACKEND)):
            (root / package / f"{module}.py").write_text(text)


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("sites")
    _site_package(root / "collides", "site-pkg 0.2", "slurm = site_pkg")  # a built-in's name
    _site_package(root / "broken", "kube-site 0.1", "kube = kube_site_gone")  # its package not importable
    conf = root / "conf"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "kube.yaml").write_text("defaults:\n  - kube_schema\n  - _self_\nname: kube\n")
    paths = {"SITE": conf, "A": make_sweep(root, "a", BASE), "KUBE": make_sweep(root, "kube", BASE),
             "SLURM": make_sweep(root, "slurm", BASE)}
    for name in ("KUBE", "SLURM"):
        document = json.loads((paths[name] / "sweep.json").read_text())
        for cell in document["cells"]:
            cell["cluster"]["name"] = name.lower()
        (paths[name] / "sweep.json").write_text(json.dumps(document))
    return root, {k: str(v) for k, v in paths.items()}


COLLIDES = "entry point ddp_fsdp_bench.backends: slurm = site_pkg (distribution site-pkg 0.2)"
BROKEN = "entry point ddp_fsdp_bench.backends: kube = kube_site_gone (distribution kube-site 0.1)"
GONE = "ModuleNotFoundError: No module named 'kube_site_gone'"
# (site, command, argv, exit code, what stderr holds, each of it)
SITE_CORPUS = [
    # an entry point that takes a built-in's name: announced by every command, its name refused
    ("collides", "run", ["--plan"], 0, [COLLIDES, "takes the name of the built-in backend 'slurm'"]),
    ("collides", "run", ["--plan", "cluster=slurm"], 2, ["cluster='slurm'", COLLIDES, "Fix:", "pip uninstall site-pkg"]),
    ("collides", "status", ["{A}"], 0, [COLLIDES]),
    ("collides", "status", ["{SLURM}"], 2, ["cluster='slurm'", COLLIDES]),
    # an entry point whose package cannot be imported: the other backends work; its own is refused
    ("broken", "run", ["--plan"], 0, [BROKEN, GONE, "the others go on without it"]),
    ("broken", "run", ["--plan", "--config-dir", "{SITE}", "cluster=kube"], 2, ["cluster='kube'", BROKEN, GONE]),
    ("broken", "run", ["--plan", "cluster=torchrun"], 0, [BROKEN]),
    ("broken", "status", ["{A}"], 0, [BROKEN]),
    ("broken", "status", ["{KUBE}"], 2, ["cluster='kube'", BROKEN, GONE, "Fix: reinstall"]),
]


@pytest.mark.parametrize("site, command, argv, code, says", SITE_CORPUS,
                         ids=[f"{c[0]} {c[1]} {' '.join(c[2])}"[:80] for c in SITE_CORPUS])
def test_a_sites_entry_points_are_never_ignored_in_silence(site, command, argv, code, says, sites, tmp_path):
    import os
    import subprocess
    import sys

    root, paths = sites
    argv = [a.format(**paths) for a in argv]
    from launcher.commands import entry

    if command == "run":
        argv.append(f"output_root={tmp_path / 'out'}")
    before = _tree(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / site), str(Path(__file__).parent.parent)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", entry(command).shim, *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == code, said
    for words in says:
        assert words in done.stderr, said
    assert "Traceback" not in said
    if code:  # refused: nothing created or lost beside the sweeps (a status that goes on writes its report)
        assert _tree(root) == before
    assert not list(tmp_path.rglob("*"))  # no output_root, nothing where the command ran


def test_a_sites_cluster_file_wins_over_the_packaged_one(tmp_path, monkeypatch, capsys):
    """docs/configuration.md: --config-dir puts the site's directory before the packaged configs, so
    a site's cluster/local.yaml is what cluster=local composes."""
    from launcher.__main__ import main
    from launcher.plan.grid import compose, expand, search_path
    from launcher.plan.planner import plan

    site = tmp_path / "site"
    (site / "cluster").mkdir(parents=True)
    (site / "cluster" / "local.yaml").write_text("defaults:\n  - local_schema\n  - _self_\nname: local\n"
                                                 "tasks_per_node: 2\ntimeout_min: 7\n")
    extra = search_path([site])
    (cell,) = plan(compose(*expand(["runs=1"], False, extra), extra=extra))
    assert (cell.config.cluster.timeout_min, cell.layout.tasks_per_node) == (7, 2)
    (packaged,) = plan(compose(*expand(["runs=1"], False)))
    assert (packaged.config.cluster.timeout_min, packaged.layout.tasks_per_node) == (60, 1)  # without the site
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    assert main(["--plan", "--config-dir", str(site), "runs=1", f"output_root={tmp_path / 'out'}"]) == 0
    captured = capsys.readouterr()
    assert "1 x 2" in captured.out and "Traceback" not in captured.out + captured.err  # nodes x ranks: the site's
    assert _tree(tmp_path) == before


# The tracking store: refused before the first cell when it cannot be written (nothing created).
STORE_CORPUS = [
    (["tracking.uri=sqlite:////proc/x.db"], "tracking.uri='sqlite:////proc/x.db': the SQLite file /proc/x.db cannot "
                                            "be created in /proc"),
    (["tracking.uri=sqlite:////proc/version"], "the SQLite file /proc/version cannot be written"),
    (["tracking.uri=sqlite:///{DIR}"], "is not a file"),
    (["tracking.uri=sqlite:////proc/x.db", "--plan"], "tracking.uri="),
]


@pytest.mark.parametrize("argv, says", STORE_CORPUS, ids=[" ".join(c[0]) for c in STORE_CORPUS])
def test_an_unwritable_store_is_refused_before_the_first_cell(argv, says, tmp_path, monkeypatch, capsys):
    from launcher.__main__ import main

    directory = tmp_path / "a-directory"
    directory.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = [a.format(DIR=directory) for a in argv]
    assert main([*FAST_CELL, *argv, f"output_root={tmp_path / 'out'}"]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and "tracking=off" in captured.err, captured.err
    assert "Traceback" not in captured.out + captured.err
    assert [p.name for p in tmp_path.iterdir()] == ["a-directory"]  # no output_root, no sweep directory, no store
    assert not list(directory.iterdir())  # the probe left nothing


FAST_CELL = ["model=mlp", "batch_size=4", "steps=4", "warmup_steps=1", "repeats=1", "runs=1", "fabric.probe=off",
             "comm_probe_steps=0"]


def test_every_mlflow_call_has_a_deadline_and_a_store_that_missed_it_is_not_waited_on_again(monkeypatch):
    import threading
    import time

    from contract import mlflow_client

    monkeypatch.setattr(mlflow_client, "CALL_DEADLINE_S", 0.3)
    monkeypatch.setattr(mlflow_client, "_unanswered", {})
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(mlflow_client.StoreUnavailable, match="a search did not answer within 0.3 s"):
        mlflow_client.bounded("sqlite:////x.db", "a search", release.wait, 30)
    assert time.monotonic() - started < 2
    with pytest.raises(mlflow_client.StoreUnavailable, match="is not called again: a search did not answer"):
        mlflow_client.bounded("sqlite:////x.db", "a log", lambda: 1)  # at once, without a call
    release.set()
    assert mlflow_client.bounded("sqlite:////y.db", "a log", lambda: 1) == 1  # another store is called
    with pytest.raises(ZeroDivisionError):  # an error of the call is the caller's, as raised
        mlflow_client.bounded("sqlite:////y.db", "a log", lambda: 1 / 0)


def test_sigterm_while_the_store_is_locked_ends_the_launcher_within_seconds(tmp_path):
    """A store another process holds locked (an exclusive transaction, as a stuck writer would): the
    launcher waits on it after its cell, SIGTERM arrives during that wait, and the launcher ends
    within 5 s, non-zero, no process of its left (MLflow alone would retry for minutes)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.stores import existing_store
    from tests.test_interrupt import assert_nothing_left, sweep_dir

    store = existing_store(tmp_path / "out")
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], "
                               "isolation_level=None); c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); "
                               "time.sleep(300)", str(store)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
        env.pop("MLFLOW_TRACKING_URI", None)
        proc = subprocess.Popen([sys.executable, "-m", "launcher", *FAST_CELL, f"output_root={tmp_path / 'out'}"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        launcher = psutil.Process(proc.pid)
        deadline = time.monotonic() + 240
        while not any(f.path == str(store) for f in launcher.open_files()):  # waiting on the store now
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        children = launcher.children(recursive=True)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took_s = time.monotonic() - signalled
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert took_s < 5, f"{took_s:.1f} s\n{out}"
    assert "did not answer within 1.5 s of the stop" in out and "Traceback" not in out, out
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert_nothing_left(sweep_dir(tmp_path))
    document = json.loads((sweep_dir(tmp_path) / "sweep.json").read_text())
    assert [c["status"] for c in document["cells"]] == ["done"]  # what was done is kept


# compile=true on CPU ranks needs a C++ compiler (inductor builds their kernels): looked for before launch.
def _compiled_cells(*overrides: str):
    from launcher.plan.grid import compose, expand
    from launcher.plan.planner import plan

    return plan(compose(*expand(["runs=1", *overrides], False)))


@pytest.mark.parametrize("environ, named", [
    ({"PATH": "{EMPTY}"}, "g++ (CXX is not set) is not found on PATH"),
    ({"PATH": "/usr/bin:/bin", "CXX": "{EMPTY}/no-such-c++"}, "CXX={EMPTY}/no-such-c++ is not found"),
    ({"PATH": "{EMPTY}", "CXX": "clang++-99"}, "CXX=clang++-99 is not found"),
], ids=["no g++ on PATH", "CXX a path that is not there", "CXX a name not on PATH"])
def test_compile_without_a_compiler_is_refused_before_launch(environ, named, tmp_path):
    from launcher.plan.grid import SweepError
    from launcher.preflight import _compiler

    environ = {k: v.format(EMPTY=tmp_path) for k, v in environ.items()}
    with pytest.raises(SweepError) as refused:
        _compiler(_compiled_cells("compile=true"), environ)
    said = str(refused.value)
    assert said.startswith("compile=True:") and named.format(EMPTY=tmp_path) in said, said
    assert "apt-get install g++" in said and "compile=false" in said, said


def test_compile_is_not_refused_where_a_compiler_is_or_nothing_compiles(tmp_path):
    import shutil

    from launcher.preflight import _compiler

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine: the refusal above is what it gets")
    hidden = {"PATH": str(tmp_path)}
    _compiler(_compiled_cells("compile=true"), {"PATH": "/usr/bin:/bin"})
    _compiler(_compiled_cells("compile=false"), hidden)  # eager: no compiler needed
    _compiler(_compiled_cells(), hidden)  # auto: eager on CPU (contract/tuning.py CPU_COMPILE)
    _compiler(_compiled_cells("compile=true", "cluster.setup=[module load gcc]"), hidden)  # setup may bring one


def test_compile_without_a_compiler_is_refused_by_the_command(tmp_path, monkeypatch, capsys):
    from launcher.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert main([*FAST_CELL, "compile=true", f"output_root={tmp_path / 'out'}"]) == 2
    captured = capsys.readouterr()
    assert "compile=True" in captured.err and "compile=false" in captured.err, captured.err
    assert "Traceback" not in captured.out + captured.err
    assert not list(tmp_path.iterdir())  # nothing launched, nothing created


def test_recording_grids_for_the_simulation_refuses_a_non_sweep_or_a_damaged_record_and_keeps_it(
        tmp_path, monkeypatch, capsys):
    """python -m bench.cells_auto: a directory that holds no sweep, and a recorded-grids file cut
    short, are each named with the fix (exit 2, no traceback), and the file is left as it was."""
    from bench import cells_auto

    grids = tmp_path / "search_grids.json"
    monkeypatch.setattr(cells_auto, "GRIDS", grids)
    assert cells_auto.main(["--record", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere holds no sweep.json" in err and "Traceback" not in err and not grids.exists()
    grids.write_text('{"grids": [{"sweep": "a", "configurations"')
    before = grids.read_bytes()
    for argv in ([], ["--record", str(tmp_path)]):
        assert cells_auto.main(argv) == 2
        err = capsys.readouterr().err
        assert "is not a record of measured grids" in err and "git checkout" in err, err
        assert grids.read_bytes() == before


# ---- past records never break a present command ----------------------------------------------------

USER_MODEL = '''import torch


class Tiny(torch.nn.Module):
    """A user's token model: ids (batch, seq) in, logits (batch, seq, vocab) out."""

    def __init__(self, vocab_size=64, width=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, ids):
        return self.head(self.embed(ids))
'''


@pytest.mark.slow
def test_a_past_sweep_of_a_model_this_shell_cannot_import_is_set_aside_and_plan_goes_on(tmp_path, monkeypatch):
    import shutil
    import subprocess
    import sys

    from launcher.__main__ import main
    from tests.conftest import FAST

    package = tmp_path / "pkgs" / "userpkg_gone"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    out = tmp_path / "out"
    user = ["model=custom", "model._target_=userpkg_gone.nets.Tiny", "model.input=tokens", "model.vocab_size=64",
            "model.seq_len=16", "+model.params.vocab_size=64"]
    fast = [o for o in FAST if not o.startswith("model")]
    assert main(["-m", *user, *fast, "tracking=off", f"output_root={out}"]) == 0
    (cell,) = out.glob("*/cells/*/")
    # The cell says which units FSDP would wrap, and its ranks again by hand find the package.
    assert json.loads((cell / "result.json").read_text())["tags"]["shard_units"].startswith("none: the whole model")
    assert f"PYTHONPATH={package.parent}" in (cell / "reproduce.sh").read_text()
    shutil.rmtree(package.parent)  # the other person's package is not on this shell's path
    monkeypatch.delenv("PYTHONPATH")
    done = subprocess.run([sys.executable, "-m", "launcher", "--plan", "-m", "strategy=ddp,fsdp", *FAST,
                           f"output_root={out}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "Traceback" not in said
    (line,) = [line for line in said.splitlines() if line.startswith("Set aside sweep")]
    assert str(out) in line and "userpkg_gone" in line, line


def test_the_latest_sweep_is_the_one_that_measured_last_unflagged_first_never_the_newest_file(tmp_path):
    import os

    from launcher.forecast.cells import _by_recorded_end
    from launcher.report.noisefloor import floor_key

    def measured_at(sweep: Path, unix_s: float) -> None:
        for result in sweep.glob("cells/*/result.json"):
            result.write_text(json.dumps({**json.loads(result.read_text()), "first_step_unix_s": unix_s}))

    old, new, noisy = (make_sweep(tmp_path, n, BASE) for n in ("old", "new", "noisy"))
    measured_at(old, 1_000.0)
    measured_at(new, 2_000.0)
    measured_at(noisy, 3_000.0)
    state = SweepState.load(noisy)
    state.cells[0].interference = "other processes took 40% of the cores"
    state.save()
    os.utime(old / "sweep.json")  # a sync rewrote the old sweep's document: its mtime is the newest
    key = floor_key(SweepState.load(old))
    assert [s.name for s in _by_recorded_end(tmp_path, key)] == ["new", "old", "noisy"]


# ---- one driver per sweep -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_launcher_on_a_sweep_a_live_launcher_drives_is_refused_and_each_cell_runs_once(tmp_path, capsys):
    import subprocess
    import sys
    import time

    from launcher.__main__ import main
    from launcher.sweep import DRIVER_LOCK
    from tests.conftest import FAST

    sweep_dir = tmp_path / "shared-sweep"
    # Long enough cells that the first launcher is still at work when the second one starts.
    grid = ["-m", "strategy=ddp,fsdp", *FAST, "steps=60", "tracking=off", f"sweep_dir={sweep_dir}"]
    first = subprocess.Popen([sys.executable, "-m", "launcher", *grid, f"output_root={tmp_path / 'a'}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (sweep_dir / "sweep.json").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[0]
        # The second terminal: the same sweep_dir, another output_root.
        code = main([*grid, f"output_root={tmp_path / 'b'}"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert f"sweep_dir='{sweep_dir}' is being driven by another launcher, pid {first.pid} on host" in err
        assert "python -m launcher.status" in err
        assert not (tmp_path / "b").exists()
        assert first.wait(timeout=300) == 0, first.communicate()[0]
    finally:
        first.kill()
    for metrics in sweep_dir.glob("cells/*/metrics.jsonl"):
        kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
        assert kinds.count("start") == 1 and kinds.count("summary") == 1, metrics
    assert (sweep_dir / DRIVER_LOCK).exists()
    # Once it has ended the lock is free: the same command resumes (nothing left to run).
    assert main([*grid, f"output_root={tmp_path / 'b'}"]) == 0
    assert "2 cell(s) done, 0 still queued or running on this machine (left alone), 0 to run" in \
        capsys.readouterr().out


def test_a_cell_folder_with_two_runs_records_is_refused_and_a_resubmission_sets_the_finished_one_aside(tmp_path):
    from contract.records import RecordError
    from launcher.cluster.base import set_aside_finished_records
    from launcher.track.runs import cell_records

    one_run = [{"kind": "start", "time": 1.0}, {"kind": "step", "step": 3, "step_time_ms": 9.0},
               {"kind": "summary", "time": 2.0, "throughput_samples_per_s": 40.0}]
    records = tmp_path / "metrics.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in one_run * 2))
    with pytest.raises(RecordError, match="holds 2 runs' summaries: two launches measured into one cell folder"):
        cell_records(tmp_path)
    # A requeued job adds start records, never a second summary: read as one run.
    records.write_text("".join(json.dumps(r) + "\n" for r in [one_run[0], *one_run]))
    assert len(cell_records(tmp_path)) == 4
    # Run again after an attempt that measured to its end: that attempt's records kept aside, whole.
    kept = records.read_text()
    aside = set_aside_finished_records(tmp_path)
    assert aside == tmp_path / "metrics.attempt-1.jsonl" and aside.read_text() == kept and not records.exists()
    records.write_text(json.dumps(one_run[0]) + "\n")  # an attempt that stopped before its summary stays
    assert set_aside_finished_records(tmp_path) is None and records.exists()


# ---- every refusal docs/configuration.md promises is made ----------------------------------------

CONFIGURATION_DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


@pytest.mark.parametrize(("quoted", "overrides", "setting", "words"), [
    ("`strategy.dp_shard=3` on 4 ranks", ["strategy=fsdp", "strategy.dp_replicate=1", "strategy.dp_shard=3",
                                          "cluster.tasks_per_node=4"], "strategy.dp_shard", "does not divide the 4 ranks"),
    ("two degrees of `-1`", ["strategy=fsdp", "strategy.dp_replicate=-1"], "strategy.dp_shard", "only one degree can"),
    ("degrees that do not cover the ranks", ["strategy=fsdp", "strategy.dp_replicate=2", "strategy.dp_shard=1",
                                             "cluster.tasks_per_node=4"], "strategy", "must cover"),
    ("`strategy=fsdp strategy.dp_replicate=-1 strategy.dp_shard=2` on 2 ranks",
     ["strategy=fsdp", "strategy.dp_replicate=-1", "strategy.dp_shard=2", "cluster.tasks_per_node=2"],
     "strategy.dp_replicate", "a replicate group of one"),
    ("`strategy=hsdp nodes=1`", ["strategy=hsdp", "nodes=1"], "strategy", "no hybrid"),
    ("`nodes=2` with one rank per node", ["strategy=hsdp", "nodes=2"], "strategy", "no hybrid"),
    ("`strategy.dp_shard` other than 1 under DDP", ["strategy=ddp", "strategy.dp_shard=2", "cluster.tasks_per_node=2"],
     "strategy.dp_shard", "DDP replicates whole parameters"),
    ("`strategy.sharding=hybrid`", ["strategy=fsdp", "strategy.sharding=hybrid"], "strategy.sharding", "degrees"),
    ("`strategy.tp` other than 1 is refused", ["strategy.tp=2"], "strategy.tp", "not yet run"),
    ("`+strategy.bucket_capmb=10`", ["+strategy.bucket_capmb=10"], "strategy.bucket_capmb",
     "did you mean strategy.bucket_cap_mb"),
    ("`cluster=local cluster.account=x`", ["cluster=local", "cluster.account=x"], "cluster.account",
     "read only by cluster=slurm"),
    ("`cluster=local cluster.partition=gpu`", ["cluster=local", "cluster.partition=gpu"], "cluster.partition",
     "read only by cluster=slurm"),
    ("`output_root=/proc/forbidden`", ["output_root=/proc/forbidden"], "output_root", "Fix"),
    ("(`ftp://...`) are refused", ["tracking.uri=ftp://host/store"], "tracking.uri", "Fix"),
    ("NaN or\ninfinity in any number is refused", ["lr=nan"], "lr", "Fix"),
])
def test_each_refusal_docs_configuration_lists_is_made(quoted, overrides, setting, words, tmp_path, capsys):
    from launcher.__main__ import main

    assert quoted in CONFIGURATION_DOC.read_text(), f"docs/configuration.md no longer says {quoted!r}"
    root = [] if any(o.startswith("output_root=") for o in overrides) else [f"output_root={tmp_path / 'out'}"]
    code = main(["--plan", "-m", *overrides, *root])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert setting in err and words in err, err
    assert not (tmp_path / "out").exists()


# ---- a user's model checked before launch against the data -------------------------------------------

@pytest.mark.parametrize(("overrides", "setting", "words"), [
    # A token model (an embedding) fed the default custom input, images.
    (["model._target_=torch.nn.Embedding", "model.params.num_embeddings=64", "model.params.embedding_dim=64",
      "model.input=image"], "model.input='image'", "Expected tensor for argument #1 'indices'"),
    # Its vocabulary left at model.vocab_size's default (50257): the loss would index past its 64 columns.
    (["model._target_=torch.nn.Embedding", "model.params.num_embeddings=64", "model.params.embedding_dim=64",
      "model.input=tokens", "model.seq_len=16"], "model.vocab_size=50257", "have 64 columns"),
    # One output per sample where a token model must give one per token.
    (["model._target_=torch.nn.Linear", "model.params.in_features=16", "model.params.out_features=4",
      "model.input=tokens", "model.seq_len=16", "model.vocab_size=4"], "model._target_='torch.nn.Linear'",
     "the loss reads (batch, seq_len, width)"),
])
def test_a_user_model_that_cannot_take_the_data_is_refused_before_launch(overrides, setting, words, tmp_path, capsys):
    from launcher.__main__ import main

    code = main(["-m", "model=custom", *overrides, f"output_root={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "fake_tensor" not in err, err
    assert setting in err and words in err and "Fix:" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["local", "torchrun"])
@pytest.mark.parametrize(("python", "words"), [("/nonexistent/python", "is no interpreter of this machine"),
                                               ("/bin/false", "cannot import the worker")])
def test_an_interpreter_the_ranks_of_this_machine_cannot_run_is_refused(backend, python, words, tmp_path, capsys):
    from launcher.__main__ import main

    code = main([f"cluster={backend}", f"cluster.python={python}", f"output_root={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and f"cluster.python='{python}'" in err and words in err, err
    assert "Fix:" in err and not (tmp_path / "out").exists()


def test_a_resubmitted_run_does_not_keep_the_reason_its_last_attempt_was_cancelled(tmp_path):
    from contract import mlflow_client
    from tests.stores import existing_store

    uri = f"sqlite:///{existing_store(tmp_path)}"
    client = mlflow_client.client(uri)
    run = client.create_run(client.create_experiment("x"), tags={"cancel_reason": "interrupted by SIGINT"})
    client.set_terminated(run.info.run_id, "KILLED")
    tracking.reopen(uri, run.info.run_id)
    again = client.get_run(run.info.run_id)
    assert again.info.status == "RUNNING" and "cancel_reason" not in again.data.tags


def test_syncing_a_sweep_whose_results_are_gone_refuses_and_leaves_its_report(tmp_path, capsys):
    from launcher.commands.sync import main

    sweep = make_sweep(tmp_path, "copied", BASE)
    for result in sweep.glob("cells/*/result.json"):
        result.unlink()  # a partial copy: the document says done, the results did not come with it
    (sweep / "report.md").write_text("the report as it was written\n")
    code = main([str(sweep), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "have no result.json" in err and "Fix: copy the whole" in err
    assert (sweep / "report.md").read_text() == "the report as it was written\n"
    assert not (tmp_path / "mlflow.db").exists()
