"""A model of the user's own (``model._target_``) checked before launch against the data it will be
fed: one forward on a fake batch (meta storage: no memory, no compute) with the data's real dtype and
shape, and its output against what the loss reads. What forward takes and returns is the contract
of docs/strategies.md ("A model of your own")."""

from __future__ import annotations

import logging

from contract.errors import ConfigError
from contract.spec import InputKind, ModelSpec
from launcher.plan.fit import meta_build, to_fake_cpu

BATCH = 2  # any batch shows the shapes; 2 tells the batch dimension from a dimension of one

# Why a forward may fail on fake tensors that is not the model's fault: it reads a value (an
# item(), a data-dependent shape), or asks for its process group. Only the run can tell.
_NOT_JUDGED = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
               "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode")


def check_forward(model: ModelSpec) -> None:
    """Raise ConfigError, naming the setting and the fix, where the model's forward cannot take the
    data's batch, or returns what the loss cannot read: logits (batch, seq_len, width) for tokens,
    (batch, width) for images, ``width`` at least model.vocab_size or model.num_classes (a wider
    output, a padded vocabulary, is read over its first columns)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jobs.models import is_hf_model

    module = meta_build(model)
    if is_hf_model(module):
        return  # transformers' models: checked against their config (jobs/models/hf_checks.py)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        to_fake_cpu(module)
        x = _batch(torch, model)
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs each failed op's traceback
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with fake, torch.no_grad():
            out = module(x)
    except Exception as exc:
        if type(exc).__name__ in _NOT_JUDGED or "process group" in str(exc):
            return
        raise ConfigError("model.input", model.input.value, f"the model's forward fails on the data's batch, "
                          f"{_described(model)}: {type(exc).__name__}: {_first_line(exc)}",
                          "set model.input to what forward takes (tokens: ids of torch.long, (batch, seq_len); "
                          "image: floats, (batch, 3, image_size, image_size)), or make forward take that batch "
                          "(docs/strategies.md, A model of your own).") from exc
    finally:
        quiet.setLevel(level)
    _check_output(model, out)


def _batch(torch, model: ModelSpec):
    if model.input is InputKind.tokens:
        return torch.zeros(BATCH, model.seq_len, dtype=torch.long)
    return torch.zeros(BATCH, 3, model.image_size, model.image_size)


def _described(model: ModelSpec) -> str:
    if model.input is InputKind.tokens:
        return f"token ids of torch.long below model.vocab_size={model.vocab_size}, shape ({BATCH}, {model.seq_len})"
    return f"float images, shape ({BATCH}, 3, {model.image_size}, {model.image_size})"


def _check_output(model: ModelSpec, out) -> None:
    import torch

    setting = model.target_setting
    if not isinstance(out, torch.Tensor):
        raise ConfigError(setting, model.target_path, f"forward returned a {type(out).__name__}, not a tensor of "
                          "logits.", "return the logits tensor from forward (a wrapper module can pick it out of "
                          "a tuple or an output object).")
    tokens = model.input is InputKind.tokens
    want = (BATCH, model.seq_len) if tokens else (BATCH,)
    shape = tuple(out.shape)
    if shape[:-1] != want:
        axes = "(batch, seq_len, width)" if tokens else "(batch, width)"
        raise ConfigError(setting, model.target_path, f"forward returned logits of shape {shape} for "
                          f"{_described(model)}; the loss reads {axes}, here {(*want, 'width')}.",
                          "return logits with one row per token (tokens) or per image (image), or set model.input "
                          "to the kind of model it is.")
    width, key = (model.vocab_size, "model.vocab_size") if tokens else (model.num_classes, "model.num_classes")
    if shape[-1] < width:
        raise ConfigError(key, width, f"the data draws its {'token ids' if tokens else 'labels'} below {width}, but "
                          f"the model's logits have {shape[-1]} columns: the loss would index past them.",
                          f"set {key}={shape[-1]} (the model's own), or build the model for {width}.")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "no message"
