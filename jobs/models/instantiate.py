"""Hydra's ``_target_`` convention without Hydra: ``locate`` a dotted path, ``instantiate`` a config.

The worker side imports neither Hydra nor OmegaConf, so this is a small re-implementation of the
part of ``hydra.utils.instantiate`` that model configs use, on plain dicts and lists (what
``OmegaConf.to_object`` leaves in ``ModelSpec.params``):

* a dict with a ``_target_`` key is a call: the target is imported and called with the other keys
  as keyword arguments (and ``_args_``, a list, as positional arguments);
* its arguments are instantiated first, recursively, unless ``_recursive_: false``; dicts without
  ``_target_`` and lists are walked, so a ``_target_`` at any depth is built;
* ``_partial_: true`` returns ``functools.partial(target, ...)`` instead of calling it;
* ``_convert_`` is accepted and ignored: arguments are plain dicts and lists already.

Example, in a config or on the command line (``+model.params.config=...``)::

    _target_: transformers.GPT2LMHeadModel
    config: {_target_: transformers.GPT2Config, n_layer: 2, n_embd: 64, n_head: 2}
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

__all__ = ["InstantiationError", "instantiate", "locate"]

SPECIAL_KEYS = ("_target_", "_args_", "_recursive_", "_partial_", "_convert_")


class InstantiationError(ValueError):
    """A ``_target_`` that does not import, or whose call raised (the cause is chained)."""


def locate(path: str) -> Any:
    """The object at a dotted path such as ``torch.nn.Linear`` (nested attributes allowed)."""
    if not isinstance(path, str) or not path or path.startswith(".") or path.endswith("."):
        raise InstantiationError(f"_target_={path!r} is not a dotted path such as torch.nn.Linear.")
    parts = path.split(".")
    error: Exception | None = None
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError as exc:
            error = error or exc
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise InstantiationError(f"_target_={path!r}: {exc}.") from exc
        return obj
    raise InstantiationError(f"_target_={path!r} is not an importable dotted path ({error}).") from error


def instantiate(config: Any, *args: Any, **kwargs: Any) -> Any:
    """Build ``config``: ``_target_`` dicts are called (recursively), other values returned as they are.

    ``args`` and ``kwargs`` go to the top-level call only, after the config's own
    (keyword arguments given here win), as in ``hydra.utils.instantiate``.
    """
    if isinstance(config, dict) and "_target_" in config:
        return _call(config, args, kwargs)
    if args or kwargs:
        raise InstantiationError("extra arguments were given, but the config has no _target_ to call.")
    return _walk(config)


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        return _call(value, (), {}) if "_target_" in value else {k: _walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_walk(v) for v in value)
    return value


def _call(node: dict, args: tuple, kwargs: dict) -> Any:
    target = node["_target_"]
    fn = locate(target) if isinstance(target, str) else target
    if not callable(fn):
        raise InstantiationError(f"_target_={target!r} is not callable (a {type(fn).__name__}).")
    call_args = [*node.get("_args_", ()), *args]
    call_kwargs = {k: v for k, v in node.items() if k not in SPECIAL_KEYS}
    call_kwargs.update(kwargs)
    if node.get("_recursive_", True):
        call_args = [_walk(a) for a in call_args]
        call_kwargs = {k: _walk(v) for k, v in call_kwargs.items()}
    if node.get("_partial_", False):
        return functools.partial(fn, *call_args, **call_kwargs)
    try:
        return fn(*call_args, **call_kwargs)
    except InstantiationError:
        raise
    except Exception as exc:
        name = target if isinstance(target, str) else getattr(fn, "__qualname__", repr(fn))
        raise InstantiationError(f"error in call to _target_={name!r}: {type(exc).__name__}: {exc}") from exc
