"""The parallel layout as one value (contract/parallel.py): the rule per strategy, its checks, and
the proof that the rule exists once: changed in one place, every consumer follows (the fit, the
traffic model, the forecasts' collectives, the FSDP mesh on a `fake` process group of 4 ranks,
data sharding and the summary's throughput)."""

from __future__ import annotations

import pytest

from contract.parallel import REPLICATE, SHARD, ParallelDims
from contract.spec import ConfigError, Layout, Sharding, Strategy, StrategySpec

FSDP = StrategySpec(name=Strategy.fsdp)
ONE_NODE_OF_4 = Layout(nodes=1, tasks_per_node=4)
SHAPES = [((10, 3), 4), ((7,), 4)]  # a 10x3 and a 7-element fp32 parameter


def _preset(name: str, tasks_per_node: int = 2) -> StrategySpec:
    from tests.ranks import preset_args

    return StrategySpec(**preset_args(name, tasks_per_node))


@pytest.mark.parametrize(("name", "expect"), [
    ("ddp", (4, 1, ())),
    ("fsdp", (1, 4, (SHARD,))),
    ("zero2", (1, 4, (SHARD,))),
    ("hsdp", (2, 2, (REPLICATE, SHARD))),
    ("fsdp_noshard", (4, 1, (REPLICATE, SHARD))),
    ("fsdp_offload", (1, 4, (SHARD,))),
])
def test_each_preset_is_degrees(name, expect):
    """The names are presets (launcher/conf/strategy/NAME.yaml) that set the degrees; the rule reads
    the degrees, and the label is read back from them."""
    strategy = _preset(name)
    strategy.validate()
    dims = ParallelDims.of(strategy, Layout(nodes=2, tasks_per_node=2))
    assert (dims.dp_replicate, dims.dp_shard, dims.mesh_dims) == expect
    assert dims.data_parallel == dims.world_size == 4 and dims.tp == 1
    assert dims.holds().params == dims.holds().optimizer == 1 / expect[1]
    assert dims.mesh_shape() == tuple({REPLICATE: expect[0], SHARD: expect[1]}[d] for d in expect[2])
    assert strategy.label == name.replace("fsdp_offload", "fsdp+offload")


@pytest.mark.parametrize(("degrees", "expect"), [
    (dict(dp_replicate=-1, dp_shard=2), (4, 2)),
    (dict(dp_replicate=2, dp_shard=-1), (2, 4)),
    (dict(dp_replicate=4, dp_shard=2), (4, 2)),
    (dict(dp_replicate=1, dp_shard=-1), (1, 8)),
])
def test_minus_one_is_the_ranks_the_others_leave(degrees, expect):
    dims = ParallelDims.of(StrategySpec(name=Strategy.fsdp, **degrees), Layout(nodes=2, tasks_per_node=4))
    assert (dims.dp_replicate, dims.dp_shard) == expect


def test_python_defaults_are_the_wrappers_whole_world():
    """Unset in code (every preset sets them), the data-parallel degrees are the wrapper's whole world."""
    assert StrategySpec().degrees() == {"dp_replicate": -1, "dp_shard": 1, "tp": 1}
    assert FSDP.degrees() == {"dp_replicate": 1, "dp_shard": -1, "tp": 1}


@pytest.mark.parametrize(("strategy", "layout", "setting", "words"), [
    (StrategySpec(name=Strategy.fsdp, dp_replicate=1, dp_shard=3), ONE_NODE_OF_4, "strategy.dp_shard",
     "does not divide the 4 ranks"),
    (StrategySpec(name=Strategy.fsdp, dp_replicate=2, dp_shard=3), Layout(nodes=2, tasks_per_node=4), "strategy",
     "does not divide the 8 ranks"),
    (StrategySpec(name=Strategy.fsdp, dp_replicate=2, dp_shard=1), ONE_NODE_OF_4, "strategy",
     "must cover the cell's 4 rank"),
    (StrategySpec(name=Strategy.fsdp, dp_replicate=-1, dp_shard=4), ONE_NODE_OF_4, "strategy.dp_replicate",
     "replicate group of one"),
    (FSDP, Layout(nodes=0, tasks_per_node=2), "nodes", "at least one node"),
    (FSDP, Layout(nodes=1, tasks_per_node=0), "cluster.tasks_per_node", "at least one rank"),
])
def test_degrees_refused_against_the_ranks_naming_the_setting(strategy, layout, setting, words):
    with pytest.raises(ConfigError) as refused:
        ParallelDims.of(strategy, layout)
    assert refused.value.setting == setting and words in str(refused.value) and "Fix:" in str(refused.value)


@pytest.mark.parametrize(("strategy", "setting", "words"), [
    (StrategySpec(name=Strategy.fsdp, dp_replicate=-1, dp_shard=-1), "strategy.dp_shard", "only one degree"),
    (StrategySpec(dp_replicate=0), "strategy.dp_replicate", "a number of ranks"),
    (StrategySpec(dp_shard=2), "strategy.dp_shard", "DDP replicates whole parameters"),
    (StrategySpec(name=Strategy.fsdp, tp=2), "strategy.tp", "not yet run"),
    (StrategySpec(name=Strategy.fsdp, sharding=Sharding.hybrid), "strategy.sharding", "strategy=hsdp"),
    (StrategySpec(name=Strategy.fsdp, sharding=Sharding.none), "strategy.sharding", "strategy=fsdp_noshard"),
])
def test_degrees_refused_from_the_config_alone(strategy, setting, words):
    with pytest.raises(ConfigError) as refused:
        strategy.validate()
    assert refused.value.setting == setting and words in str(refused.value)


def test_each_model_family_declares_its_tensor_parallel_plan_beside_its_shard_units():
    """A declaration only (tensor parallelism is refused before launch): every path of a family's
    plan names modules of every block, and a family without a plan says so."""
    import fnmatch

    from contract.spec import InputKind, ModelSpec
    from jobs import models

    for name in ("gpt_tiny", "bert-tiny"):
        model = models.build_model(ModelSpec(name=name, seq_len=16, vocab_size=128))
        plan, names = models.tp_plan(model), [n for n, _ in model.named_modules()]
        assert plan and set(plan.values()) <= {"colwise", "rowwise", "colwise_stacked"}
        units = len(models.shard_units(model))
        assert all(len(fnmatch.filter(names, path)) == units for path in plan), plan
    assert models.tp_plan(models.build_model(ModelSpec(name="mlp", input=InputKind.image, image_size=8))) is None


def _pairs_rule(cls, strategy, layout):
    """A changed rule: every second rank a tensor-parallel peer of the one before it (it reads the
    same batch), the data-parallel ranks sharded."""
    return cls(dp_replicate=1, dp_shard=layout.world_size // 2, nodes=layout.nodes,
               tasks_per_node=layout.tasks_per_node, tp=2, mesh_dims=(SHARD,))


def _hsdp_rule(cls, strategy, layout):
    """A changed rule: full sharding over half the ranks, the halves replicated (HSDP in a node)."""
    return cls(dp_replicate=2, dp_shard=layout.world_size // 2, nodes=layout.nodes,
               tasks_per_node=layout.tasks_per_node, mesh_dims=(REPLICATE, SHARD))


def test_a_changed_rule_reaches_the_launchers_consumers(monkeypatch, tmp_path):
    from contract.spec import Optimizer, PrecisionSpec
    from launcher.forecast import inputs
    from launcher.plan import fit, traffic
    from tests.ranks import make_spec

    params = [traffic.Param((10, 3), True), traffic.Param((7,), False)]
    before = (fit.predict(SHAPES, FSDP, ONE_NODE_OF_4, Optimizer.adamw).params,
              traffic.bytes_per_step(params, FSDP, PrecisionSpec(), ONE_NODE_OF_4))
    assert before[0] == (3 * 3 + 2) * 4 and "all_reduce" not in before[1]  # ceil(10/4)=3 rows, ceil(7/4)=2

    monkeypatch.setattr(ParallelDims, "of", classmethod(_hsdp_rule))
    assert fit.predict(SHAPES, FSDP, ONE_NODE_OF_4, Optimizer.adamw).params == (5 * 3 + 4) * 4  # halves: 5, 4
    moved = traffic.bytes_per_step(params, FSDP, PrecisionSpec(), ONE_NODE_OF_4)
    assert moved["all_reduce"] == (10 * 3 + 8) // 2 * 4  # each replica's shard, across the replicas
    spec = make_spec(tmp_path, strategy="fsdp", world_size=4)
    groups = {c.kind: c.ranks for c in inputs.collectives(spec, moved, {})}
    assert groups == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 2}


def test_a_changed_rule_reaches_the_workers_consumers(monkeypatch, tmp_path):
    import torch

    from jobs import parallel, summary
    from jobs.data import input_batches
    from jobs.dist import DistEnv
    from jobs.rankrun import Rank
    from tests import fake_cuda
    from tests.ranks import make_spec

    spec = make_spec(tmp_path, strategy="fsdp", world_size=4)

    def ranks() -> list[Rank]:  # a Rank makes its layout once, from its spec
        return [Rank(spec, DistEnv(rank=r, world_size=4), torch.device("cpu"), "gloo", None, None, None)  # type: ignore[arg-type]
                for r in range(4)]

    monkeypatch.setattr(ParallelDims, "of", classmethod(_hsdp_rule))
    with fake_cuda.fake_world(4):
        mesh = parallel.fsdp_mesh("cpu", ranks()[0].dims)
    assert (mesh.mesh_dim_names, tuple(mesh.shape)) == ((REPLICATE, SHARD), (2, 2))

    monkeypatch.setattr(ParallelDims, "of", classmethod(_pairs_rule))
    four = ranks()
    dims = four[0].dims
    assert (dims.data_parallel, [dims.data_rank(r.env.rank) for r in four]) == (2, [0, 0, 1, 1])

    def first(rank: Rank) -> torch.Tensor:  # the worker's call (jobs.worker.set_up)
        return next(input_batches(spec.data, spec.model, batch_size=2, accum_steps=1, seed=0,
                                  rank=rank.dims.data_rank(rank.env.rank), world_size=rank.dims.data_parallel,
                                  device=torch.device("cpu")))[0]
    batches = [first(r) for r in four]
    assert torch.equal(batches[0], batches[1]) and not torch.equal(batches[0], batches[2])

    per_rank = [{"step_time_s": [0.5, 0.5], "data_time_s": [0.0, 0.0]} for _ in four]
    out = summary.summarize(per_rank, samples_per_step=2, tokens_per_sample=1, repeats=1,
                            data_parallel=dims.data_parallel)
    assert out["throughput_samples_per_s"] == pytest.approx(2 * 2 / 0.5)  # 2 distinct replicas, not 4 ranks
