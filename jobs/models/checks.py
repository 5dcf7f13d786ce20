"""Checking before submission: :func:`check_buildable`, the launcher's refusal, with the fix, of a
model the ranks could not build (the checks that need no import are ModelSpec.validate's; those of
transformers models are in jobs.models.hf_checks)."""

from __future__ import annotations

from torch import nn

from contract.errors import ConfigError
from contract.imports import import_problem
from contract.modelspec import ModelSpec
from jobs.models.build import REGISTRY, on_meta
from jobs.models.hf_checks import check_hf, check_hf_target
from jobs.models.instantiate import InstantiationError, instantiate, locate

_TARGET_FIX = ("set model._target_ to an nn.Module subclass, or a function returning one, importable on the "
               "nodes (e.g. torch.nn.Linear, torchvision.models.resnet50, transformers.GPT2LMHeadModel).")


def check_buildable(spec: ModelSpec) -> None:
    """Refuse, before anything is submitted, a model the ranks could not build; raise ConfigError.

    Runs after composition, on the launcher's host (which needs the same packages as the nodes):
    it imports torch and, for transformers models, transformers, and builds the model on the meta
    device (no memory, no weights read), so a bad dotted path, a ``_target_`` that is not a model
    (``os.path.join``), wrong params, an architecture transformers does not know, a config that
    does not build, a vocabulary or position count that disagrees with model.vocab_size /
    model.seq_len, or an input kind the model does not take are all caught here with the fix.
    """
    target = spec.target_path
    if target:
        _check_target(spec, target)
    elif spec.name == "hf":
        check_hf(spec)
    else:
        _check_named(spec)


def _check_target(spec: ModelSpec, target: str) -> None:
    import inspect

    setting = spec.target_setting
    try:
        fn = locate(target)
    except InstantiationError as exc:
        if isinstance(exc.__cause__, AttributeError) or not isinstance(exc.__cause__, ImportError):
            raise ConfigError(setting, target, f"does not import here: {exc}", _TARGET_FIX) from exc
        problem = import_problem(target.rpartition(".")[0]) or f"{exc}"
        raise ConfigError(setting, target, f"does not import: {problem}.", "install that package where the "
                          "launcher and the ranks run, or name a class of a package installed there.") from exc
    is_class = inspect.isclass(fn)
    if is_class and not issubclass(fn, nn.Module):
        raise ConfigError(setting, target, f"is a class, {fn.__module__}.{fn.__qualname__}, but not a "
                          "torch.nn.Module subclass.", _TARGET_FIX)
    if not callable(fn):
        raise ConfigError(setting, target, f"is a {type(fn).__name__}, not a class or a function.", _TARGET_FIX)
    try:
        model = on_meta(lambda: instantiate({"_target_": target, **spec.params}))
    except InstantiationError as exc:
        if is_class:
            raise ConfigError("model.params", dict(spec.params), f"building {target} with them (on the meta "
                              f"device) failed: {exc}", f"give model.params the keyword arguments "
                              f"{fn.__qualname__} takes.") from exc
        raise ConfigError(setting, target, "is not an nn.Module class, and calling it with model.params (on the "
                          f"meta device) failed: {exc}", _TARGET_FIX) from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(setting, target, f"returned a {type(model).__name__}, not a torch.nn.Module.", _TARGET_FIX)
    from jobs.models.hf import is_hf_model

    if is_hf_model(model):
        check_hf_target(spec, target, model.config)


def _check_named(spec: ModelSpec) -> None:
    builder = REGISTRY.get(spec.name)
    if builder is None:
        raise ConfigError("model.name", spec.name, "is not a model this project builds.",
                          f"use one of {', '.join(sorted(REGISTRY))}, model=hf, or model=custom with model._target_.")
    try:
        on_meta(lambda: builder(spec))
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError("model.params", dict(spec.params), f"model {spec.name!r} cannot be built with them: {exc}",
                          "drop or correct the offending model.params key.") from exc
