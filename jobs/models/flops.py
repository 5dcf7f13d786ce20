"""Counting: parameters, and the training FLOPs of one sample (for MFU)."""

from __future__ import annotations

from torch import nn

from contract.spec import ModelSpec
from jobs.models.bert import Bert
from jobs.models.gpt import GPT
from jobs.models.init import unwrap
from jobs.models.resnet import ResNet
from jobs.models.small import CNN, MLP


def param_count(model: nn.Module) -> int:
    """Parameters, each shared (tied) one counted once; works on meta and on DTensor (global size)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_sample(model: nn.Module, spec: ModelSpec) -> float | None:
    """Training FLOPs (forward + backward) for one sample, or None for a model this cannot count.

    Per family (a multiply-accumulate is 2 FLOPs; backward costs twice the forward, gradients with
    respect to both inputs and weights, so training = 3 x forward):
      * GPT and BERT: 6 * N * T + 12 * n_layer * d_model * T^2, with T = spec.seq_len and N the
        parameters that take part in a matmul: all but the position (and token-type) tables; the
        tied token embedding counts, being the output projection (PaLM appendix B, Chinchilla,
        nanoGPT's estimate_mfu). Causal attention is not discounted.
      * transformers models (model=hf, or a _target_ returning one): the same formula, N all
        parameters but the non-token embedding tables, n_layer and d_model from the config's
        num_hidden_layers and hidden_size (HFLogits.train_flops_per_sample).
      * ResNet, CNN: 3 * 2 * (convolution + fc MACs at spec.image_size), computed from the layer
        shapes; BatchNorm, ReLU, pooling and residual additions are left out, as in the published
        figures (ResNet-50 at 224 = 4.09 GMACs).
      * MLP: 3 * 2 * sum(in_features * out_features) over its Linear layers.
    """
    model = unwrap(model)
    from jobs.models.hf import HFLogits

    if isinstance(model, HFLogits):
        return model.train_flops_per_sample(spec.seq_len)
    if isinstance(model, (GPT, Bert)):
        return model.train_flops_per_sample(spec.seq_len, param_count(model))
    if isinstance(model, (ResNet, CNN, MLP)):
        return 3.0 * 2.0 * model.forward_macs(spec.image_size)
    return None
