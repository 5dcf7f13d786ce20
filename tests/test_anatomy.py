"""A step's anatomy on real gloo ranks: known costs injected into forward, backward and a
communication land in their parts, the parts add up to the step, the explanation of a slowed cell
names the injected part, and every strategy's measured bytes match its theory."""

import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from contract import metrics
from contract.spec import Layout
from jobs import anatomy
from launcher.plan import fit, traffic
from launcher.report.explain import explain
from tests.ranks import TINY_CNN, TINY_GPT, make_spec, run_ranks

pytestmark = pytest.mark.slow

SLEEP_S = 0.03  # the injected cost: far above the tiny model's own step on 2 cores


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP_S)
        return grad


class Injected(nn.Module):
    """A tiny token model that sleeps a fixed time in forward, in backward, or inside a collective
    of its own, wrapped and marked ``comm::all_reduce`` as jobs/anatomy.py reads wrapped collectives
    (its result arrives ``SLEEP_S`` late, as over a slow link)."""

    def __init__(self, vocab_size: int = 128, d_model: int = 16, where: str = "none"):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.where = where

    def forward(self, x):
        if self.where == "forward":
            time.sleep(SLEEP_S)
        h = self.embed(x)
        if self.where == "backward":
            h = _SleepInBackward.apply(h)
        if self.where == "comm":
            with torch.profiler.record_function("comm::all_reduce"):
                flag = torch.ones(1)
                torch.distributed.all_reduce(flag)
                time.sleep(SLEEP_S)
        return self.head(h)


def _model(where: str) -> dict:
    return dict(name="custom", _target_=f"{__name__}.Injected", input="tokens", seq_len=16, vocab_size=128,
                params={"vocab_size": 128, "where": where})


def _summaries(tmp_path, specs, world_size: int, nodes: int = 1) -> list[dict]:
    results = run_ranks(specs, world_size, nodes=nodes, timeout_s=120)
    out = []
    for per_rank in results:
        errors = [r["error"] for r in per_rank if "error" in r]
        assert not errors, errors[0]
        out.append(per_rank[0]["summary"])
    return out


def _row(name: str, summary: dict) -> dict:
    return {"cell": name, "strategy": "ddp", "settings": {"model": name}, **summary}


def test_injected_costs_land_in_their_parts_and_the_explanation_names_them(tmp_path):
    wheres = ["none", "forward", "backward", "comm"]
    specs = [make_spec(tmp_path / w, model=_model(w), steps=4, warmup_steps=1, comm_probe_steps=3,
                       local_probe_steps=0, optimizer="sgd") for w in wheres]
    got = dict(zip(wheres, _summaries(tmp_path, specs, 2), strict=True))
    injected_ms = 1e3 * SLEEP_S
    part_of = {"forward": "anatomy_forward_ms", "backward": "anatomy_backward_ms", "comm": "comm_all_reduce_exposed_ms"}
    for where, summary in got.items():
        total = sum(summary.get(p, 0.0) for p in metrics.STEP_PARTS)
        assert total == pytest.approx(summary[metrics.ANATOMY_STEP], rel=0.05), where
        if where == "none":
            continue
        added = summary[part_of[where]] - got["none"][part_of[where]]
        if where == "comm":
            # A collective also waits for the later rank to arrive: on a loaded 2-core machine that
            # skew adds to the injected sleep (up to 7 ms of 30 seen in CI), never takes from it.
            assert 0.8 * injected_ms - 2.0 <= added <= 1.5 * injected_ms, (where, added)
        else:
            assert added == pytest.approx(injected_ms, rel=0.2, abs=2.0), (where, added)
        why = explain(_row(where, summary), _row("none", got["none"]), where, "plain")
        assert why is not None and why.named[0].name == part_of[where], (where, why and why.text())
        assert abs(why.probe_delta_ms - sum(p.delta_ms for p in why.named) - why.remainder_ms
                   - (why.unattributed.delta_ms if why.unattributed else 0.0)) < 1e-6


CASES_2 = [("ddp", "fp32", None), ("ddp", "bf16", None), ("fsdp", "fp32", None), ("fsdp", "bf16", "params"),
           ("zero2", "fp32", None), ("zero2", "bf16", "params")]
CASES_4 = [("ddp", "fp32", None), ("fsdp", "bf16", "params"), ("zero2", "fp32", None),
           ("hsdp", "fp32", None), ("hsdp", "bf16", "params")]


def _theory(spec) -> dict[str, int]:
    shapes, _, in_unit = fit.analyse(spec.model, spec.train.batch_size, None, False)
    params = [traffic.Param(shape, inside) for (shape, _), inside in zip(shapes, in_unit, strict=True)]
    return traffic.bytes_per_step(params, spec.strategy, spec.precision, spec.layout, spec.train.grad_accum_steps)


@pytest.mark.parametrize("world_size, cases", [(2, CASES_2), (4, CASES_4)])
def test_measured_bytes_match_the_theory(tmp_path, world_size, cases):
    nodes = 2 if world_size == 4 else 1  # hsdp: 2 nodes of 2 ranks (the others do not mind)
    specs = [make_spec(tmp_path / f"{s}-{p}", strategy=s, precision=p, world_size=world_size, nodes=nodes,
                       precision_args={"mode": mode} if mode else None, steps=2, warmup_steps=1, comm_probe_steps=1,
                       local_probe_steps=0, optimizer="sgd", model=TINY_GPT) for s, p, mode in cases]
    for spec, summary, case in zip(specs, _summaries(tmp_path, specs, world_size, nodes), cases, strict=True):
        theory = _theory(spec)
        assert theory, case
        for kind in metrics.COLLECTIVE_KINDS:
            measured = summary.get(metrics.comm_bytes(kind), 0.0)
            expected = theory.get(kind, 0)
            assert measured == pytest.approx(expected, rel=traffic.TOLERANCE), (case, kind, measured, expected)


def _event(name, start_us, end_us, shapes, dtypes):
    """One profiler event as jobs/anatomy.py reads it (name, time range, recorded inputs), literal
    values copied from a gloo profile of DDP then FSDP on 2 ranks."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=end_us),
                           input_shapes=shapes, input_dtypes=dtypes)


def test_a_collective_counts_in_the_step_that_issued_it_even_where_gloo_recorded_it_late_or_not_at_all():
    ddp_op = _event("c10d::allreduce_", 6203.8, 6280.8, [[], [], [], [], [], []],
                    ["TensorList", "", "", "", "Scalar", "Scalar"])
    late = _event("gloo:all_reduce", 6474.5, 31191.3, [[30080]], ["float"])  # ended long after the window
    gather_op = _event("c10d::_allgather_base_", 7000.0, 7100.0, [[4672], [2336], [], [], []],
                       ["c10::BFloat16", "c10::BFloat16", "", "Scalar", "Scalar"])  # gloo's event lost
    found = anatomy.collectives_of([ddp_op, late, gather_op], on_gpu=False)
    window = (6000.0, 9000.0)
    assert [(c.kind, c.bytes, c.issued_in(window)) for c in found] == [
        ("all_reduce", 30080 * 4, True), ("all_gather", 4672 * 2, True)]
    assert found[0].span == (6474.5, 31191.3) and found[1].span == (7000.0, 7100.0)


def test_theory_of_each_strategy_on_a_known_model():
    # Two parameters of 8x4 in one unit, one root parameter of 6x2; fp32; 4 ranks on 2 nodes.
    from contract.spec import Precision, PrecisionMode, PrecisionSpec, Sharding, Strategy, StrategySpec

    params = [traffic.Param((8, 4), True), traffic.Param((8, 4), True), traffic.Param((6, 2), False)]
    layout = Layout(nodes=2, tasks_per_node=2)
    fp32, bf16 = PrecisionSpec(), PrecisionSpec(name=Precision.bf16, mode=PrecisionMode.params)
    fsdp = StrategySpec(name=Strategy.fsdp)
    padded = 32 + 32 + 8 * 2  # 6 rows padded to 8 over 4 shards
    assert traffic.bytes_per_step(params, StrategySpec(), fp32, layout) == {"all_reduce": 76 * 4}
    assert traffic.bytes_per_step(params, fsdp, fp32, layout) == {"all_gather": (padded + 64) * 4,
                                                                  "reduce_scatter": padded * 4}
    assert traffic.bytes_per_step(params, fsdp, bf16, layout, accum_steps=2) == {
        "all_gather": (padded + 64) * 2 * 2, "reduce_scatter": padded * 4}
    zero2 = StrategySpec(name=Strategy.fsdp, sharding=Sharding.grad_op)
    assert traffic.bytes_per_step(params, zero2, fp32, layout)["all_gather"] == padded * 4
    hsdp = StrategySpec(name=Strategy.fsdp, dp_replicate=-1, dp_shard=layout.tasks_per_node)
    per_node = 32 + 32 + 6 * 2  # 6 rows split over 2 shards: no padding
    assert traffic.bytes_per_step(params, hsdp, fp32, layout) == {
        "all_gather": (per_node + 64) * 4, "reduce_scatter": per_node * 4, "all_reduce": per_node // 2 * 4}
    noshard = StrategySpec(name=Strategy.fsdp, dp_replicate=-1, dp_shard=1)
    assert traffic.bytes_per_step(params, noshard, fp32, layout) == {"all_reduce": 76 * 4}


@pytest.mark.parametrize("part, strategy, cell_settings", [
    ("comm_all_gather_exposed_ms", "fsdp", {"strategy": "fsdp", "nodes": "2"}),
    ("comm_reduce_scatter_exposed_ms", "fsdp", {"strategy": "fsdp", "nodes": "2"}),
    ("comm_all_reduce_exposed_ms", "ddp", {"strategy": "ddp", "nodes": "2", "batch_size": "4"}),
    ("anatomy_backward_ms", "fsdp", {"strategy": "fsdp", "activation_checkpointing": "true"}),
])
def test_the_next_sweep_is_a_command_plan_accepts_as_printed(capsys, part, strategy, cell_settings):
    from launcher.__main__ import main
    from launcher.report.explain import Part, next_step

    row = {"cell": " ".join(f"{k}={v}" for k, v in cell_settings.items()), "strategy": strategy,
           "settings": {**cell_settings, "run": "1", "output_root": "/tmp/x"}}
    advice = next_step(row, [Part(part, 10.0, 5.0, 15.0)])
    assert advice is not None and "Try: `" in advice, advice
    command = advice.split("Try: `", 1)[1].rstrip("`")
    assert command.startswith("python -m launcher --plan -m ")
    assert main(command.split()[3:]) == 0, capsys.readouterr()
    assert "cell(s):" in capsys.readouterr().out


def test_ddp_broadcasts_batchnorm_buffers_as_the_theory_says(tmp_path):
    """DDP with broadcast_buffers (its default) broadcasts the BatchNorm statistics once per optimizer
    step (accumulation adds none); the theory counts them, so they are no mismatch."""
    spec = make_spec(tmp_path / "cnn", world_size=2, model=TINY_CNN, steps=2, warmup_steps=1, comm_probe_steps=2,
                     local_probe_steps=0, optimizer="sgd", grad_accum_steps=2)
    (summary,) = _summaries(tmp_path, [spec], 2)
    shapes, _, in_unit = fit.analyse(spec.model, spec.train.batch_size, None, False)
    params = [traffic.Param(shape, inside) for (shape, _), inside in zip(shapes, in_unit, strict=True)]
    buffers = fit.count_buffer_bytes(spec.model)
    theory = traffic.bytes_per_step(params, spec.strategy, spec.precision, spec.layout, 2, buffers)
    assert buffers > 0 and theory["broadcast"] == buffers
    assert summary[metrics.comm_bytes("broadcast")] == pytest.approx(buffers, rel=traffic.TOLERANCE)
