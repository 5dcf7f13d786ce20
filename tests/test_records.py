"""Every record kind, damaged three ways (cut short, JSON of another shape, NaN), is named and set
aside with every good entry still used (contract/records.py); and three health probes and two
sweeps started in the same second take five folders and keep five records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract import records
from launcher.forecast import fabric, forecastrecord
from launcher.plan import fitcache
from launcher.report import healthledger, noisefloor
from launcher.report.collect import collect
from launcher.state import StateError, SweepState
from tests.conftest import FAST
from tests.test_compare import BASE, make_sweep

DAMAGES = ("cut short", "another shape", "NaN")


# ---- keyed records: the entries of key "a" (and a's good list items) are read as if nothing were damaged

def _floor(cv: float) -> dict:
    return {"cv": {"throughput": cv}, "df": 4, "configurations": 1, "measured_at": "2026-11-28"}


def _fabric(cluster: str) -> dict:
    return {"identity": {"cluster": cluster, "shape": "2x1"}, "sweep": "s", "measured_at": "t",
            "result": {"measured_at": "t", "points": [1.0, 2.0]}}


def _drift(i: int) -> dict:
    return {"metric": "throughput", "d2": 0.0004 * (i + 1), "within": 0.0001, "pair": f"p{i}", "at": "2026-11-28"}


def _forecast(i: int) -> dict:
    return {"sweep": f"s{i}", "cell": "c", "kind": "loo", "predicted": 10.0 + i, "measured": 11.0,
            "log_error": math.log((10.0 + i) / 11.0), "at": "2026-11-28"}


# name: (file, the record undamaged, how its readers read key "a", the check its writers update with)
KEYED = {
    "fabrics.json": (fabric.KEPT_FILE, {"a 2x1": _fabric("a"), "b 2x1": _fabric("b")},
                     lambda root: (fabric.kept(root, {"cluster": "a", "shape": "2x1"}) or {}).get("result"),
                     fabric._entry),
    "noise-floor.json": (noisefloor.FLOOR_FILE, {"a": _floor(0.01), "b": _floor(0.02)},
                         lambda root: noisefloor.load(root, "a"), noisefloor._floor_entry),
    "sweep-drift.json": (noisefloor.DRIFT_FILE, {"a": [_drift(i) for i in range(4)], "b": [_drift(9)]},
                         lambda root: noisefloor.load_drift(root, "a"), noisefloor._drift_entry),
    "forecast-errors.json": (forecastrecord.RECORD_FILE, {"a": [_forecast(i) for i in range(4)], "b": [_forecast(9)]},
                             lambda root: forecastrecord.errors(root, "a"), forecastrecord._entry),
}


def _damaged_keyed(record: dict, damage: str) -> tuple[str, dict]:
    """(the damaged file's text, the record as it reads once the damaged entry is set aside): the
    first key is read, and must read as if nothing were damaged."""
    good = json.loads(json.dumps(record))
    if damage == "cut short":  # cut inside b, the last key: every entry before the cut stays readable
        return json.dumps(record, indent=1)[:-30], good
    bad = json.loads(json.dumps(record))
    first, last = list(record)
    foreign = [1, 2] if damage == "another shape" else None
    if not isinstance(bad[first], list):  # one keyed entry: the last key's whole entry damaged
        bad[last] = {"other": "shape"} if foreign else {**bad[last], "x": math.nan}
        del good[last]
    else:  # a list of entries: the first key's second entry damaged
        bad[first][1] = foreign if foreign else {**bad[first][1], "d2": math.nan, "log_error": math.nan}
        del good[first][1]
    return json.dumps(bad, indent=1), good


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", KEYED)
def test_a_keyed_record_damaged_is_named_and_set_aside_and_every_good_entry_used(kind, damage, tmp_path, capsys):
    name, record, read_a, check = KEYED[kind]
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / name).write_text(json.dumps(record))
    text, good = _damaged_keyed(record, damage)
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / name).write_text(text)
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / name).write_text(json.dumps(good))
    got = read_a(tmp_path / "damaged")
    err = capsys.readouterr().err
    assert got is not None and got == read_a(tmp_path / "good") and got != read_a(tmp_path / "nowhere"), err
    assert str(tmp_path / "damaged" / name) in err and "Traceback" not in err
    assert {"cut short": "cut short", "another shape": "another shape", "NaN": "NaN"}[damage] in err, err
    # Nothing is lost: a file cut short is kept aside whole; an update keeps a damaged entry aside.
    assert records.update_keyed(tmp_path / "damaged" / name, lambda r: r, check)
    kept = json.loads((tmp_path / "damaged" / name).read_text())
    assert read_a(tmp_path / "damaged") == got and set(kept) <= set(record)
    (aside,) = (tmp_path / "damaged").glob(f"{name}.damaged-*")
    assert aside.read_text() == text if damage == "cut short" else json.loads(aside.read_text())


# ---- line records: the health ledger --------------------------------------------------------------

def _probe(i: int) -> dict:
    nodes = {f"n{j}": {"figures": {"matmul_gflops": 100.0 + j}, "repeats": {"matmul_gflops": [100.0 + j]}}
             for j in range(3)}
    return {"cluster": "local:x", "measured_at": f"2026-11-2{i}T03:00:00", "nodes": nodes, "pairs": {"n0-n1": 9.0},
            "asked": {}, "verdicts": {"flagged": [], "slow_nodes": {}, "slow_links": {}, "dcgm_failed": {},
                                      "note": "", "judged": True}}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_ledger_line_damaged_is_named_and_set_aside_and_every_good_probe_used(damage, tmp_path, capsys):
    lines = [json.dumps(_probe(i)) for i in range(4)]
    nan = _probe(1)
    nan["nodes"]["n2"]["figures"]["matmul_gflops"] = math.nan
    lines[1] = {"cut short": lines[1][:70], "another shape": json.dumps([_probe(1)]), "NaN": json.dumps(nan)}[damage]
    path = tmp_path / "health-local_x.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = healthledger.read_ledger(path)
    err = capsys.readouterr().err
    assert str(path) in err and "line 2" in err and "Traceback" not in err, err
    assert [n for n, _ in read.records] == ([1, 2, 3, 4] if damage == "NaN" else [1, 3, 4])  # every good probe
    if damage == "NaN":  # the figure alone set aside, the rest of its probe kept
        assert read.records[1][1]["nodes"]["n2"]["figures"]["matmul_gflops"] is None
        assert read.records[1][1]["nodes"]["n1"]["figures"]["matmul_gflops"] == 101.0
    else:
        assert read.damaged[0][0] == 2 and path.read_text().splitlines()[1] == lines[1]  # left in the file


# ---- the fit cache: one file an entry ---------------------------------------------------------------

@pytest.mark.parametrize("damage", DAMAGES)
def test_a_fit_cache_entry_damaged_is_named_and_read_as_a_miss_and_the_others_used(damage, tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    value = {"shapes": [[[4, 4], 16]], "activations": 64, "in_unit": [True]}
    fitcache.write("good", value)
    fitcache.write("bad", value)
    bad = fitcache.directory() / "bad.json"
    bad.write_text({"cut short": bad.read_text()[:20], "another shape": '{"flops_per_sample": 1}',
                    "NaN": bad.read_text().replace("64", "NaN")}[damage])
    assert fitcache.read("bad", fitcache.ANALYSIS) is None
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err, err
    assert fitcache.read("good", fitcache.ANALYSIS) == value


# ---- documents: sweep.json and a cell's result.json ------------------------------------------------

def _damage_document(path: Path, damage: str, nan_at: tuple[str, ...]) -> None:
    data = json.loads(path.read_text())
    if damage == "cut short":
        path.write_text(path.read_text()[:100])
    elif damage == "another shape":
        path.write_text(json.dumps([data]))
    else:
        inner = data
        for key in nan_at[:-1]:
            inner = inner[key]
        inner[nan_at[-1]] = math.nan
        path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_result_damaged_is_named_and_the_other_cells_results_used(damage, tmp_path, capsys):
    sweep = make_sweep(tmp_path, "s", BASE, runs=1)
    state = SweepState.load(sweep)
    damaged, *others = state.cells
    path = state.cell_dir(damaged) / "result.json"
    _damage_document(path, damage, ("summary", "peak_rss_gib"))
    if damage == "NaN":  # the figure set aside, the rest of the cell's result and every other cell used
        rows = {r["cell"]: r for r in collect(state)}
        assert rows[damaged.name]["peak_rss_gib"] is None and rows[damaged.name]["throughput_samples_per_s"] > 0
        assert "summary.peak_rss_gib" in capsys.readouterr().err
    else:  # a document cut short or foreign is refused naming it, and left as it is for a person
        text = path.read_text()
        with pytest.raises(StateError, match="result.json"):
            state.read_result(damaged)
        assert path.read_text() == text
    assert all(state.read_result(c)["summary"]["throughput_samples_per_s"] > 0 for c in others)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_sweep_document_damaged_is_named_and_its_cells_records_kept(damage, tmp_path, capsys):
    sweep = make_sweep(tmp_path, "s", BASE, runs=1)
    _damage_document(sweep / "sweep.json", damage, ("cells", 0, "predicted_state_bytes"))  # type: ignore[arg-type]
    text = (sweep / "sweep.json").read_text()
    if damage == "NaN":
        state = SweepState.load(sweep)
        assert state.cells[0].predicted_state_bytes is None and len(collect(state)) == len(BASE)
        assert "cells[0].predicted_state_bytes" in capsys.readouterr().err
    else:
        with pytest.raises(StateError, match="sweep.json"):
            SweepState.load(sweep)
        assert (sweep / "sweep.json").read_text() == text
    results = list((sweep / "cells").glob("*/result.json"))
    assert len(results) == len(BASE) and all(records.read_document(p, "a result", "-") for p in results)


# ---- five processes started in the same second, five folders, five records --------------------------

def _pinned(module: str, stamp: str, *argv: str) -> list[str]:
    """``python -m module argv`` with every folder's time stamp ``stamp``: as if each process reached
    its folder in the same second, whatever the machine's load."""
    code = ("import runpy, sys; from contract import records; made = records.new_folder; "
            f"records.new_folder = lambda parent, stamp=None: made(parent, stamp or {stamp!r}); "
            f"sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__')")
    return [sys.executable, "-c", code, *argv]


@pytest.mark.slow
def test_three_probes_and_two_sweeps_started_in_the_same_second_keep_five_folders_and_five_records(tmp_path):
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    root = f"output_root={tmp_path}"
    probe = ["cluster=local", "health.nodes=1", "health.repeats=1", "tracking.enabled=false", root]
    sweep = [*FAST, "tracking=off", root]
    procs = [subprocess.Popen(_pinned("launcher.health", stamp, *probe), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    # The same command twice: without --allow-concurrent the second may (rightly) be refused as a
    # duplicate of the first, depending on which reaches its record first.
    procs += [subprocess.Popen(_pinned("launcher", stamp, "--allow-concurrent", *sweep), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, "\n".join(outs)
    probes = sorted((tmp_path / "health").iterdir())
    sweeps = sorted(p.parent for p in tmp_path.glob("*/sweep.json"))
    assert [p.name for p in probes] == [stamp, f"{stamp}-2", f"{stamp}-3"]
    assert [p.name for p in sweeps] == [stamp, f"{stamp}-2"]
    (ledger,) = tmp_path.glob("health-*.jsonl")
    kept = [rec["asked"]["folder"] for rec in healthledger.read(ledger)]
    assert sorted(kept) == [str(p) for p in probes]  # three records, each its own probe's
    states = [SweepState.load(s) for s in sweeps]
    assert len({(s.name, s.sweep_id, s.sweep_dir) for s in states}) == 2
    assert all(s.cells[0].status.value == "done" and s.read_result(s.cells[0]) for s in states)


def test_a_lock_held_by_another_process_ends_the_wait_at_its_bound_naming_the_holder(tmp_path, monkeypatch):
    """A record's lock, and a turn at a cell's MLflow run, held by a process that does not let go: the
    wait ends at its bound with an error naming the holder (host:pid), and nothing is written."""
    from contract import cell_run

    record, run_dir = tmp_path / "sweep.json", tmp_path / "cell"
    run_dir.mkdir()
    hold = ("import contextlib, pathlib, sys, time; from contract import records; stack = contextlib.ExitStack(); "
            "[stack.enter_context(records.holding(pathlib.Path(p), wait_s=0)) for p in sys.argv[1:]]; "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / ".sweep.json.lock"),
                               str(run_dir / cell_run.LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(records.RecordError, match=rf"held by \S+:{holder.pid} for more than 0.3 s"):
            with records.locked(record, wait_s=0.3):
                record.write_text("{}")
        monkeypatch.setattr(cell_run, "TURN_WAIT_S", 0.3)
        with pytest.raises(records.RecordError, match=rf"the cell's MLflow run .*held by \S+:{holder.pid}"):
            cell_run.remember_run(run_dir, "r1")
        assert time.monotonic() - started < 5
        assert not record.exists() and not (run_dir / cell_run.RUN_ID_FILE).exists()
    finally:
        holder.kill()
        holder.wait()
