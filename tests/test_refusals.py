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
