"""Dataclasses <-> JSON-able values, driven by the type hints (stdlib only).

A cell's RunSpec (``spec.json``) and the sweep document (``sweep.json``) are written with
:func:`to_plain` and read back with :func:`from_plain`. Unlike pickles, the files survive a class
moving between modules, and a person can read them. Enums are written as their values; an unknown
field in the input is an error that names it, so a document from another version is refused
rather than half-read.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")

# Field metadata for a value that lives in memory only: ``to_plain`` leaves it out, so it is never
# written (a planned cell's whole resolved configuration, which its own spec.json keeps).
TRANSIENT = {"transient": True}


def to_plain(obj: Any) -> Any:
    """A dataclass tree as dicts, lists and scalars (enums by value)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: to_plain(getattr(obj, name)) for name in _written(type(obj))}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


@functools.cache
def _written(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` that are written (all but the transient ones), in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("transient"))


def from_plain(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` (a dataclass, enum, container or scalar type) from :func:`to_plain`'s output."""
    return _build(cls, data, where or getattr(cls, "__name__", "value"))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _plan(tp: Any) -> tuple[str, Any]:
    """How a value of type ``tp`` is built, decided once per type (a sweep document of a thousand cells
    builds the same few types tens of thousands of times)."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return "any", None
    if origin in (typing.Union, types.UnionType):
        return "union", typing.get_args(tp)
    if origin in (list, tuple):
        return "list", (typing.get_args(tp)[:1] or (Any,))[0]
    if origin is dict:
        return "dict", (typing.get_args(tp) or (str, Any))[1]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "enum", None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        names = frozenset(f.name for f in dataclasses.fields(tp) if f.init and not f.metadata.get("transient"))
        return "dataclass", (_hints(tp), names)
    return ("type", None) if isinstance(tp, type) else ("any", None)


def _build(tp: Any, data: Any, where: str) -> Any:
    kind, detail = _plan(tp)
    if kind == "type":
        if tp is float and isinstance(data, int) and not isinstance(data, bool):
            return float(data)
        if not isinstance(data, tp):
            raise TypeError(f"{where}: expected {tp.__name__}, got {data!r}")
        return data
    if kind == "union":
        if data is None and type(None) in detail:
            return None
        errors = []
        for arg in (a for a in detail if a is not type(None)):
            try:
                return _build(arg, data, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError(f"{where}: {data!r} matches none of {tp}: {'; '.join(errors)}")
    if kind == "list":
        return [_build(detail, v, f"{where}[{i}]") for i, v in enumerate(data)]
    if kind == "dict":
        return {k: _build(detail, v, f"{where}.{k}") for k, v in data.items()}
    if kind == "enum":
        return tp(data)
    if kind == "dataclass":
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected a mapping for {tp.__name__}, got {type(data).__name__}")
        if hasattr(tp, "variant"):  # a base class whose record names its subclass (a backend's settings)
            tp, data = tp.variant(data)
            kind, detail = _plan(tp)
        hints, names = detail
        unknown = sorted(set(data) - names)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(names), n=1, cutoff=0.6)
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} for {tp.__name__}"
                             + (f" (did you mean {close[0]}?)" if close else ""))
        return tp(**{k: _build(hints[k], v, f"{where}.{k}") for k, v in data.items()})
    return data
