"""The newer commands refuse what they cannot honour, keep their records and say what happened:
exit codes, the words of an empty result, shared records kept aside when damaged, a relative store
made absolute once. The hostile-input corpus of these commands is at the end of this file."""

from __future__ import annotations

import json

from launcher.plan.cell import CellStatus
from launcher.report import fabric, findings, noisefloor, shared
from launcher.report import report as report_module
from launcher.state import SweepState
from launcher.track import tracking
from tests.test_compare import BASE, make_sweep


def test_every_cell_flagged_for_interference_is_said_as_such(tmp_path):
    flagged = {k: "other processes took 83% of the cores" for k in BASE}
    sweep = make_sweep(tmp_path, "a", BASE, flagged=flagged)
    text = findings.findings(report_module.collect(SweepState.load(sweep)))
    assert "No cell finished with a result" not in text and "No series was measured" not in text
    assert "Every configuration with a result was flagged for interference (4 of 4)" in text
    failed = make_sweep(tmp_path, "b", {})
    text = findings.findings(report_module.collect(SweepState.load(failed)))
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
    from launcher.plan.schema import Config, field_type, schema_keys

    found = []
    for key in schema_keys():
        cls: object = Config
        for part in key.split(".")[:-1]:
            cls = field_type(cls, part)
        tp = repr(field_type(cls, key.rpartition(".")[2]))
        if any(word in tp for word in ("str", "Any", "dict", "list")):
            found.append(key)
    return found


def test_every_text_setting_of_the_schema_is_said_to_reach_a_shell_or_not():
    from launcher.plan.shellsafe import NOT_SHELL_BOUND, SHELL_BOUND

    found = _text_settings()
    unsaid = [k for k in found if k not in SHELL_BOUND and k not in NOT_SHELL_BOUND]
    assert not unsaid, f"say in launcher/plan/shellsafe.py whether these reach a script or a file name: {unsaid}"
    assert not set(SHELL_BOUND) & set(NOT_SHELL_BOUND)
    assert not {*SHELL_BOUND, *NOT_SHELL_BOUND} - set(found)  # no stale entry


def _with(setting: str, value: str):
    import dataclasses

    from launcher.plan.schema import ClusterKind, Config

    config = Config()
    config.cluster = dataclasses.replace(config.cluster, name=ClusterKind.slurm)
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
    from launcher.plan.shellsafe import SHELL_BOUND, check_config

    check_config(_with("cluster.partition", "gpu"))  # a plain value passes
    for setting in SHELL_BOUND:
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
