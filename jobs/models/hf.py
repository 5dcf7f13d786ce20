"""Hugging Face transformers models built from a config (``model=hf``): no weights, no hub access.

The architecture comes from ``model.arch`` through ``transformers.AutoConfig.for_model(arch,
**model.config)``, from a local ``config.json`` (``model.config_path``), or from a local
``save_pretrained`` directory whose weights are loaded (``model.pretrained_path``). The config's
vocabulary is ``model.vocab_size`` and its position count ``model.seq_len`` (for ``model.arch``
they are written into the config; a directory's config must agree, see :mod:`jobs.models.hf_checks`).

Which head. ``model.head=auto`` picks, explicitly:

* ``masked_lm`` (``AutoModelForMaskedLM``) when the config's ``architectures`` names a
  ``...ForMaskedLM`` class, or, without that list, when transformers has a masked-LM class for the
  config's ``model_type`` and the config does not set ``is_decoder=True``: bert, roberta, electra,
  ... (encoders; some of them also have a causal-LM class, which ``auto`` does not pick);
* ``causal_lm`` (``AutoModelForCausalLM``) otherwise: gpt2, llama, qwen2, mistral, ...

Encoder-decoder configs (t5, bart) are refused: their forward needs decoder inputs.

What the loss means. :class:`HFLogits` returns the model output's ``.logits`` [B, T, vocab], so the
loop's ``cross_entropy(logits, targets)`` applies unchanged. Targets are the data's next tokens
(``targets[t] = input[t + 1]``). For a causal LM that is its training objective. A masked LM sees the
whole sequence, so it can read ``input[t + 1]`` at position t + 1: the task is learnable (the loss
falls) and every position is predicted, while the last position's target is not in the input. The
step's work is a masked LM's training step with logits at every position, which is also what
``BertForMaskedLM`` computes (the 15%-masked loss only selects positions of the same logits), so
the throughput is that of MLM training; no [MASK] token is inserted.

Initialisation. ``build_model`` builds the skeleton on meta, ``to_empty`` and then
:meth:`HFLogits.init_whole` (the same path a deferred-init worker takes): every
``_is_hf_initialized`` flag is cleared, the model's own ``initialize_weights()`` runs (its
``_init_weights`` per module: normal(0, initializer_range), GPT-2's scaled residual projections,
BERT's position ids, rotary ``inv_freq`` buffers, ...), with tied weights tied before and after
(``to_empty`` on an unsharded model gives every parameter its own storage, while a model sharded on
meta keeps them tied; tying first makes both draw the same numbers), and with ``pretrained_path`` the directory's weights are copied in
(into DTensor shards too).
"""

from __future__ import annotations

import inspect
import json
import os
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

from contract.choices import HF_INSTALL, HF_POSITION_KEYS, LMHead
from jobs.shards import local_slices

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from contract.modelspec import ModelSpec

__all__ = ["HFLogits", "build_hf", "hf_config", "is_hf_model", "pick_head", "wrap_hf"]


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"model=hf needs the transformers package: {HF_INSTALL}.") from exc
    return transformers


def is_hf_model(model: Any) -> TypeGuard[PreTrainedModel]:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (without importing transformers)."""
    return isinstance(model, nn.Module) and any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(model).__mro__)


def hf_config(spec: ModelSpec) -> Any:
    """The transformers config ``spec`` describes (model.arch + model.config, or a local directory)."""
    transformers = _transformers()
    if spec.arch:
        overrides: dict[str, Any] = {"vocab_size": spec.vocab_size, **spec.config}
        cfg = transformers.AutoConfig.for_model(spec.arch, **overrides)
        if not any(key in spec.config for key in HF_POSITION_KEYS):
            for key in HF_POSITION_KEYS:  # the first name this config has (attribute maps included)
                if isinstance(getattr(cfg, key, None), int):
                    setattr(cfg, key, spec.seq_len)
                    break
        return cfg
    path = spec.config_path or spec.pretrained_path
    return transformers.AutoConfig.from_pretrained(path, local_files_only=True)


def pick_head(cfg: Any, head: LMHead = LMHead.auto) -> LMHead:
    """causal_lm or masked_lm for this config (the rule is in the module docstring)."""
    if head is not LMHead.auto:
        return head
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    for name in getattr(cfg, "architectures", None) or ():
        if name.endswith("ForMaskedLM"):
            return LMHead.masked_lm
        if name.endswith(("ForCausalLM", "LMHeadModel")):
            return LMHead.causal_lm
    if cfg.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(cfg, "is_decoder", False):
        return LMHead.masked_lm
    return LMHead.causal_lm


def _auto_class(head: LMHead) -> Any:
    transformers = _transformers()
    return transformers.AutoModelForMaskedLM if head is LMHead.masked_lm else transformers.AutoModelForCausalLM


class HFLogits(nn.Module):
    """A transformers model behind the benchmark's ``forward(tokens) -> logits`` contract."""

    def __init__(self, model: nn.Module, pretrained_path: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.pretrained_path = pretrained_path
        # Causal LMs would build a key/value cache for generation on every forward; training needs none.
        params = inspect.signature(type(model).forward).parameters
        self._forward_kwargs = {"use_cache": False} if "use_cache" in params else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No attention mask: synthetic and token-file batches have no padding.
        return self.model(input_ids=x, **self._forward_kwargs).logits

    def _hf_models(self) -> list[PreTrainedModel]:
        """The outermost PreTrainedModels inside (one, unless a user's module holds several)."""
        found: list[PreTrainedModel] = []
        prefixes: list[str] = []
        for name, module in self.named_modules():
            if is_hf_model(module) and not any(name.startswith(p) for p in prefixes):
                found.append(module)
                prefixes.append(name + ".")
        return found

    def tp_plan(self) -> dict[str, str] | None:
        """transformers' own tensor-parallel plan of the architecture (its config's
        ``base_model_tp_plan``, e.g. llama's q/k/v colwise and o_proj rowwise), its paths made
        relative to this module; None where the architecture declares none (gpt2, bert). A
        declaration: not yet run."""
        for name, module in self.named_modules():
            if is_hf_model(module):
                plan = getattr(module.config, "base_model_tp_plan", None)
                if not plan:
                    return None
                base = getattr(module, "base_model_prefix", "")
                prefix = ".".join(p for p in (name, base if hasattr(module, base) else "") if p)
                return {f"{prefix}.{path}": style for path, style in plan.items()}
        return None

    def shard_units(self) -> list[nn.Module]:
        """The modules named in ``_no_split_modules`` (the blocks accelerate wraps as FSDP units).

        Outermost matches only, and none that shares a parameter with a module outside it: BERT's
        ``BertEmbeddings`` is in the list, but its word embedding is tied to the MLM decoder in the
        root, and a tied parameter cannot live in two FSDP units; it stays in the root's unit.
        """
        names: set = set()
        for hf in self._hf_models():
            names |= set(getattr(hf, "_no_split_modules", None) or ())
        owners: dict[int, list[str]] = {}
        for mod_name, module in self.named_modules():
            for _, p in module.named_parameters(recurse=False, remove_duplicate=False):
                owners.setdefault(id(p), []).append(mod_name)
        units: list[nn.Module] = []
        taken: list[str] = []
        for mod_name, module in self.named_modules():
            inner = _wrapped_unit(module)  # after replace_units (checkpointing, compilation)
            if type(inner).__name__ not in names or any(mod_name.startswith(t) for t in taken):
                continue
            prefix = mod_name + "."
            shared = any(not (o == mod_name or o.startswith(prefix))
                         for p in module.parameters() for o in owners.get(id(p), ()))
            if not shared:
                units.append(module)
                taken.append(prefix)
        return units

    def init_whole(self) -> None:
        """Initialise as transformers does (module docstring), then load pretrained weights if any."""
        for hf in self._hf_models():
            for obj in [*hf.modules(), *hf.parameters(), *hf.buffers()]:
                if getattr(obj, "_is_hf_initialized", False):
                    # transformers' own flag, set on modules and tensors alike; neither class declares it.
                    setattr(obj, "_is_hf_initialized", False)  # noqa: B010
            # Tie first: an eager build's to_empty untied the embeddings while a sharded model kept
            # them tied; tied in both, both draw the same numbers (the output layer's draw wins).
            hf.tie_weights()
            hf.initialize_weights()
            hf.tie_weights()
        if self.pretrained_path:
            load_local_weights(self.model, self.pretrained_path)

    def train_flops_per_sample(self, seq_len: int, n_params: int) -> float:
        """6 * N * T + 12 * n_layer * d_model * T^2, as for the project GPT (jobs.models.flops_per_sample).

        N counts the parameters that take part in a matmul: every embedding table is a lookup and
        left out (token, position, token-type), except an input embedding tied to the output
        projection, whose one weight is that matmul's. Untied (Llama, Mistral) the output layer is
        counted as itself and the input table not at all (GPU review 3, G5: counting it too
        overstated MFU). The attention term uses the config's num_hidden_layers and hidden_size;
        causal attention is not discounted; MoE experts are all counted.
        """
        del n_params  # counted here, embedding tables apart (the matmul parameters only)
        n = sum(p.numel() for p in self.parameters())  # a tied weight is one parameter, counted once
        hf = self._hf_models()[0] if self._hf_models() else None
        token = hf.get_input_embeddings() if hf is not None else None
        output = hf.get_output_embeddings() if hf is not None else None
        tied = token is not None and output is not None and getattr(output, "weight", None) is token.weight
        for module in self.modules():
            if isinstance(module, nn.Embedding) and not (tied and module is token):
                n -= module.weight.numel()
        cfg = getattr(hf, "config", None)
        layers, width = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "hidden_size", None)
        attention = 12.0 * layers * width * seq_len**2 if isinstance(layers, int) and isinstance(width, int) else 0.0
        return 6.0 * n * seq_len + attention


def wrap_hf(model: nn.Module, pretrained_path: str | None = None) -> HFLogits:
    return model if isinstance(model, HFLogits) else HFLogits(model, pretrained_path)


def build_hf(spec: ModelSpec) -> HFLogits:
    """The skeleton of the model ``spec`` describes, on the ambient device, uninitialised."""
    cfg = hf_config(spec)
    model = _auto_class(pick_head(cfg, spec.head)).from_config(cfg)
    return HFLogits(model, spec.pretrained_path)


# --------------------------------------------------------------------------------------------
# Local weights


def _read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of a save_pretrained directory: model.safetensors (single or sharded) or pytorch_model.bin."""
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index) or os.path.isfile(single):
        from safetensors.torch import load_file

        if os.path.isfile(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(os.path.join(path, name)))
        return state
    bin_path = os.path.join(path, "pytorch_model.bin")
    if os.path.isfile(bin_path):
        return torch.load(bin_path, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"model.pretrained_path={path!r} holds no model.safetensors(.index.json) or "
                            "pytorch_model.bin; write it with save_pretrained.")


@torch.no_grad()
def load_local_weights(model: nn.Module, path: str) -> None:
    """Copy a save_pretrained directory's tensors into ``model`` (plain or DTensor parameters)."""
    state = _read_state_dict(path)
    missing = []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        src = state.get(name)
        if src is None:
            missing.append(name)
            continue
        src = src.to(dtype=tensor.dtype)
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            # Every rank read the whole file: each copies its own shard, with no communication
            # (distribute_tensor's src_data_rank=None, which would do the same, is newer than torch 2.6).
            tensor.to_local().copy_(src[local_slices(tensor.shape, tensor.device_mesh, tensor.placements)])
        else:
            tensor.copy_(src)
    # Non-persistent buffers (position ids, rotary tables) are not saved: initialise_weights set them.
    persistent = set(model.state_dict().keys())
    missing = [m for m in missing if m in persistent]
    if missing:
        raise ValueError(f"model.pretrained_path={path!r} lacks {len(missing)} tensors of the model, e.g. "
                         f"{missing[:3]}; was it saved from this architecture?")


def _wrapped_unit(module: nn.Module) -> nn.Module:
    """The block inside what jobs.models.replace_units put in its place (a checkpoint wrapper, a compiled
    module, or both)."""
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return module
        module = inner
