"""The worker's tuning settings as the GPU check sets them, and the figures it holds the results
against (standard library and contract/ only: the check's own process has no torch).

The check drives the worker with every tuning setting explicit (:func:`worker_tuning`), never
through an ``auto``/``null`` default, so that a result names what ran. A setting the installed
``contract.spec.RunSpec`` does not have yet is left out and said so (:func:`split_known`): the
check then measures the worker as that tree has it, and its results list what was set and what
was not.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from contract.spec import RunSpec

# The configurations the check reports (bf16 and fp16, their per-GPU batch sizes). GPT-2 small at
# 32 x 1024 tokens per step (llm.c's record runs 64 x 1024 per GPU; 32 keeps the launcher's fit
# check well inside an 80 GB H100); ResNet-50 at 256 images of 224 x 224 (DeepLearningExamples'
# batch for AMP on an 80 GB A100).
GPT2_BATCH = 32
GPT2_SEQ_LEN = 1024
RESNET50_BATCH = 256
VOCAB_MULTIPLE = 64  # 50,257 -> 50,304 for GPT-2

# Published figures for the same model on one GPU (/work/shared/FACTS.md, "GPU throughput"): each
# (source, low, high, unit); low == high for a single figure.
PUBLISHED: dict[tuple[str, str], list[tuple[str, float, float, str]]] = {
    ("gpt2-small", "bf16"): [("llm.c, 8 x H100, per GPU (524,288 tokens in 139 ms)", 471_000, 471_000, "tokens/s")],
    ("resnet50", "bf16"): [("NVIDIA DeepLearningExamples, one A100 80GB, AMP", 2_470, 2_470, "img/s")],
    ("resnet50", "fp16"): [("NVIDIA DeepLearningExamples, one A100 80GB, AMP", 2_470, 2_470, "img/s"),
                           ("Lambda, one H100 SXM5, fp16", 2_616, 2_791, "img/s")],
}

# Issue 38's "done when", on one H100 or H200: (what, threshold).
TARGET_GPT2_BF16_TOKENS_PER_S = 377_000  # 0.8 x llm.c's per-GPU figure
TARGET_RESNET50_BF16_IMG_PER_S = 3_000
TARGET_FSDP_OVER_DDP = 0.95  # at one rank, every precision
TARGET_WORKER_OVER_TUNED = 0.97  # every reported configuration


def is_conv(model: str) -> bool:
    return model.startswith("resnet") or model == "cnn"


def worker_tuning(model: str, strategy: str, *, cuda: bool) -> dict[str, Any]:
    """The worker's tuning settings for one side, as dotted RunSpec paths (``train.compile``).

    On CUDA the GPU-tuned choices, each explicit. On CPU (the rehearsal) the same keys where a CPU
    honours them, and no compilation (it would cost the rehearsal minutes): the rehearsal runs the
    code path, not the figures."""
    conv = is_conv(model)
    out: dict[str, Any] = {
        "train.compile": cuda,
        "train.optimizer_impl": "fused" if cuda else "foreach",
        "train.step_timing": "events" if cuda else "sync",
        "precision.mode": "autocast",  # DDP and FSDP compute the same numerics: a strategy comparison
    }
    if conv:
        out["train.channels_last"] = True
        out["train.loss"] = "full"  # 1,000 classes: the logits are small
        if cuda:
            out["train.cudnn_benchmark"] = True
    else:
        out["model.vocab_multiple"] = VOCAB_MULTIPLE
        # Compiled (CUDA), the whole cross-entropy inside the model's graph: inductor fuses its upcast
        # (no fp32 copy of the logits); eager (the CPU rehearsal), the CPU's default.
        out["train.loss"] = "full"
    if strategy == "fsdp":
        out["strategy.reshard_after_forward"] = False  # one rank: resharding frees nothing
    return out


def _field_type(cls: type, name: str) -> type | None:
    """The dataclass type of field ``name`` of ``cls``, or None when the field is not a dataclass
    (a leaf), or ``...`` (Ellipsis) when ``cls`` has no such field."""
    names = {f.name for f in dataclasses.fields(cls)}
    if name not in names:
        return ...  # type: ignore[return-value]
    tp = typing.get_type_hints(cls)[name]
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def spec_knows(path: str) -> bool:
    """Whether RunSpec has the dotted field ``path`` (``train.compile``, ``model.vocab_multiple``)."""
    cls: Any = RunSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        if cls is None:
            return False
        nxt = _field_type(cls, part)
        if nxt is ...:
            return False
        if i == len(parts) - 1:
            return True
        cls = nxt
    return False


def split_known(settings: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the settings RunSpec has, the paths of those it does not)."""
    known = {k: v for k, v in settings.items() if spec_knows(k)}
    return known, sorted(set(settings) - set(known))


def refused_key(setting: str, known: dict[str, Any]) -> str | None:
    """The key of ``known`` a refusal (``ConfigError.setting``, or the ``setting=value:`` the launcher
    prints) names: TrainSpec's settings are named without their ``train.`` prefix on the command line."""
    return next((k for k in (setting, f"train.{setting}") if k in known), None)


def set_path(plain: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path in a RunSpec's plain form (the dicts contract.codec reads)."""
    *parents, leaf = path.split(".")
    node = plain
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def launcher_override(path: str, value: Any) -> str:
    """A RunSpec path as the launcher's command line takes it: TrainSpec fields are top-level
    (``compile=true``), the groups keep their prefix (``model.vocab_multiple=64``)."""
    key = path.removeprefix("train.")
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"{key}={text}"


def describe(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "none"
