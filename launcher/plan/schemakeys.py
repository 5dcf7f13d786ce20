"""The schema's keys (launcher/plan/schema.py's Config): every dotted key, the keys of a composed
config it does not have and the nearest valid one, and open dicts: what makes
overrides strict (values that are not finite: contract/spec.py's non_finite)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Union, cast

from launcher.plan.clusterschema import ClusterConfig
from launcher.plan.schema import Config


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls: type, name: str) -> Any:
    """The type hint of dataclass ``cls``'s field ``name``; None when it has no such field."""
    return _hints(cls).get(name)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_open(tp: Any) -> bool:
    """A dict-typed field (model.params, cluster.additional_parameters): any key may go in it."""
    tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp) if typing.get_origin(tp) is Union else tp
    return typing.get_origin(tp) in (dict, dict) or tp is dict


def _variants(tp: type) -> list[type]:
    """The classes a field of dataclass type ``tp`` may hold: the backends' settings for ``cluster``
    (ClusterConfig.subtypes), else ``tp`` itself."""
    return tp.subtypes() if hasattr(tp, "subtypes") else [tp]


@functools.cache
def schema_keys(cls: type | None = None, prefix: str = "") -> dict[str, bool]:
    """{dotted key: is an open dict} for every key of the schema (Config by default), every backend's
    cluster settings included."""
    out: dict[str, bool] = {}
    for variant in _variants(cls or Config):
        for name, tp in _hints(variant).items():
            key = prefix + name
            out[key] = _is_open(tp)
            if _is_dataclass_type(tp):
                out.update(schema_keys(tp, key + "."))
    return out


def unknown_keys(tree: Any, cls: type | None = None, prefix: str = "") -> list[str]:
    """Keys of a composed config (plain dicts) that the schema does not have; open dicts are not
    looked into. ``cluster`` is read as the settings of the backend it names."""
    cls = cls or Config
    hints = _hints(cls.subtype_for(tree) if hasattr(cls, "subtype_for") else cls)
    found = []
    for key, value in (tree or {}).items():
        if key not in hints:
            found.append(prefix + str(key))
        elif _is_dataclass_type(hints[key]) and isinstance(value, dict):
            found.extend(unknown_keys(value, hints[key], f"{prefix}{key}."))
    return found


def read_by(key: str) -> list[str]:
    """The backends whose settings have ``cluster.*`` key ``key`` (all of them for the shared ones)."""
    if not key.startswith("cluster."):
        return []
    return [sub.name for sub in ClusterConfig.subtypes() if key in schema_keys(cast(type, sub), "cluster.")]


def did_you_mean(key: str) -> str:
    """The closest valid key, as a hint: "did you mean strategy.bucket_cap_mb?" (or the group's keys);
    for a key of another backend's settings, that backend."""
    owners = read_by(key)
    if owners:
        return (f"{key} is read only by {', '.join(f'cluster={n}' for n in owners)} (a setting of the "
                f"{' and '.join(owners)} backend{'s' if len(owners) > 1 else ''}): drop it, or use cluster={owners[0]}.")
    keys = list(schema_keys())
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    parent = key.rpartition(".")[0]
    siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
    return f"valid keys{' of ' + parent if parent else ''}: {', '.join(siblings)}."
