"""Declared nodes (cluster.declared=true): --plan and the fit check for hardware nobody is asked
about, and every --plan example of the README and docs/ run as printed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from launcher.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
XL_ON_24GB = ["--plan", "-m", "cluster.declared=true", "cluster.gpus_per_node=2", "cluster.tasks_per_node=2",
              "cluster.gpu_mem_gib=22.35", "model=gpt2-xl", "batch_size=1", "optimizer=adamw", "runs=1"]


def test_gpt2_xl_at_batch_1_on_24gb_gpus_fits_fsdp_over_two_not_ddp(tmp_path, capsys):
    """REFERENCE.md's memory-accounting example: DDP runs out of memory even at batch size 1 on two
    24 GB GPUs, FSDP trains it. A what-if answered per configuration, without any cluster, at exit 0;
    nothing created."""
    out = f"output_root={tmp_path / 'out'}"
    assert main([*XL_ON_24GB, "strategy=ddp,fsdp", out]) == 0
    plan = capsys.readouterr().out
    ddp = next(line for line in plan.splitlines() if line.startswith("| 0 | strategy=ddp |"))
    fsdp = next(line for line in plan.splitlines() if line.startswith("| 1 | strategy=fsdp |"))
    assert "| 11.61 GiB | 23.21 GiB | 4.90 GiB | 28.30 GiB | 22.35 GiB | does not fit |" in ddp
    assert "| 5.80 GiB | 11.61 GiB | 4.90 GiB | 16.69 GiB | 22.35 GiB | fits |" in fsdp
    assert "1 cell(s) do not fit their GPU's memory (strategy=ddp): a run of this grid refuses them" in plan
    assert "Declared nodes (cluster.declared=true)" in plan
    assert not (tmp_path / "out").exists()


def test_declared_gpus_must_say_their_memory_and_are_never_submitted(tmp_path, capsys):
    out = f"output_root={tmp_path / 'out'}"
    assert main(["--plan", "cluster.declared=true", "cluster.gpus_per_node=2", "cluster.tasks_per_node=2", out]) == 2
    assert "cluster.gpu_mem_gib=22.35" in capsys.readouterr().err
    assert main(["--plan", "cluster.declared=true", "cluster.gpus_per_node=1", "cluster.gpu_type=rtx9000", out]) == 2
    assert "cluster.gpu_type=rtx9000 names no GPU model whose memory is known" in capsys.readouterr().err
    # Without --plan: refused before anything is created, with the way to see the plan.
    assert main(["cluster.declared=true", "cluster.gpus_per_node=1", "cluster.gpu_type=h100", out]) == 2
    assert "add --plan" in capsys.readouterr().err and not (tmp_path / "out").exists()
    # A local what-if may name its GPUs' type; a live local cluster may not (only Slurm reads it).
    assert main(["--plan", "cluster.gpus_per_node=1", "cluster.gpu_type=h100", out]) == 2
    assert "cluster.gpu_type='h100': names nodes, and cluster=local runs every rank on this machine" in capsys.readouterr().err


def plan_examples() -> list[tuple[str, str, list[str]]]:
    """(document, command, the output printed under it) for every ``python -m launcher --plan`` in an
    indented block of README.md and docs/*.md; a command continues over lines ending in a backslash."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        block: list[str] = []
        for line in [*doc.read_text().splitlines(), ""]:
            if line.startswith("    "):
                block.append(line[4:])
                continue
            found += _commands(doc.name, block)
            block = []
    return found


def _commands(doc: str, block: list[str]) -> list[tuple[str, str, list[str]]]:
    joined: list[str] = []
    for line in block:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line.strip())
    out: list[tuple[str, str, list[str]]] = []
    for line in joined:
        if line.startswith("python -m launcher "):
            out.append((doc, line, []))
        elif out:
            out[-1][2].append(line)
    return [example for example in out if "--plan" in example[1].split()]


EXAMPLES = plan_examples()


def test_the_examples_are_found():
    examples = EXAMPLES
    assert len(examples) >= 4 and any("gpt2-xl" in c and "batch_size=1" in c for _, c, _ in examples)


@pytest.mark.parametrize("doc, command, printed", EXAMPLES, ids=[f"{d}:{i}" for i, (d, _, _) in enumerate(EXAMPLES)])
def test_every_plan_example_runs_as_printed(doc, command, printed, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # what a person gets anywhere: nothing of the checkout, nothing created
    refused = any(line.startswith("error:") for line in printed)
    assert main(shlex.split(command)[3:]) == (2 if refused else 0), capsys.readouterr().err
    said = capsys.readouterr()
    for line in printed:
        if line and line != "...":
            assert re.sub(r"\s+", " ", line) in re.sub(r"\s+", " ", said.out + said.err), (doc, line)
    assert not list(tmp_path.iterdir())
