"""Strategy x precision on real gloo process groups (2 and 4 ranks), and the refusals before submission.

The multi-rank tests run the worker's ``main`` in real processes through ``tests/ranks.py`` (no
launcher, no submitit). Each fixture starts its ranks once and runs every spec it needs one after
another, because importing torch costs more than a tiny run.

Why the losses can be compared: every run uses the same seed, so every rank builds the same
initial weights and draws the same per-rank synthetic batches whatever the strategy; DDP averages
gradients over ranks and FSDP reduce-scatters their average, so in fp32 every strategy takes the
same optimizer steps up to summation order. Why the loss decreases: the synthetic pool holds
``POOL_STEPS`` steps of random tokens (nothing to learn but the samples themselves) and the last
step revisits the first step's batch, which a few AdamW steps have partly memorised.
"""

import math
import time

import pytest

from contract.spec import LrScaling, WrapPolicy
from jobs.data import POOL_STEPS
from jobs.loop import scaled_lr
from launcher.plan.grid import SweepError, compose, expand
from tests.ranks import TINY_CNN, RanksTimeout, make_spec, run_ranks

slow = pytest.mark.slow


def spec_without_probes(*args, **train):
    """A RunSpec without the probes after the window (3 profiled steps, 3 local passes): these tests
    compare losses and memory, and the probes cost about 0.7 s per run (tests/test_comm.py and
    tests/test_stragglers.py test them)."""
    return make_spec(*args, comm_probe_steps=0, local_probe_steps=0, **train)

LR = 3e-3  # AdamW: memorises the repeated batch in 4 steps; 1e-2 overshoots on this tiny model
STEPS = POOL_STEPS + 1  # the last step sees the first step's batch again
SHARDED = ["fsdp", "zero2", "fsdp_noshard"]
PRECISIONS = ["fp32", "bf16"]
FP32_REL = 1e-4


def ok(results):
    """Rank 0's result after checking that no rank raised."""
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_ranks")
    specs = {}
    for strategy in ["ddp", *SHARDED]:
        for precision in PRECISIONS:
            specs[f"{strategy}-{precision}"] = spec_without_probes(root / f"{strategy}-{precision}", strategy=strategy,
                                                         precision=precision, lr=LR, steps=STEPS)
    for strategy in ["ddp", "fsdp"]:
        # Two micro-batches of 2 per step: the same samples as the base runs' one batch of 4.
        specs[f"{strategy}-accum"] = spec_without_probes(root / f"{strategy}-accum", strategy=strategy, lr=LR, steps=STEPS,
                                               batch_size=2, grad_accum_steps=2)
        specs[f"{strategy}-ckpt"] = spec_without_probes(root / f"{strategy}-ckpt", strategy=strategy, lr=LR, steps=STEPS,
                                              activation_checkpointing=True)
    # FSDP knobs that change scheduling or unit boundaries, not the arithmetic.
    specs["fsdp-prefetch2"] = spec_without_probes(root / "fsdp-prefetch2", strategy="fsdp", lr=LR, steps=STEPS,
                                        strategy_args={"prefetch": 2})
    specs["fsdp-wrap-model"] = spec_without_probes(root / "fsdp-wrap-model", strategy="fsdp", lr=LR, steps=STEPS,
                                         strategy_args={"wrap": WrapPolicy.model})
    for strategy in ["ddp", "fsdp"]:
        for precision in PRECISIONS:
            specs[f"cnn-{strategy}-{precision}"] = spec_without_probes(root / f"cnn-{strategy}-{precision}", model=TINY_CNN,
                                                             strategy=strategy, precision=precision, lr=LR,
                                                             steps=STEPS)
    for scaling in ("linear", "sqrt"):
        specs[f"lr-{scaling}"] = spec_without_probes(root / f"lr-{scaling}", lr=LR, lr_scaling=scaling, steps=2)
    specs["syncbn"] = spec_without_probes(root / "syncbn", model=TINY_CNN, sync_batchnorm=True, steps=2)
    # precision.mode=params: FSDP casts the parameters themselves (BatchNorm kept fp32, both ways).
    specs["fsdp-bf16-params"] = spec_without_probes(root / "fsdp-bf16-params", strategy="fsdp", precision="bf16", lr=LR,
                                          steps=STEPS, precision_args={"mode": "params"})
    for bn in ("unit", "grouped"):
        specs[f"cnn-fsdp-bf16-params-{bn}"] = spec_without_probes(
            root / f"cnn-fsdp-bf16-params-{bn}", model=TINY_CNN, strategy="fsdp", precision="bf16", lr=LR,
            steps=STEPS, precision_args={"mode": "params", "batchnorm": bn})
    specs["ddp-bf16-params"] = spec_without_probes(root / "ddp-bf16-params", precision="bf16", steps=2,
                                         precision_args={"mode": "params"})
    # fp16 with the plain GradScaler under FSDP2 (found-inf all-reduced over the mesh on gloo).
    specs["fsdp-fp16"] = spec_without_probes(root / "fsdp-fp16", strategy="fsdp", precision="fp16", lr=LR, steps=STEPS)
    results = run_ranks(list(specs.values()), world_size=2, timeout_s=300)
    return dict(zip(specs, results, strict=True))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Four ranks as two emulated nodes of two (HSDP shards within a node, replicates across)."""
    root = tmp_path_factory.mktemp("four_ranks")
    specs = {f"{s}-{p}": spec_without_probes(root / f"{s}-{p}", strategy=s, precision=p, nodes=2, world_size=4, lr=LR,
                                   steps=STEPS)
             for s in ["ddp", "fsdp", "hsdp"] for p in PRECISIONS}
    results = run_ranks(list(specs.values()), world_size=4, nodes=2, timeout_s=240)
    return dict(zip(specs, results, strict=True))


@slow
def test_ranks_that_do_not_finish_in_time_are_killed(tmp_path):
    started = time.monotonic()
    with pytest.raises(RanksTimeout, match="killed"):
        run_ranks(spec_without_probes(tmp_path / "late"), world_size=2, timeout_s=0.5)  # importing torch alone takes longer
    assert time.monotonic() - started < 10


# ---- every strategy x precision trains ------------------------------------------------------

@slow
@pytest.mark.parametrize("strategy", ["ddp", *SHARDED])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_two_ranks_every_strategy_and_precision_learns(two_ranks, strategy, precision):
    result = ok(two_ranks[f"{strategy}-{precision}"])
    losses = result["losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05, losses
    assert result["summary"]["world_size"] == 2


@slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "hsdp"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_four_ranks_two_nodes_every_strategy_and_precision_learns(four_ranks, strategy, precision):
    result = ok(four_ranks[f"{strategy}-{precision}"])
    losses = result["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.05, losses
    assert result["summary"]["world_size"] == 4 and result["summary"]["nodes"] == 2


@slow
def test_bf16_runs_in_bf16_yet_tracks_fp32(two_ranks, four_ranks):
    for runs, strategies in ((two_ranks, ["ddp", *SHARDED]), (four_ranks, ["ddp", "fsdp", "hsdp"])):
        for strategy in strategies:
            fp32, bf16 = ok(runs[f"{strategy}-fp32"])["losses"], ok(runs[f"{strategy}-bf16"])["losses"]
            assert bf16 != fp32, f"{strategy}: bf16 gave fp32's exact losses; was low precision applied?"
            assert bf16 == pytest.approx(fp32, rel=1e-2), strategy


# ---- fp32 parity ----------------------------------------------------------------------------

@slow
def test_fp32_losses_match_ddp_step_by_step(two_ranks, four_ranks):
    ddp2 = ok(two_ranks["ddp-fp32"])["losses"]
    for strategy in SHARDED:
        assert ok(two_ranks[f"{strategy}-fp32"])["losses"] == pytest.approx(ddp2, rel=FP32_REL), strategy
    ddp4 = ok(four_ranks["ddp-fp32"])["losses"]
    for strategy in ["fsdp", "hsdp"]:
        assert ok(four_ranks[f"{strategy}-fp32"])["losses"] == pytest.approx(ddp4, rel=FP32_REL), strategy
    for variant in ("fsdp-prefetch2", "fsdp-wrap-model"):
        assert ok(two_ranks[variant])["losses"] == pytest.approx(ddp2, rel=FP32_REL), variant
    # BatchNorm model: FSDP matches DDP too (training-mode BatchNorm uses batch statistics, so
    # DDP's buffer broadcast does not change the losses).
    assert ok(two_ranks["cnn-fsdp-fp32"])["losses"] == pytest.approx(ok(two_ranks["cnn-ddp-fp32"])["losses"],
                                                                      rel=FP32_REL)


# ---- BatchNorm under bf16 FSDP ---------------------------------------------------------------

@slow
@pytest.mark.parametrize("run", ["cnn-ddp-bf16", "cnn-fsdp-bf16", "cnn-fsdp-bf16-params-unit",
                                 "cnn-fsdp-bf16-params-grouped"])
def test_cnn_with_batchnorm_trains_in_bf16(two_ranks, run):
    # mode=params: FSDP2 casts parameters to bf16; BatchNorm stays fp32 in its own unit(s)
    # (jobs.parallel.apply_fsdp), without which the forward fails with "expected scalar type
    # BFloat16 but found Float". mode=autocast (default): parameters stay fp32.
    losses = ok(two_ranks[run])["losses"]
    fp32 = ok(two_ranks["cnn-" + run.split("-")[1] + "-fp32"])["losses"]
    assert all(math.isfinite(x) for x in losses)
    assert losses == pytest.approx(fp32, rel=5e-2)
    assert losses != fp32


@slow
def test_precision_mode_is_tagged_and_the_same_by_default(two_ranks):
    for strategy in ("ddp", "fsdp"):
        assert ok(two_ranks[f"{strategy}-bf16"])["tags"]["precision_mode"] == "autocast"
    params = ok(two_ranks["fsdp-bf16-params"])
    assert params["tags"]["precision_mode"] == "params"
    fp32 = ok(two_ranks["fsdp-fp32"])["losses"]
    assert params["losses"] != fp32 and params["losses"] == pytest.approx(fp32, rel=2e-2)
    assert params["losses"] != ok(two_ranks["fsdp-bf16"])["losses"]  # a different numerics, not a relabel


@slow
def test_params_mode_under_ddp_is_refused_with_the_fix(two_ranks):
    for result in two_ranks["ddp-bf16-params"]:
        assert "precision.mode=params with strategy=ddp" in result["error"]
        assert "precision.mode=autocast" in result["error"]


@slow
def test_fsdp_fp16_with_plain_grad_scaler_learns_and_counts_skipped_steps(two_ranks):
    result = ok(two_ranks["fsdp-fp16"])
    losses = result["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.05, losses
    summary = result["summary"]
    assert summary["fp16_skipped_steps"] >= 0 and "fp16_skipped_steps_warmup" in summary
    assert (result["tags"].get("fp16_skipped_in_window") == "true") == (summary["fp16_skipped_steps"] > 0)


# ---- memory per rank ------------------------------------------------------------------------

def _state(result):
    s = result["summary"]
    return s["param_bytes"], s["grad_bytes"], s["optim_state_bytes"]


@slow
@pytest.mark.parametrize("n_ranks", [2, 4])
def test_full_shard_holds_one_nth_of_ddp_state_per_rank(two_ranks, four_ranks, n_ranks):
    runs = two_ranks if n_ranks == 2 else four_ranks
    ddp, fsdp = _state(ok(runs["ddp-fp32"])), _state(ok(runs["fsdp-fp32"]))
    assert all(b > 0 for b in ddp), ddp  # AdamW: two moments per parameter, gradients counted
    assert ddp[2] == pytest.approx(2 * ddp[0], rel=0.01)
    # Parameters, gradients and AdamW moments all 1/N; the slack covers FSDP's padding of uneven
    # dim-0 shards and AdamW's unsharded per-parameter step counters.
    for name, d, f in zip(("param", "grad", "optim_state"), ddp, fsdp, strict=True):
        assert f == pytest.approx(d / n_ranks, rel=0.03), name
    if n_ranks == 2:
        # ZeRO-2 also ends the step sharded (FSDP2 reshards after backward); no-shard holds what DDP holds.
        assert _state(ok(runs["zero2-fp32"])) == fsdp
        assert _state(ok(runs["fsdp_noshard-fp32"])) == pytest.approx(ddp, rel=0.01)
    else:
        # HSDP: sharded over the 2 ranks of a node, replicated across the 2 nodes.
        assert _state(ok(runs["hsdp-fp32"])) == pytest.approx([b / 2 for b in ddp], rel=0.03)


# ---- gradient accumulation, activation checkpointing ----------------------------------------

@slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulating_two_micro_batches_equals_one_double_batch(two_ranks, strategy):
    # Same samples per optimizer step (the synthetic stream is cut into micro-batches in order),
    # each micro-batch loss divided by the number of micro-batches: the same steps, so the same
    # loss at every step after the first update too.
    accum = ok(two_ranks[f"{strategy}-accum"])
    single = ok(two_ranks[f"{strategy}-fp32"])
    assert accum["losses"] == pytest.approx(single["losses"], rel=FP32_REL)
    # A step still counts all its samples.
    assert accum["summary"]["measured_steps"] == single["summary"]["measured_steps"]


@slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_activation_checkpointing_does_not_change_losses(two_ranks, strategy):
    assert ok(two_ranks[f"{strategy}-ckpt"])["losses"] == pytest.approx(ok(two_ranks[f"{strategy}-fp32"])["losses"],
                                                                       rel=1e-5)


# ---- SyncBatchNorm, learning-rate scaling ----------------------------------------------------

@slow
def test_sync_batchnorm_on_cpu_ranks_fails_with_the_fix(two_ranks):
    # PyTorch's SyncBatchNorm refuses CPU input; the launcher refuses it before submitting (see
    # test_refused_before_submission) and a hand-built spec fails before building the model.
    for result in two_ranks["syncbn"]:
        assert "error" in result
        assert "sync_batchnorm=true needs CUDA ranks" in result["error"] and "sync_batchnorm=false" in result["error"]


@pytest.mark.parametrize("scaling, world_size, factor", [
    ("none", 8, 1.0), ("linear", 1, 1.0), ("linear", 8, 8.0), ("sqrt", 4, 2.0), ("sqrt", 2, math.sqrt(2)),
])
def test_lr_scaling_rule(scaling, world_size, factor):
    assert scaled_lr(1e-3, LrScaling(scaling), world_size) == pytest.approx(1e-3 * factor)


@slow
def test_lr_scaling_reaches_the_optimizer(two_ranks):
    assert ok(two_ranks["lr-linear"])["summary"]["lr"] == pytest.approx(2 * LR)
    assert ok(two_ranks["lr-sqrt"])["summary"]["lr"] == pytest.approx(math.sqrt(2) * LR)
    assert ok(two_ranks["ddp-fp32"])["summary"]["lr"] == pytest.approx(LR)


# ---- refused before submission ---------------------------------------------------------------
# (test_config.py covers hsdp with nodes=1, fsdp_offload and fp16 on CPU, and strategy.sharding
# under DDP; these are the remaining combinations.)

@pytest.mark.parametrize("overrides, setting, fix", [
    (["sync_batchnorm=true", "model=cnn"], "sync_batchnorm=True", "sync_batchnorm=false"),
    (["strategy=ddp", "strategy.cpu_offload=true"], "strategy.cpu_offload=True", "strategy=fsdp_offload"),
    (["precision=fp32", "precision.param_dtype=bf16"], "precision.param_dtype='bf16'", "precision=bf16"),
    (["strategy=fsdp", "strategy.prefetch=-1"], "strategy.prefetch=-1", "use 0"),
])
def test_refused_before_submission(overrides, setting, fix):
    points, swept = expand(overrides, multirun=True)
    with pytest.raises(SweepError) as info:
        compose(points, swept)
    message = str(info.value)
    assert setting in message and "Fix:" in message and fix in message, message


def test_every_cpu_strategy_and_precision_composes():
    points, swept = expand(["strategy=ddp,fsdp,zero2,hsdp,fsdp_noshard", "precision=fp32,bf16", "nodes=2",
                            "cluster.tasks_per_node=2"],
                           multirun=True)
    assert len(compose(points, swept)) == 10
