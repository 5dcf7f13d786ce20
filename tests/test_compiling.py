"""The worker's compile path (jobs/compiling.py), on CPU: inductor's real code generation (a C++
compiler), the same graphs a GPU gets, and the compile census of bench/census.py at real depth.

What a GPU alone can show (the kernels' speed) is the GPU check's (scripts/gpu-check); what these
pin is that compiling changes no figure a cell reports and leaves nothing eager that it should not."""

from __future__ import annotations

import math
import shutil

import pytest

from bench import census
from tests.ranks import make_spec, run_ranks
from tests.test_strategies import ok

STEPS = 4


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor's CPU code generation needs a C++ compiler")
def test_the_compiled_step_trains_as_the_eager_one_under_ddp_and_fsdp(tmp_path):
    """gpt_tiny in bf16 at one rank: DDP compiled whole (the model and the loss in one function),
    FSDP by regions (each block before sharding, the embeddings and the head, the loss); the losses
    of every step equal the eager run's within bf16's rounding, and the tags say what was compiled."""
    specs = [make_spec(tmp_path / f"{strategy}-{compiled}", strategy=strategy, precision="bf16", world_size=1,
                       steps=STEPS, warmup_steps=1, compile=compiled, loss="full")
             for strategy in ("ddp", "fsdp") for compiled in (False, True)]
    results = [ok(r) for r in run_ranks(specs, 1, timeout_s=600)]
    by = {(s.strategy.name.value, s.train.compile): r for s, r in zip(specs, results, strict=True)}
    for strategy in ("ddp", "fsdp"):
        eager, compiled = by[(strategy, False)]["losses"], by[(strategy, True)]["losses"]
        assert len(compiled) == STEPS and all(math.isfinite(x) for x in compiled)
        assert compiled == pytest.approx(eager, rel=2e-2), (strategy, eager, compiled)
        tags = by[(strategy, True)]["tags"]
        assert tags["compile.scope"] == ("whole" if strategy == "ddp" else "regions")
        assert "compile.graphs_in_window" not in tags  # every graph was made in the warm-up
        assert by[(strategy, False)]["tags"]["compile.scope"] == "off"
    fsdp = by[("fsdp", True)]["tags"]
    assert fsdp["compile.units"] == "2" and fsdp["compile.regions"] == "embed,head"  # gpt_tiny: 2 blocks
    assert by[("ddp", True)]["tags"]["compile.ddp_single_graph"] == "true"


def test_the_census_finds_resnet50s_graphs_static_within_the_limit_and_nothing_eager(tmp_path):
    """ResNet-50 at its real depth, each side as the GPU check times it: no graph break in the model,
    no dynamic shapes, no layer eager, and FSDP's eight Bottleneck variants well inside the raised limit."""
    out = tmp_path / "census.json"
    assert census.main(["--models", "resnet50", "--json", str(out)]) == 0
    import json

    rows = {r["side"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"tuned", "ddp", "fsdp"}
    for row in rows.values():
        assert row["problems"] == [] and row["graphs"] >= 1 and row["dynamic_graphs"] == 0
    assert rows["fsdp"]["most_variants_of"] == "Bottleneck.forward" and rows["fsdp"]["most_variants"] == 8
    assert rows["fsdp"]["recompile_limit"] >= 16


def test_the_census_rules_fail_what_the_gpu_would_pay_for():
    ok_row = census.Row("m", "fsdp", graphs=4, most_variants=8, most_variants_of="Block.forward", recompile_limit=64)
    assert ok_row.problems() == []
    assert "within one of the recompile limit" in census.Row(
        "m", "fsdp", graphs=9, most_variants=7, most_variants_of="Bottleneck.forward", recompile_limit=8).problems()[0]
    assert "inside the model's forward" in census.Row(
        "m", "ddp", graphs=2, breaks_in_model=["jobs/models/gpt.py:80"], recompile_limit=64).problems()[0]
    assert "ran eager" in census.Row("m", "fsdp", graphs=3, eager_layers=["ln_f"], recompile_limit=64).problems()[0]
    assert census.Row("m", "ddp", recompile_limit=64).problems() == ["nothing was compiled"]


def test_the_report_says_what_was_compiled_and_a_recompile_inside_the_window():
    from launcher.report.markdown import _tuning_text

    rows = [{"cell": "strategy=ddp", "tuning.compile": "true", "compile.scope": "whole"},
            {"cell": "strategy=fsdp", "tuning.compile": "true", "compile.scope": "regions", "compile.graphs_in_window": "2"}]
    text = _tuning_text(rows)
    assert "Compiled as whole/regions" in text
    assert "**Graphs compiled inside the measured window**" in text and "strategy=fsdp (2)" in text
    assert "inside the measured window" not in _tuning_text(rows[:1])
