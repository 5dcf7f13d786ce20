"""Damaged sweep directories and unwritable paths, fed to every command: each answers with one
paragraph (what is wrong, where, what to do) and a nonzero exit, never a traceback.

One real sweep (a local cell, a SQLite MLflow store) is copied and damaged once per case: a
sweep.json cut short, empty, binary, of another program or another shape, a directory where a
file belongs, a missing cells directory, damaged result.json, spec.json and mlflow.json."""

import json
import os
import shutil
from pathlib import Path

import pytest

from launcher.__main__ import main as launcher_main
from launcher.report.__main__ import main as report_main
from launcher.status import main as status_main
from launcher.sync import main as sync_main
from tests.conftest import FAST

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("damaged")
    assert launcher_main([*FAST, f"output_root={root}", f"sweep_dir={root / 'sweep'}"]) == 0
    return root / "sweep"


def _cell_dir(sweep: Path) -> Path:
    return next((sweep / "cells").iterdir())


def _sweep_json(sweep: Path) -> Path:
    return sweep / "sweep.json"


def _rewrite(path: Path, text: str | bytes) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _into_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _drop_a_cell_field(sweep: Path) -> None:
    doc = json.loads(_sweep_json(sweep).read_text())
    del doc["cells"][0]["name"]
    _sweep_json(sweep).write_text(json.dumps(doc))


def _forget_runs(sweep: Path) -> None:
    doc = json.loads(_sweep_json(sweep).read_text())
    doc["parent_run_id"] = doc["experiment_id"] = None  # adopted from mlflow.json when read
    _sweep_json(sweep).write_text(json.dumps(doc))


GARBAGE = bytes(range(128, 256)) * 4  # not UTF-8, not JSON

# (case, how to damage a copy of the sweep, text the message must hold: the damaged path)
DAMAGE = [
    ("sweep.json cut short", lambda d: _rewrite(_sweep_json(d), _sweep_json(d).read_text()[:200]), "sweep.json"),
    ("sweep.json empty", lambda d: _rewrite(_sweep_json(d), ""), "sweep.json"),
    ("sweep.json binary", lambda d: _rewrite(_sweep_json(d), GARBAGE), "sweep.json"),
    ("sweep.json a JSON list", lambda d: _rewrite(_sweep_json(d), "[1, 2, 3]"), "sweep.json"),
    ("sweep.json another program's", lambda d: _rewrite(_sweep_json(d), '{"name": "x", "items": []}'),
     "sweep.json"),
    ("sweep.json cell without a name", _drop_a_cell_field, "sweep.json"),
    ("sweep.json a directory", lambda d: _into_directory(_sweep_json(d)), "sweep.json"),
    ("cells directory missing", lambda d: shutil.rmtree(d / "cells"), "cells"),
    ("sweep directory a file", lambda d: (shutil.rmtree(d), d.write_text("not a directory")), "/damaged"),
    ("result.json cut short", lambda d: _rewrite(_cell_dir(d) / "result.json", '{"summary": {"throughput'),
     "result.json"),
    ("result.json binary", lambda d: _rewrite(_cell_dir(d) / "result.json", GARBAGE), "result.json"),
    ("result.json a JSON list", lambda d: _rewrite(_cell_dir(d) / "result.json", "[]"), "result.json"),
    ("result.json a directory", lambda d: _into_directory(_cell_dir(d) / "result.json"), "result.json"),
    ("mlflow.json binary, run ids not in sweep.json", lambda d: (_rewrite(d / "mlflow.json", GARBAGE),
                                                                _forget_runs(d)), "mlflow.json"),
]
# The commands that read a cell's result (status reads the document; it reports only when asked).
COMMANDS = {
    "launcher": lambda d, root: launcher_main([*FAST, f"output_root={root}", f"sweep_dir={d}"]),
    "status": lambda d, root: status_main([str(d), "--report"]),
    "report": lambda d, root: report_main([str(d)]),
    "sync": lambda d, root: sync_main([str(d)]),
    "compare": lambda d, root: report_main(["--compare", str(root / "good"), str(d)]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("case", "damage", "where"), DAMAGE, ids=[c[0] for c in DAMAGE])
def test_a_damaged_sweep_gets_one_paragraph(finished, tmp_path, capsys, command, case, damage, where):
    shutil.copytree(finished, tmp_path / "good")
    damaged = tmp_path / "damaged"
    shutil.copytree(finished, damaged)
    mlflow_db = finished.parent / "mlflow.db"  # the store the copies' runs live in
    damage(damaged)
    capsys.readouterr()
    code = COMMANDS[command](damaged, tmp_path)
    out = capsys.readouterr()
    assert code != 0, out.out + out.err
    assert "Traceback" not in out.err + out.out
    message = out.err.strip()
    assert message.startswith("error:") and where in message, message
    assert "Fix:" in message or "pass " in message, message  # what to do
    assert mlflow_db.exists()


def test_unwritable_paths_get_one_paragraph(finished, tmp_path, capsys):
    # The launcher refuses before anything exists; the report's --out is checked when it writes.
    assert launcher_main([*FAST, "output_root=/proc/forbidden"]) == 2
    err = capsys.readouterr().err
    assert "output_root='/proc/forbidden'" in err and "Fix:" in err and "Traceback" not in err
    code = report_main(["--experiment", "ddp-vs-fsdp", "--tracking-uri", f"sqlite:///{finished.parent / 'mlflow.db'}",
                        "--out", "/proc/forbidden/report"])
    err = capsys.readouterr().err
    assert code == 2 and "/proc/forbidden" in err and "Fix:" in err and "Traceback" not in err, err


def test_a_command_on_a_directory_without_a_sweep(tmp_path, capsys):
    for main in (status_main, sync_main, report_main):
        assert main([str(tmp_path / "nowhere")]) == 2
        err = capsys.readouterr().err
        assert "holds no sweep.json" in err and "Traceback" not in err
    assert report_main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_the_corpus_covers_each_kind_of_damage():
    assert len(DAMAGE) >= 12 and os.sep  # truncated, empty, binary, foreign, missing and unreadable files
