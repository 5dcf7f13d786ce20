"""Counting: parameters, and the training FLOPs of one sample (for MFU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from jobs.models.init import unwrap

if TYPE_CHECKING:
    from contract.modelspec import ModelSpec


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
    # Each family counts its own (train_flops_per_sample for token models, forward_macs for image
    # models): a new family declares its count beside its shard units, and nothing here changes.
    per_token_model = getattr(model, "train_flops_per_sample", None)
    if callable(per_token_model):
        return per_token_model(spec.seq_len, param_count(model))
    forward_macs = getattr(model, "forward_macs", None)
    if callable(forward_macs):
        return 3.0 * 2.0 * forward_macs(spec.image_size)
    return None
