"""What model a cell builds: :class:`ModelSpec`, and the checks decided from the config alone (no
import of torch or transformers; jobs.models.checks builds the model on the meta device for the rest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.catalog import KNOWN_MODELS
from contract.choices import HF_INSTALL, HF_PACKAGE, HF_POSITION_KEYS, InputKind, LMHead
from contract.errors import ConfigError, positive
from contract.imports import import_problem


@dataclass
class ModelSpec:
    # A name from jobs.models.REGISTRY; `hf` (a Hugging Face transformers model built from a
    # config, see below); or any importable model through `_target_`.
    name: str = "gpt_tiny"
    # Hydra's convention: the dotted path of an nn.Module class, or of a function returning one,
    # called with `params` as keyword arguments; dicts with their own `_target_` inside `params`
    # are instantiated first, recursively (hydra.utils.instantiate's semantics, without Hydra).
    # Its input is described by the fields below.
    _target_: str | None = None
    target: str | None = None  # alias of `_target_`
    input: InputKind = InputKind.tokens
    seq_len: int = 128
    vocab_size: int = 50257
    image_size: int = 224
    num_classes: int = 1000
    params: dict[str, Any] = field(default_factory=dict)
    # model=hf: the architecture, as transformers.AutoConfig.for_model(arch, **config) takes it
    # (gpt2, llama, bert, qwen2, mistral, ...), or a directory holding a config.json instead.
    arch: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    config_path: str | None = None
    # model=hf: a local directory written by save_pretrained; its weights are loaded (no hub access).
    pretrained_path: str | None = None
    head: LMHead = LMHead.auto
    # The project's GPT models: the embedding and output rows padded up to a multiple of this
    # (50257 -> 50304 for 64); padded ids never occur in the data nor count in the loss. None:
    # the device's default (contract/tuning.py: 64 on CUDA).
    vocab_multiple: int | None = None

    @property
    def target_path(self) -> str | None:
        """The dotted path to build, from `_target_` or its alias `target` (None: a named model)."""
        return self._target_ or self.target

    @property
    def target_setting(self) -> str:
        """The setting the dotted path was given in, for the errors that name it."""
        return "model._target_" if self._target_ else "model.target"

    @property
    def is_hf(self) -> bool:
        return self.name == "hf" and not self.target_path

    def validate(self) -> None:
        for name in ("seq_len", "vocab_size", "image_size", "num_classes"):
            positive(f"model.{name}", getattr(self, name), f"set model.{name} to a positive integer.")
        if self._target_ and self.target and self._target_ != self.target:
            raise ConfigError("model.target", self.target, f"contradicts model._target_={self._target_!r} "
                              "(model.target is an alias of model._target_).", "set only one of the two.")
        target = self.target_path
        setting = self.target_setting
        if self.name == "custom" and target in (None, "???"):
            raise ConfigError("model.target", target, "model=custom builds the class named by model._target_ "
                              "(alias model.target), and none is given; it must be importable on the nodes.",
                              "set model._target_=package.module.Class (e.g. torchvision.models.resnet50 where torchvision "
                              "is installed).")
        if target is not None:
            module = target.rpartition(".")[0]
            if target == "???" or not module:
                raise ConfigError(setting, target, "is not a dotted class path.",
                                  f"set {setting}=package.module.Class for an installed package "
                                  "(e.g. mypackage.models.MyNet).")
            problem = import_problem(module)
            if problem:
                raise ConfigError(setting, target, f"does not import: {problem}.",
                                  "install that package where the launcher and the ranks run, or name a class of a "
                                  "package installed there.")
        elif self.name == "hf":
            self._validate_hf()
        elif self.name not in KNOWN_MODELS:
            raise ConfigError("model.name", self.name, "is not a model this project builds.",
                              f"use one of {', '.join(KNOWN_MODELS)}, model=hf with model.arch, "
                              "or model=custom with model._target_.")
        else:
            self._validate_named()

    def _validate_named(self) -> None:
        """A built-in model: model.config is model=hf's and would be dropped; its params are layer
        counts and sizes (at least 1; d_ff 0 means 4 x d_model) and a dropout in [0, 1)."""
        if self.config:
            key = next(iter(self.config))
            raise ConfigError(f"model.config.{key}", self.config[key], f"model.config is read by model=hf only, and "
                              f"model={self.name} is a built-in model: it would be dropped without a word.",
                              "set its sizes through model.params (e.g. model.params.n_layer=4), or use model=hf "
                              "with model.arch.")
        for key, value in self.params.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key == "dropout":
                if not 0 <= value < 1:
                    raise ConfigError(f"model.params.{key}", value, "is not a dropout probability.",
                                      "use a value in [0, 1), e.g. model.params.dropout=0.1.")
            elif not isinstance(value, int) or value < (0 if key == "d_ff" else 1):
                raise ConfigError(f"model.params.{key}", value, f"is a count or a size of model={self.name}: a whole "
                                  f"number of at least {0 if key == 'd_ff' else 1}.",
                                  f"set model.params.{key} to a positive integer, or drop it for the model's default.")

    def _validate_hf(self) -> None:
        """Cheap model=hf checks (no import, no torch: the launcher runs them at composition);
        jobs.models.hf_checks does those that import transformers, before submission."""
        import importlib.util
        import os

        if importlib.util.find_spec(HF_PACKAGE) is None:
            raise ConfigError("model", "hf", f"builds Hugging Face models and needs the {HF_PACKAGE} package, "
                              "which is not installed here (nor, likely, on the nodes).",
                              f"{HF_INSTALL} (where the launcher and the ranks run).")
        if self.input is not InputKind.tokens:
            raise ConfigError("model.input", self.input.value, "model=hf builds language models, which take tokens.",
                              "set model.input=tokens.")
        sources = [s for s in ("arch", "config_path", "pretrained_path") if getattr(self, s)]
        if not sources:
            raise ConfigError("model.arch", self.arch, "model=hf needs an architecture: model.arch (a name), "
                              "model.config_path or model.pretrained_path (a directory with a config.json).",
                              "set model.arch=gpt2 (or llama, bert, qwen2, mistral, ...).")
        if len(sources) > 1:
            given = " and ".join(f"model.{s}" for s in sources)
            unset = " ".join(f"model.{s}=null" for s in sources if s != sources[-1])
            raise ConfigError(f"model.{sources[-1]}", getattr(self, sources[-1]), f"{given} both name the "
                              "architecture; model=hf takes one of model.arch, model.config_path and "
                              "model.pretrained_path.",
                              f"add {unset}" + (" 'model.config={}'" if self.config else "")
                              + " (the shipped model=hf sets model.arch and a tiny model.config).")
        if "model_type" in self.config:
            raise ConfigError("model.config.model_type", self.config["model_type"], "the architecture is "
                              "model.arch: model.config holds the settings of its config class.",
                              f"set model.arch={self.config['model_type']} and drop model.config.model_type.")
        if self.config and not self.arch:
            raise ConfigError("model.config", dict(self.config), f"model.config overrides apply to model.arch; with "
                              f"model.{sources[0]} the directory's config.json is used as is.",
                              "add 'model.config={}', and edit the config.json instead.")
        for path_setting in ("config_path", "pretrained_path"):
            path = getattr(self, path_setting)
            if path and not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"model.{path_setting}", path, "holds no config.json (a local directory "
                                  "written by save_pretrained is expected; nothing is downloaded).",
                                  "give the absolute path of such a directory that every node can read.")
        vocab = self.config.get("vocab_size")
        if vocab is not None and vocab != self.vocab_size:
            raise ConfigError("model.config.vocab_size", vocab, f"differs from model.vocab_size={self.vocab_size}, "
                              "the vocabulary the data is drawn from.",
                              f"set model.vocab_size={vocab} and drop model.config.vocab_size (it follows "
                              "model.vocab_size).")
        for key in HF_POSITION_KEYS:
            positions = self.config.get(key)
            if positions is not None and positions < self.seq_len:
                raise ConfigError(f"model.config.{key}", positions, f"is below model.seq_len={self.seq_len}: "
                                  "the model has no position for the later tokens.",
                                  f"raise model.config.{key} to at least {self.seq_len}, or drop it (it follows "
                                  "model.seq_len), or lower model.seq_len.")


