"""jobs.models: parameter counts, shapes, training signal, FLOPs, meta-device init and blocks.

Large models are built on the meta device: counting parameters needs shapes only, and it takes
milliseconds instead of allocating gigabytes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

from contract.spec import InputKind, ModelSpec
from jobs.models import (
    REGISTRY,
    build_model,
    flops_per_sample,
    init_weights,
    param_count,
    replace_units,
    shard_units,
)
from jobs.models.resnet import Bottleneck
from jobs.models.units import _repeated_units

GPT2_VOCAB = 50257
BERT_VOCAB = 30522


def token_spec(name: str, seq_len: int = 16, vocab_size: int = 512, **params) -> ModelSpec:
    return ModelSpec(name=name, input=InputKind.tokens, seq_len=seq_len, vocab_size=vocab_size, params=params)


def image_spec(name: str, image_size: int = 32, num_classes: int = 10, **params) -> ModelSpec:
    return ModelSpec(name=name, input=InputKind.image, image_size=image_size, num_classes=num_classes,
                     params=params)


def on_meta(spec: ModelSpec) -> nn.Module:
    with torch.device("meta"):
        return build_model(spec)


# Small CPU configurations of every family, used for shapes and init checks.
SMALL_SPECS = {
    "mlp": image_spec("mlp"),
    "cnn": image_spec("cnn"),
    "gpt_tiny": token_spec("gpt_tiny"),
    "gpt2-small": token_spec("gpt2-small", n_layer=2, n_head=2, d_model=64),
    "bert-tiny": token_spec("bert-tiny"),
    "resnet18": image_spec("resnet18"),
    "resnet50": image_spec("resnet50"),
}


def batch(spec: ModelSpec, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets the way the training loop shapes them."""
    if spec.input is InputKind.tokens:
        tokens = torch.randint(spec.vocab_size, (batch_size, spec.seq_len + 1))
        return tokens[:, :-1], tokens[:, 1:]
    images = torch.randn(batch_size, 3, spec.image_size, spec.image_size)
    return images, torch.randint(spec.num_classes, (batch_size,))


def loss_of(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


# ---------------------------------------------------------------------------------------------
# Parameter counts


@pytest.mark.parametrize(("name", "expected"), [
    ("resnet18", 11_689_512),
    ("resnet34", 21_797_672),
    ("resnet50", 25_557_032),
    ("resnet101", 44_549_160),
    ("resnet152", 60_192_808),
])
def test_resnet_param_counts_match_torchvision(name: str, expected: int) -> None:
    assert param_count(on_meta(image_spec(name, image_size=224, num_classes=1000))) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("gpt2-small", 124_439_808),
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
])
def test_gpt2_param_counts_match_nanogpt(name: str, expected: int) -> None:
    model = on_meta(token_spec(name, seq_len=1024, vocab_size=GPT2_VOCAB))
    assert param_count(model) == expected


def test_bert_base_param_count_matches_hf_bert_for_masked_lm() -> None:
    # transformers' BertForMaskedLM("bert-base-uncased"): no pooler, MLM transform + decoder bias.
    model = on_meta(token_spec("bert-base", seq_len=512, vocab_size=BERT_VOCAB))
    assert param_count(model) == 109_514_298


def test_params_override_the_named_defaults() -> None:
    small = on_meta(token_spec("gpt2-small", seq_len=1024, vocab_size=GPT2_VOCAB, n_layer=2))
    # Ten of the twelve 7,087,872-parameter layers gone.
    assert param_count(small) == 124_439_808 - 10 * 7_087_872
    with pytest.raises(ValueError, match="n_layers"):
        build_model(token_spec("gpt_tiny", n_layers=2))


# ---------------------------------------------------------------------------------------------
# Forward shapes and a training step


@pytest.mark.parametrize("name", list(SMALL_SPECS))
def test_forward_returns_logits_of_the_documented_shape(name: str) -> None:
    spec = SMALL_SPECS[name]
    torch.manual_seed(0)
    model = build_model(spec)
    inputs, _ = batch(spec, batch_size=2)
    logits = model(inputs)
    if spec.input is InputKind.tokens:
        assert logits.shape == (2, spec.seq_len, spec.vocab_size)
    else:
        assert logits.shape == (2, spec.num_classes)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["gpt_tiny", "cnn"])
def test_one_optimizer_step_lowers_the_loss(name: str) -> None:
    spec = SMALL_SPECS[name]
    torch.manual_seed(0)
    model = build_model(spec)
    inputs, targets = batch(spec, batch_size=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = loss_of(model, inputs, targets)
    before.backward()
    assert all(p.grad is not None for p in model.parameters())
    optimizer.step()
    with torch.no_grad():
        after = loss_of(model, inputs, targets)
    assert after.item() < before.item()


def test_wrong_input_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="model.input=image"):
        build_model(token_spec("resnet18"))


# ---------------------------------------------------------------------------------------------
# FLOPs


def test_gpt2_small_flops_follow_the_palm_formula() -> None:
    spec = token_spec("gpt2-small", seq_len=1024, vocab_size=GPT2_VOCAB)
    # N = 124,439,808 total - 1024 * 768 position table = 123,653,376 matmul parameters.
    # 6 * N * T = 6 * 123,653,376 * 1024        = 759,726,342,144
    # 12 * L * d * T^2 = 12 * 12 * 768 * 1024^2 = 115,964,116,992
    expected = 759_726_342_144 + 115_964_116_992
    assert flops_per_sample(on_meta(spec), spec) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(8.757e11, rel=1e-3)


@pytest.mark.parametrize(("name", "published_gmacs"), [("resnet18", 1.81), ("resnet50", 4.09),
                                                      ("resnet101", 7.80)])
def test_resnet_flops_match_published_macs(name: str, published_gmacs: float) -> None:
    # torchvision's model table: forward GMACs at 224x224; training = 3 forward, 2 FLOPs per MAC.
    spec = image_spec(name, image_size=224, num_classes=1000)
    assert flops_per_sample(on_meta(spec), spec) == pytest.approx(6 * published_gmacs * 1e9, rel=3e-3)


def test_small_model_flops_are_analytic() -> None:
    mlp = SMALL_SPECS["mlp"]
    forward_macs = 3 * 32 * 32 * 256 + 256 * 256 + 256 * 10
    assert flops_per_sample(on_meta(mlp), mlp) == 6 * forward_macs
    cnn = SMALL_SPECS["cnn"]
    # conv3x3 at 32x32 (3->32), 16x16 (32->64), 8x8 (64->128), then fc 128->10.
    forward_macs = 32 * 32 * 32 * 3 * 9 + 16 * 16 * 64 * 32 * 9 + 8 * 8 * 128 * 64 * 9 + 128 * 10
    assert flops_per_sample(on_meta(cnn), cnn) == 6 * forward_macs


def test_flops_of_a_foreign_model_are_unknown() -> None:
    assert flops_per_sample(nn.Linear(4, 2), ModelSpec()) is None


# ---------------------------------------------------------------------------------------------
# Meta-device construction and deferred init


@pytest.mark.parametrize("name", ["gpt_tiny", "cnn", "resnet18", "bert-tiny", "mlp"])
def test_meta_build_then_init_weights_equals_eager_build(name: str) -> None:
    spec = SMALL_SPECS[name]
    torch.manual_seed(1234)
    eager = build_model(spec)

    torch.manual_seed(1234)
    with torch.device("meta"):
        deferred = build_model(spec)
    assert all(p.is_meta for p in deferred.parameters())
    deferred.to_empty(device="cpu")
    init_weights(deferred)

    eager_state, deferred_state = eager.state_dict(), deferred.state_dict()
    assert eager_state.keys() == deferred_state.keys()
    for key, value in eager_state.items():
        assert torch.equal(value, deferred_state[key]), key


def test_init_follows_the_family_recipes() -> None:
    torch.manual_seed(0)
    gpt = build_model(token_spec("gpt2-small", seq_len=64, n_layer=4, n_head=4, d_model=256))
    assert gpt.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # Residual projections shrink by 1/sqrt(2 * n_layer).
    assert gpt.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / 8**0.5, rel=0.05)
    assert torch.all(gpt.blocks[0].attn.c_attn.bias == 0)
    resnet = build_model(image_spec("resnet18"))
    assert torch.all(resnet.bn1.weight == 1) and torch.all(resnet.bn1.running_var == 1)
    # Kaiming normal, fan_out: std = sqrt(2 / (out_channels * k * k)) = sqrt(2 / (64 * 49)).
    assert resnet.conv1.weight.std().item() == pytest.approx((2 / (64 * 49)) ** 0.5, rel=0.05)


# ---------------------------------------------------------------------------------------------
# Blocks


@pytest.mark.parametrize(("spec", "count", "unit_type"), [
    (token_spec("gpt2-small", seq_len=1024, vocab_size=GPT2_VOCAB), 12, "Block"),
    (token_spec("bert-base", seq_len=512, vocab_size=BERT_VOCAB), 12, "BertLayer"),
    (image_spec("resnet50", image_size=224, num_classes=1000), 16, "Bottleneck"),
    (image_spec("resnet18", image_size=224, num_classes=1000), 8, "BasicBlock"),
    (SMALL_SPECS["cnn"], 3, "ConvBlock"),
    (SMALL_SPECS["mlp"], 2, "Sequential"),
])
def test_shard_units_are_the_blocks(spec: ModelSpec, count: int, unit_type: str) -> None:
    units = shard_units(on_meta(spec))
    assert len(units) == count
    assert {type(u).__name__ for u in units} == {unit_type}


def test_shard_units_heuristic_for_foreign_models() -> None:
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32), num_layers=3,
                                    enable_nested_tensor=False)
    model = nn.Sequential(nn.Linear(8, 16), encoder, nn.Linear(16, 4))
    assert shard_units(model) == list(encoder.layers)
    # Same-type entries spread over several containers are collected across them (torchvision's
    # ResNet stages); the Sequential shortcut (conv, BN) is not a candidate.
    resnet = on_meta(image_spec("resnet50", image_size=224))
    units = _repeated_units(resnet)
    assert len(units) == 16 and all(isinstance(u, Bottleneck) for u in units)
    assert shard_units(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_replace_units_with_checkpoint_wrapper_keeps_outputs_grads_and_keys() -> None:
    spec = SMALL_SPECS["gpt_tiny"]
    torch.manual_seed(0)
    plain = build_model(spec)
    torch.manual_seed(0)
    wrapped = build_model(spec)
    new_units = replace_units(wrapped, checkpoint_wrapper)
    assert len(new_units) == 2 and all(isinstance(u, CheckpointWrapper) for u in new_units)
    assert shard_units(wrapped) == new_units
    assert list(wrapped.blocks) == new_units

    inputs, targets = batch(spec)
    loss_plain, loss_wrapped = loss_of(plain, inputs, targets), loss_of(wrapped, inputs, targets)
    loss_plain.backward()
    loss_wrapped.backward()
    assert torch.equal(loss_plain, loss_wrapped)
    # checkpoint_wrapper strips its own prefix from state_dict keys, so checkpoints stay compatible.
    assert plain.state_dict().keys() == wrapped.state_dict().keys()
    grads = dict(wrapped.named_parameters())
    for name, param in plain.named_parameters():
        key = name.replace("blocks.0.", "blocks.0._checkpoint_wrapped_module.").replace(
            "blocks.1.", "blocks.1._checkpoint_wrapped_module.")
        torch.testing.assert_close(param.grad, grads[key].grad)


def test_replace_units_reaches_resnet_blocks_inside_stages() -> None:
    calls = []

    class Counting(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(type(self.inner).__name__)
            return self.inner(x)

    torch.manual_seed(0)
    model = build_model(image_spec("resnet18"))
    replace_units(model, Counting)
    assert all(isinstance(block, Counting) for block in model.layer3)
    model(torch.randn(2, 3, 32, 32))
    assert calls == ["BasicBlock"] * 8


# ---------------------------------------------------------------------------------------------
# Registry and targets


def test_target_builds_an_importable_class_with_params() -> None:
    model = build_model(ModelSpec(target="torch.nn.Linear", params={"in_features": 4, "out_features": 2}))
    assert isinstance(model, nn.Linear) and model.weight.shape == (2, 4)
    assert param_count(model) == 10
    with pytest.raises(ValueError, match="no_such_module"):
        build_model(ModelSpec(target="no_such_module.Model"))


def test_unknown_name_lists_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="unknown model name 'gpt5'") as info:
        build_model(ModelSpec(name="gpt5"))
    for name in ("gpt_tiny", "gpt2-xl", "bert-base", "resnet50", "mlp", "cnn"):
        assert name in str(info.value)
    assert set(REGISTRY) >= {"mlp", "cnn", "gpt_tiny", "gpt2-small", "gpt2-medium", "gpt2-large",
                             "gpt2-xl", "bert-base", "bert-tiny", "resnet18", "resnet34", "resnet50",
                             "resnet101", "resnet152"}


def test_a_meta_build_stays_on_meta_where_get_default_device_ignores_device_blocks(monkeypatch) -> None:
    """torch 2.6 and 2.7's get_default_device() says "cpu" inside `with torch.device("meta")`
    (pytorch#131328, fixed in 2.8): the build must still stay on meta (FSDP's sharded build) and
    follow the block's device otherwise (DDP's eager build)."""
    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("cpu"))  # torch 2.6's answer here
    spec = ModelSpec(name="gpt_tiny", seq_len=16, vocab_size=64)
    with torch.device("meta"):
        model = build_model(spec)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    eager = build_model(spec)
    assert {p.device.type for p in eager.parameters()} == {"cpu"} and all(p.isfinite().all() for p in eager.parameters())
