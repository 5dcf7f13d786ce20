"""The newer commands refuse what they cannot honour, keep their records and say what happened:
exit codes, the words of an empty result, shared records kept aside when damaged, a relative store
made absolute once. The hostile-input corpus of these commands is at the end of this file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.forecast import fabric
from launcher.plan.cell import CellStatus
from launcher.report import findings, noisefloor, shared
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
    from launcher.status import exit_code

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
        assert shared.read(tmp_path, name) == {}
        err = capsys.readouterr().err
        (aside,) = tmp_path.glob(f"{name}.damaged-*")
        assert aside.read_text() == cut and aside.name in err and "not overwritten" in err
        assert shared.update(tmp_path, name, lambda r: {**r, "local:vm": {"x": 1}})
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
CORPUS = [
    # runs=auto and its limits
    ("launcher", [*AUTO, "runs_max=1000000"], 2, "runs_max=1000000: is beyond limits.runs=50"),
    ("launcher", [*AUTO, "runs_max=50", "limits.looks=4"], 2, "raise limits.looks=8"),
    ("launcher", [*AUTO, "runs_budget_min=inf"], 2, "runs_budget_min=inf"),
    ("launcher", [*AUTO, "runs_budget_min=nan"], 2, "runs_budget_min=nan"),
    ("launcher", [*AUTO, "runs_budget_min=-5"], 2, "runs_budget_min=-5"),
    ("launcher", [*AUTO, "runs_budget_min=100000"], 2, "limits.budget_min=10080"),
    ("launcher", [*AUTO, "runs_min=1"], 2, "runs_min=1"),
    ("launcher", [*AUTO, "runs_min=5", "runs_max=4"], 2, "runs_max=4"),
    ("launcher", ["runs_max=8", "-m", "strategy=ddp,fsdp"], 2, "runs_max=8: is read only with runs=auto"),
    ("launcher", ["runs=-1"], 2, "runs=-1"),
    ("launcher", ["runs=maybe"], 2, "runs"),
    ("launcher", ["runs=500"], 2, "limits.runs=500"),
    ("launcher", [*AUTO, "limits.cells=3"], 2, "limits.cells=3"),
    ("launcher", ["limits.cells=0"], 2, "limits.cells=0"),
    ("launcher", ["limits.budget_min=nan"], 2, "limits.budget_min=nan"),
    ("launcher", ["nodes=100000", "--plan"], 2, "limits.nodes=100000"),
    ("launcher", ["nodes=20", "--plan"], 2, "limits.local_ranks_per_core"),
    ("launcher", ["cluster.timeout_min=100000"], 2, "cluster.timeout_min=100000"),
    # baseline=
    ("launcher", ["baseline={A}", "-m", "strategy=ddp,fsdp"], 2, "baseline="),
    ("launcher", [*AUTO, "baseline={NOPE}"], 2, "holds no sweep.json"),
    ("launcher", [*AUTO, "baseline={FILE}"], 2, "holds no sweep.json"),
    ("launcher", [*AUTO, "baseline={CUT}"], 2, "baseline="),
    ("launcher", [*AUTO, "baseline={EMPTY}"], 2, "no cell of that sweep has a result"),
    ("launcher", [*AUTO, "nodes=1,2", "model=mlp", "baseline={A}"], 2, "none of its configurations can be compared"),
    ("launcher", [*AUTO, "nodes=1,2", "cluster.tasks_per_node=2", "model=gpt_tiny", "batch_size=8", "steps=99",
                  "baseline={A}"], 2, "settings differ in 3 keys (batch_size, cluster.tasks_per_node, steps)"),
    ("launcher", [*AUTO, "nodes=1,2", "model=gpt_tiny", "batch_size=4", "baseline={A}"], 2,
     "different world sizes (A: 2, B: 1)"),
    # models: values no cell could take (forecast axes included, below)
    ("launcher", ["model.params.n_layer=-3"], 2, "model.params.n_layer=-3"),
    ("launcher", ["+model.config.n_layer=2"], 2, "model.config.n_layer=2"),
    ("launcher", ["model.params.dropout=1.5"], 2, "model.params.dropout=1.5"),
    # fabric.* and cluster.declared
    ("launcher", ["fabric.probe=sometimes"], 2, "fabric.probe"),
    ("launcher", ["fabric.full=maybe"], 2, "fabric.full"),
    ("launcher", ["+fabric.sizes=3"], 2, "fabric.sizes"),
    ("launcher", ["cluster.declared=maybe"], 2, "cluster.declared"),
    ("launcher", ["cluster.declared=true", "cluster.gpus_per_node=8", "cluster.tasks_per_node=8", "--plan"], 2,
     "cluster.declared=True"),
    ("launcher", ["cluster.declared=true", "cluster.gpus_per_node=2", "cluster.tasks_per_node=2",
                  "cluster.gpu_mem_gib=-1", "--plan"], 2, "cluster.gpu_mem_gib=-1"),
    # values that reach a script or a path
    ("launcher", ["cluster=slurm", 'cluster.nodelist="n1\n#SBATCH --wrap=reboot"', "--plan"], 2, "cluster.nodelist"),
    ("launcher", ['sweep_dir="{NOPE}\nx"', "--plan"], 2, "sweep_dir="),
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
    if command == "launcher":
        from launcher.__main__ import main
    elif command == "report":
        from launcher.report.__main__ import main
    elif command == "forecast":
        from launcher.forecast.__main__ import main
    else:
        from launcher.sync import main
    return main


@pytest.mark.parametrize("command, argv, code, says", CORPUS, ids=[f"{c[0]} {' '.join(c[1])}"[:80] for c in CORPUS])
def test_hostile_input(command, argv, code, says, sweeps, tmp_path, monkeypatch, capsys):
    root, paths = sweeps
    argv = [a.format(**paths) for a in argv]
    out = tmp_path / "out"
    if command == "launcher":
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
