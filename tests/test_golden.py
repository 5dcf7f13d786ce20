"""Golden files: the sbatch scripts and reproduce.sh of fixed cells, rendered as a sweep renders them
(submitit's own rendering for sbatch: launcher/cluster/slurm/submit.py's ``sbatch_script``; each
backend's ``rank_launch`` in ``write_reproduce``) and compared line by line with the files in
tests/data/golden/, as submitit's tests compare ``_sbatch_test_record.txt``. A change of submitit,
of a setting's rendering or of a backend's launch command shows here as the lines that changed.

What legitimately varies between machines and runs (the test's directory, this interpreter's path)
is replaced by a name in one place, :func:`masked`, before the comparison.

When a change is meant: ``GOLDEN_UPDATE=1 python -m pytest tests/test_golden.py`` writes the files
again from what the code renders now; review their diff before committing it. A missing file fails
with the same hint, never written in silence."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from launcher.cluster.backends import backend_for
from launcher.cluster.base import write_reproduce
from launcher.plan import grid, planner
from launcher.plan.cell import Cell

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"

# Each golden file's cells: the overrides of one grid (gpt_tiny, so that planning builds a small model).
SLURM_ARRAY = ["cluster=slurm", "runs=2", "nodes=2", "cluster.tasks_per_node=4", "cluster.gpus_per_node=4",
               "cluster.gpu_type=h100", "cluster.partition=gpu", "cluster.account=bench", "cluster.exclude=node9",
               "cluster.srun_args=['--cpu-bind=cores']", "cluster.setup=['module load cuda/12.4']"]
SLURM_PYXIS = ["cluster=slurm", "runs=1", "cluster.qos=high", "cluster.nodelist='node[1-2]'", "nodes=2",
               "cluster.container.runtime=pyxis", "cluster.container.image='nvcr.io#nvidia/pytorch:24.05-py3'",
               "cluster.container.mounts=['/data:/data']", "cluster.timeout_min=30", "cluster.signal_delay_s=120",
               "+cluster.additional_parameters.reservation=bench"]
ONE_MACHINE = ["runs=1", "cluster.tasks_per_node=2"]


def masked(text: str, tmp: Path) -> str:
    """``text`` with what varies between machines and runs named instead: the test's directory
    (``<TMP>``, resolved or not) and this interpreter (``<PYTHON>``, quoted or not)."""
    for value, name in ((str(tmp.resolve()), "<TMP>"), (str(tmp), "<TMP>"), (shlex.quote(sys.executable), "<PYTHON>"),
                        (sys.executable, "<PYTHON>")):
        text = text.replace(value, name)
    return text


def _cells(tmp: Path, *overrides: str) -> list[Cell]:
    points, swept = grid.expand(["model=gpt_tiny", f"output_root={tmp}", *overrides], True)
    return planner.plan(grid.compose(points, swept))


def _compare(name: str, rendered: str) -> None:
    """``rendered`` against the golden file ``name``: the lines that differ, and how to accept them."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered)
        return
    fix = f"if the change is meant: GOLDEN_UPDATE=1 python -m pytest {Path(__file__).name}, then review git diff {path}"
    assert path.exists(), f"{path} is missing. Fix: {fix}"
    recorded = path.read_text()
    new, old = rendered.splitlines(), recorded.splitlines()
    changes = [f"line {k + 1}: {b!r} -> {a!r}" for k, (a, b) in enumerate(zip(new, old, strict=False)) if a != b]
    changes += [f"line {k + 1}: added {a!r}" for k, a in enumerate(new[len(old):], len(old))]
    changes += [f"line {k + 1}: removed {b!r}" for k, b in enumerate(old[len(new):], len(new))]
    assert not changes, f"{name} differs from the golden file:\n" + "\n".join(changes) + f"\nFix: {fix}"


@pytest.mark.parametrize("name, overrides", [("slurm-array.sbatch", SLURM_ARRAY), ("slurm-pyxis.sbatch", SLURM_PYXIS)])
def test_the_sbatch_script_of_fixed_cells_is_the_golden_one(name, overrides, tmp_path):
    """One sbatch call for the cells (an array of 2 runs; one cell in a pyxis container on named
    nodes), as --plan shows it and sbatch gets it."""
    from launcher.cluster.slurm import submit

    cells = _cells(tmp_path, *overrides)
    assert [len(group) for group in submit.groups(cells, None)] == [len(cells)]
    script = submit.sbatch_script(cells, tmp_path / "sweep" / "submitit", "sweep-golden")
    _compare(name, masked(script, tmp_path))


@pytest.mark.parametrize("backend, overrides", [("slurm", SLURM_ARRAY), ("local", ONE_MACHINE),
                                                ("torchrun", ["cluster=torchrun", *ONE_MACHINE])])
def test_a_cells_reproduce_sh_is_the_golden_one(backend, overrides, tmp_path):
    """Each backend's reproduce.sh of a fixed cell: the refusal of a cell's own directory, and its
    ranks' launch before the cell's spec.json."""
    cell = _cells(tmp_path, *overrides)[0]
    assert cell.cluster.name == backend
    path = write_reproduce(tmp_path / "sweep" / "cells" / cell.dirname, backend_for(backend).rank_launch(cell))
    _compare(f"{backend}-reproduce.sh", masked(path.read_text(), tmp_path))


def test_the_mask_names_what_varies_and_nothing_else(tmp_path):
    text = f"{tmp_path}/a {tmp_path.resolve()}/b {shlex.quote(sys.executable)} -m jobs; node[1-2] 60 min"
    assert masked(text, tmp_path) == "<TMP>/a <TMP>/b <PYTHON> -m jobs; node[1-2] 60 min"
