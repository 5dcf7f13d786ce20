"""Models users bring: ``_target_`` (recursive instantiation), ``model=hf`` (transformers from a
config) and the launcher's pre-submission check, ``jobs.models.checks.check_buildable``.

The multi-rank tests train a tiny GPT-2 and a tiny Llama on real gloo ranks (tests/ranks.py) under
DDP and FSDP, fp32 and bf16, and compare DDP's and FSDP's fp32 losses step by step (the argument
for parity is in tests/test_strategies.py's docstring).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("transformers")

from contract.spec import ConfigError, InputKind, LMHead, ModelSpec  # noqa: E402
from jobs.data import POOL_STEPS  # noqa: E402
from jobs.models import (  # noqa: E402
    build_model,
    flops_per_sample,
    init_weights,
    param_count,
    replace_units,
    shard_units,
)
from jobs.models.checks import check_buildable  # noqa: E402
from jobs.models.hf import HFLogits  # noqa: E402
from jobs.models.instantiate import InstantiationError, instantiate  # noqa: E402

slow = pytest.mark.slow

VOCAB, SEQ = 128, 16
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64)
# GPT-2's dropout (0.1 by default) off: the learning and parity checks compare a handful of steps.
NO_DROPOUT = {"gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
              "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}


def hf_model(arch: str, **fields) -> dict:
    """ModelSpec fields of a tiny model=hf model."""
    return dict(name="hf", arch=arch, input="tokens", seq_len=SEQ, vocab_size=VOCAB,
                config={**TINY, **NO_DROPOUT.get(arch, {})}, **fields)


def hf_spec(arch: str, **fields) -> ModelSpec:
    d = {**hf_model(arch), **fields}
    spec = ModelSpec(**{**d, "input": InputKind.tokens})
    spec.validate()
    return spec


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))


# ---- model=hf: build, logits, init, blocks, counts --------------------------------------------

@pytest.mark.parametrize(("arch", "cls", "unit"), [
    ("gpt2", "GPT2LMHeadModel", "GPT2Block"),
    ("llama", "LlamaForCausalLM", "LlamaDecoderLayer"),
    ("qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer"),
    ("bert", "BertForMaskedLM", "BertLayer"),
])
def test_hf_builds_logits_and_blocks(arch, cls, unit):
    spec = hf_spec(arch)
    check_buildable(spec)
    model = build_model(spec)
    assert isinstance(model, HFLogits) and type(model.model).__name__ == cls
    assert model(tokens()).shape == (2, SEQ, VOCAB)
    assert model.model.config.vocab_size == VOCAB
    units = shard_units(model)
    # BERT's _no_split_modules also names BertEmbeddings, whose word embedding is tied to the MLM
    # decoder outside it: it stays in the root unit.
    assert [type(u).__name__ for u in units] == [unit, unit]
    assert param_count(model) == sum(p.numel() for p in model.model.parameters())


def test_head_follows_the_architecture_and_can_be_chosen():
    assert type(build_model(hf_spec("bert")).model).__name__ == "BertForMaskedLM"
    assert type(build_model(hf_spec("bert", head=LMHead.causal_lm)).model).__name__ == "BertLMHeadModel"
    assert type(build_model(hf_spec("gpt2")).model).__name__ == "GPT2LMHeadModel"


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert"])
def test_meta_build_to_empty_init_weights_equals_eager_build(arch):
    spec = hf_spec(arch)
    torch.manual_seed(0)
    eager = build_model(spec)
    with torch.device("meta"):
        deferred = build_model(spec)
    assert all(p.is_meta for p in deferred.parameters())
    deferred.to_empty(device="cpu")
    torch.manual_seed(0)
    init_weights(deferred)
    for (name, a), b in zip(eager.state_dict().items(), deferred.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    out = deferred.eval()(tokens())
    assert torch.isfinite(out).all() and torch.allclose(out, eager.eval()(tokens()))
    # to_empty gives every parameter its own storage: init_weights re-ties the embeddings.
    hf = deferred.model
    tied = hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    assert tied == hf.config.tie_word_embeddings  # gpt2 and bert tie them, llama does not
    # Initialised as transformers does: normal(0, initializer_range) embeddings, not PyTorch's N(0, 1).
    assert hf.get_input_embeddings().weight.std().item() == pytest.approx(0.02, rel=0.2)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_one_step_lowers_the_loss_against_next_token_targets(arch):
    # The loop's loss, with its next-token targets; for BERT (masked LM) the target at t is the
    # input at t + 1, which the encoder sees: learnable, as jobs/models/hf.py documents.
    torch.manual_seed(0)
    model = build_model(hf_spec(arch))
    seq = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(2))
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_activation_checkpointing_wraps_the_blocks_and_keeps_outputs():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

    torch.manual_seed(0)
    model = build_model(hf_spec("llama"))
    before = model(tokens())
    wrapped = replace_units(model, checkpoint_wrapper)
    assert len(wrapped) == 2 and all(isinstance(u, CheckpointWrapper) for u in wrapped)
    assert shard_units(model) == wrapped
    after = model(tokens())
    assert torch.allclose(before, after)
    after.sum().backward()


def test_flops_follow_the_project_gpt_formula():
    spec = hf_spec("gpt2")
    model = build_model(spec)
    n = param_count(model) - SEQ * TINY["hidden_size"]  # the position table is a lookup
    expected = 6 * n * SEQ + 12 * TINY["num_hidden_layers"] * TINY["hidden_size"] * SEQ**2
    assert flops_per_sample(model, spec) == expected


@pytest.mark.parametrize("tied", [True, False])
def test_flops_count_the_output_projection_once_and_no_lookup_table(tied):
    """GPU review 3, G5: Llama-style models default to an untied output layer; its input table is
    a lookup and not a matmul. Tied, the one shared weight is the output projection's."""
    spec = hf_spec("llama", config={**TINY, "tie_word_embeddings": tied})
    model = build_model(spec)
    width = TINY["hidden_size"]
    matmul_params = param_count(model) - (0 if tied else VOCAB * width)
    expected = 6 * matmul_params * SEQ + 12 * TINY["num_hidden_layers"] * width * SEQ**2
    assert flops_per_sample(model, spec) == expected


def test_pretrained_path_loads_local_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    source = build_model(hf_spec("gpt2"))
    source.model.save_pretrained(tmp_path)
    spec = ModelSpec(**{**hf_model("gpt2"), "input": InputKind.tokens, "arch": None, "config": {},
                        "pretrained_path": str(tmp_path)})
    spec.validate()
    check_buildable(spec)
    model = build_model(spec).eval()
    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.allclose(model(tokens()), reference(tokens()).logits, atol=1e-6)
    with torch.device("meta"):
        deferred = build_model(spec)
    deferred.to_empty(device="cpu")
    init_weights(deferred)  # loads the directory's weights again
    assert torch.allclose(deferred.eval()(tokens()), model(tokens()), atol=1e-6)


# ---- _target_ --------------------------------------------------------------------------------

def test_target_with_a_nested_target_builds():
    spec = ModelSpec(name="custom", _target_="transformers.GPT2LMHeadModel", input=InputKind.tokens,
                     seq_len=SEQ, vocab_size=VOCAB,
                     params={"config": {"_target_": "transformers.GPT2Config", "n_layer": 2, "n_embd": 32,
                                        "n_head": 2, "vocab_size": VOCAB, "n_positions": SEQ}})
    spec.validate()
    check_buildable(spec)
    model = build_model(spec)
    assert isinstance(model, HFLogits)  # a transformers model is wrapped: forward returns logits
    assert model(tokens()).shape == (2, SEQ, VOCAB) and len(shard_units(model)) == 2

    # Plain torch, nested in a list, with positional _args_; `target` is an alias of `_target_`.
    seq = build_model(ModelSpec(target="torch.nn.Sequential", params={"_args_": [
        {"_target_": "torch.nn.Linear", "in_features": 4, "out_features": 8},
        {"_target_": "torch.nn.ReLU"},
        {"_target_": "torch.nn.Linear", "in_features": 8, "out_features": 2},
    ]}))
    assert isinstance(seq, nn.Sequential) and seq(torch.randn(3, 4)).shape == (3, 2)


def test_instantiate_follows_hydra_semantics():
    import functools

    assert instantiate({"a": [{"_target_": "builtins.dict", "x": 1}], "b": 2}) == {"a": [{"x": 1}], "b": 2}
    part = instantiate({"_target_": "torch.nn.Linear", "_partial_": True, "in_features": 2})
    assert isinstance(part, functools.partial) and part(out_features=3).weight.shape == (3, 2)
    raw = instantiate({"_target_": "builtins.dict", "_recursive_": False, "inner": {"_target_": "builtins.int"}})
    assert raw == {"inner": {"_target_": "builtins.int"}}
    with pytest.raises(InstantiationError, match="no_such_module"):
        instantiate({"_target_": "no_such_module.Model"})


# ---- refusals before submission --------------------------------------------------------------

@pytest.mark.parametrize(("spec", "setting", "fix"), [
    (ModelSpec(name="custom", _target_="os.path.join"), "model._target_='os.path.join'", "nn.Module subclass"),
    (ModelSpec(name="custom", target="os.path.join"), "model.target='os.path.join'", "nn.Module subclass"),
    (ModelSpec(name="custom", _target_="collections.OrderedDict"), "not a torch.nn.Module subclass", "nn.Module"),
    (ModelSpec(name="custom", _target_="no_such_pkg.Model"), "model._target_='no_such_pkg.Model'", "install that package"),
    (ModelSpec(name="custom", _target_="torch.nn.Linear", params={"in_feature": 4}), "model.params",
     "keyword arguments"),
    (ModelSpec(name="resnet18", input=InputKind.tokens), "model.input='tokens'", "model.input=image"),
])
def test_check_buildable_refuses_with_the_fix(spec, setting, fix):
    with pytest.raises(ConfigError) as info:
        check_buildable(spec)
    assert setting in str(info.value) and "Fix:" in str(info.value) and fix in info.value.fix


@pytest.mark.parametrize(("fields", "setting", "fix"), [
    (dict(arch="lama"), "model.arch='lama'", "llama"),
    (dict(arch="t5"), "encoder-decoder", "use a decoder"),
    (dict(arch="qwen2", config={"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2}),
     "model.config.num_key_value_heads=32", "divisor of 2"),
    (dict(arch="gpt2", config={"hidden_size": 30, "num_attention_heads": 4}), "model.config", "divisible"),
    # Keys the config class does not define: transformers would keep them silently and ignore them.
    (dict(config={**TINY, "n_layerz": 3}), "model.config.n_layerz=3", "did you mean model.config.n_layer?"),
    (dict(arch="bert", config={**TINY, "hidden_dropout": 0.0}), "BertConfig", "model.config.hidden_dropout_prob"),
    # Sizes that build a model without layers, or split channels unevenly between heads.
    (dict(config={**TINY, "num_hidden_layers": -1}), "model.config.num_hidden_layers=-1", "positive integer"),
    (dict(config={**TINY, "num_hidden_layers": 0}), "model.config.num_hidden_layers=0", "positive integer"),
    (dict(arch="llama", config={**TINY, "num_attention_heads": 3, "num_key_value_heads": 3}),
     "model.config.num_attention_heads=3", "num_attention_heads to 2 or 4"),
])
def test_check_buildable_refuses_bad_hf_configs(fields, setting, fix):
    spec = ModelSpec(**{**hf_model("gpt2"), "input": InputKind.tokens, **fields})
    with pytest.raises(ConfigError) as info:
        check_buildable(spec)
    assert setting in str(info.value) and fix in info.value.fix


def test_directory_vocabulary_must_match_model_vocab_size(tmp_path):
    build_model(hf_spec("gpt2")).model.config.save_pretrained(tmp_path)
    spec = ModelSpec(name="hf", config_path=str(tmp_path), input=InputKind.tokens, seq_len=SEQ, vocab_size=50257)
    spec.validate()
    with pytest.raises(ConfigError, match=f"model.vocab_size=50257.*Fix: set model.vocab_size={VOCAB}"):
        check_buildable(spec)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(config={**TINY, "vocab_size": 99}), "model.config.vocab_size=99"),
    (dict(config={**TINY, "max_position_embeddings": 8}), "raise model.config.max_position_embeddings to at least"),
    (dict(arch=None), "model=hf needs an architecture"),
    (dict(config_path="/nonexistent"), "add model.arch=null 'model.config={}'"),
    (dict(input=InputKind.image), "model.input=tokens"),
])
def test_validate_refuses_cheaply(fields, message):
    spec = ModelSpec(**{**hf_model("gpt2"), "input": InputKind.tokens, **fields})
    with pytest.raises(ConfigError) as info:
        spec.validate()
    assert message in str(info.value)


def test_model_hf_without_transformers_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'ddp-fsdp-bench\[hf\]'"):
        hf_spec("gpt2")


def test_model_hf_composes_from_the_command_line():
    from launcher.plan.grid import compose, expand

    points, swept = expand(["model=hf", "model.arch=llama", "model.config.hidden_size=48",
                            "+model.config.rms_norm_eps=1e-05"], multirun=False)
    spec = compose(points, swept)[0].config.model
    assert spec.name == "hf" and spec.arch == "llama" and spec.config["hidden_size"] == 48
    check_buildable(spec)
    with torch.device("meta"):
        model = build_model(spec)
    assert model.model.config.rms_norm_eps == 1e-05 and model.model.config.max_position_embeddings == spec.seq_len


# ---- real ranks: learning and parity ------------------------------------------------------------

LR = 3e-3
STEPS = POOL_STEPS + 1  # the last step sees the first step's batch again


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    from tests.ranks import make_spec, run_ranks

    root = tmp_path_factory.mktemp("hf_ranks")
    # The probes after the window (about 0.7 s a run) run on one of them: the comparisons are of losses.
    with_probes = "llama-fsdp-bf16"
    specs = {f"{arch}-{s}-{p}": make_spec(root / f"{arch}-{s}-{p}", model=hf_model(arch), strategy=s, precision=p,
                                          lr=LR, steps=STEPS, **({} if f"{arch}-{s}-{p}" == with_probes else
                                                                 {"comm_probe_steps": 0, "local_probe_steps": 0}))
             for arch in ("gpt2", "llama") for s in ("ddp", "fsdp") for p in ("fp32", "bf16")}
    results = run_ranks(list(specs.values()), world_size=2, timeout_s=240)
    return dict(zip(specs, results, strict=True))


def ok(results):
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results[0]


@slow
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tiny_hf_models_learn_on_two_ranks(hf_runs, arch, strategy, precision):
    result = ok(hf_runs[f"{arch}-{strategy}-{precision}"])
    probed = {"comm_time_ms", "comm_share", "step_time_rank_spread"} <= set(result["summary"])
    assert probed == (f"{arch}-{strategy}-{precision}" == "llama-fsdp-bf16"), sorted(result["summary"])
    losses = result["losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05, losses


@slow
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_fp32_losses_match_between_ddp_and_fsdp(hf_runs, arch):
    ddp = ok(hf_runs[f"{arch}-ddp-fp32"])["losses"]
    assert ok(hf_runs[f"{arch}-fsdp-fp32"])["losses"] == pytest.approx(ddp, rel=1e-4)


def test_pretrained_weights_load_into_fsdp_shards_without_distribute_tensor(tmp_path, monkeypatch):
    """Each rank copies its own shard of the saved weights into the FSDP-sharded parameters, with no
    call to distribute_tensor (its src_data_rank=None is newer than torch 2.6): built on meta,
    sharded, materialised and initialised, the model gives the saved model's logits."""
    import torch.distributed as tdist
    import torch.distributed.tensor as dtensor
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    build_model(hf_spec("gpt2")).model.save_pretrained(tmp_path / "weights")
    spec = ModelSpec(**{**hf_model("gpt2"), "input": InputKind.tokens, "arch": None, "config": {},
                        "pretrained_path": str(tmp_path / "weights")})

    def refuse(*args, **kwargs):
        raise TypeError("distribute_tensor() got an unexpected keyword argument 'src_data_rank'")  # torch 2.6

    monkeypatch.setattr(dtensor, "distribute_tensor", refuse)
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model = build_model(spec)
        for unit in shard_units(model):
            fully_shard(unit)
        fully_shard(model)
        model.to_empty(device="cpu")
        init_weights(model)  # loads the directory's weights into the shards
        reference = AutoModelForCausalLM.from_pretrained(tmp_path / "weights").eval()
        assert torch.allclose(model.eval()(tokens()), reference(tokens()).logits, atol=1e-5)
    finally:
        tdist.destroy_process_group()
