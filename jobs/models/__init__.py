"""The benchmark's models: build one from a ModelSpec, find its blocks, count its parameters and FLOPs.

Every project model's ``forward(x)`` returns logits. Token models (``gpt_tiny``, ``gpt2-*``,
``bert-*``) take int64 [B, T] and return [B, T, vocab_size]; image models (``mlp``, ``cnn``,
``resnet*``) take float [B, 3, H, W] and return [B, num_classes]. The loop's loss is
``F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())`` for both.

Models users bring. ``model._target_`` (alias ``model.target``) names any importable nn.Module
class or function returning one, called with ``model.params``; ``_target_`` dicts inside the params
are instantiated first, recursively (:mod:`jobs.models.instantiate`, Hydra's semantics without
Hydra). ``model=hf`` builds a Hugging Face transformers model from a config
(:mod:`jobs.models.hf`). A transformers model, however built, is wrapped in
:class:`~jobs.models.hf.HFLogits`: forward returns ``.logits``, its blocks are the model's
``_no_split_modules``, and :func:`init_weights` runs transformers' own initialisation.

The package by concern, each re-exported here so that callers import from ``jobs.models``:
:mod:`~jobs.models.build` (the registry, building, deferred initialisation),
:mod:`~jobs.models.init` (weight initialisation), :mod:`~jobs.models.units` (FSDP and
checkpointing units, and the tensor-parallel plan), :mod:`~jobs.models.flops` (parameters and FLOPs). The launcher's pre-submission check,
:func:`jobs.models.checks.check_buildable`, is imported from its module: what a rank imports never
reaches it.
"""

from __future__ import annotations

from jobs.models.build import REGISTRY, build_for, build_model, materialize, place_buffers, replays_init
from jobs.models.flops import flops_per_sample, param_count
from jobs.models.hf import is_hf_model
from jobs.models.init import init_weights
from jobs.models.units import replace_units, shard_units, tp_plan, units_text

__all__ = [
    "REGISTRY",
    "build_for",
    "build_model",
    "flops_per_sample",
    "init_weights",
    "is_hf_model",
    "materialize",
    "param_count",
    "place_buffers",
    "replace_units",
    "replays_init",
    "shard_units",
    "tp_plan",
    "units_text",
]
