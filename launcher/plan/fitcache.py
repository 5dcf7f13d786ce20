"""A cache of the meta-device analysis (parameter shapes, activation estimate) between launches.

Building a model on the meta device needs torch, whose import alone takes longer than composing
and submitting a whole grid on a login node. The figures depend only on the model's settings,
the batch shape, the precision and the code that builds the model, so a launch that asks the same
again (a nightly sweep, a resubmitted grid, --plan then the run) reads them from here and never
imports torch. The key holds the settings and the versions of that code: this project's model
and loss sources (by content), torch, transformers and any config file the model reads. A model
given as a dotted path (``_target_``) may be any user's code, whose changes the key cannot see
without importing it: it is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import jobs
from contract import records, spec
from contract.metrics import FLOPS_PER_SAMPLE

# The sources that decide a project model's parameters and what its forward and loss save, and the
# analysis itself (launcher/plan/fit.py).
_SOURCES = ("models", "loop.py")  # of jobs/; with the spec, whose ModelSpec they build from


def directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddp-fsdp-bench" / "fit"


def key(model: dict[str, Any], shape: dict[str, Any]) -> str | None:
    """The cache key of one analysis, or None when it must not be cached (a user's dotted path)."""
    if _has_target(model):
        return None
    files = [model.get("config_path"), model.get("pretrained_path")]
    parts = {"model": model, "shape": shape, "code": _code_digest(), "versions": _versions(),
             "files": {f: _file_digest(f) for f in files if f}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# What each kind of entry holds.
Fields = dict[str, type | tuple[type, ...]]
ANALYSIS: Fields = {"shapes": list, "activations": (int, type(None)), "in_unit": list}
FLOPS: Fields = {FLOPS_PER_SAMPLE: (int, float, type(None))}  # None: a model whose FLOPs cannot be counted
BUFFERS: Fields = {"buffer_bytes": int}


def read(cache_key: str | None, fields: Fields) -> dict | None:
    """The entry kept under ``cache_key`` holding ``fields``, or None: not kept, or damaged (cut short,
    of another shape, NaN: named in a warning and read as a miss, so the launch analyses again and
    writes it anew; every other entry is still used)."""
    if cache_key is None:
        return None
    path = directory() / f"{cache_key}.json"
    found = records.maybe_document(path, "a kept model analysis", checked=True)
    nan = records.nonfinite(found)
    why = None if found is None else f"{', '.join(nan)} NaN or infinite" if nan else records.lacks(found, fields)
    if why:
        records.warn(f"warning: {path} (a kept model analysis): {why}: set aside, analysed again and written anew.")
    return None if why else found


def write(cache_key: str | None, value: dict) -> None:
    """Best effort: an unwritable cache only costs the next launch the analysis."""
    if cache_key is None:
        return
    path = directory() / f"{cache_key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        records.write_document(path, value, indent=None)  # a concurrent launch reads the old file or the new
    except OSError:
        pass


def flops_per_sample(model: spec.ModelSpec) -> float | None:
    """Training FLOPs of one sample of ``model`` (launcher/plan/fit.py, count_flops), kept here like the
    analysis: a forecast or a report reads them without importing torch once a launch counted them."""
    from launcher.plan import fit

    cache_key = _flops_key(model)
    hit = read(cache_key, FLOPS)
    if hit is not None:
        return hit[FLOPS_PER_SAMPLE]
    value = fit.count_flops(model)
    write(cache_key, {FLOPS_PER_SAMPLE: value})
    return value


def keep_flops_per_sample(model: spec.ModelSpec, value: float) -> None:
    """The worker's own count for ``model`` (its results' flops_per_sample), kept where
    :func:`flops_per_sample` reads it: a forecast of any cell of a model that ran builds nothing."""
    cache_key = _flops_key(model)
    if (read(cache_key, FLOPS) or {}).get(FLOPS_PER_SAMPLE) != value:
        write(cache_key, {FLOPS_PER_SAMPLE: value})


def _flops_key(model: spec.ModelSpec) -> str | None:
    from contract.codec import to_plain

    return key(to_plain(model), {"count": FLOPS_PER_SAMPLE})


def buffer_bytes(model: spec.ModelSpec) -> int:
    """Bytes of ``model``'s buffers (launcher/plan/fit.py, count_buffer_bytes), kept like the FLOPs."""
    from contract.codec import to_plain
    from launcher.plan import fit

    cache_key = key(to_plain(model), {"count": "buffer_bytes"})
    hit = read(cache_key, BUFFERS)
    if hit is not None:
        return hit["buffer_bytes"]
    value = fit.count_buffer_bytes(model)
    write(cache_key, {"buffer_bytes": value})
    return value


def _has_target(value: Any) -> bool:
    if isinstance(value, dict):
        return any((k in ("_target_", "target") and v) or _has_target(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_target(v) for v in value)
    return False


def _code_digest() -> str:
    root = Path(jobs.__file__).parent
    paths = [root / name for name in _SOURCES] + [Path(spec.__file__), Path(__file__).with_name("fit.py")]
    digest = hashlib.sha256()
    for path in paths:
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in ("torch", "torchvision", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def _file_digest(path: str) -> str | None:
    target = Path(path)
    files = sorted(p for p in target.rglob("*") if p.is_file() and p.suffix == ".json") if target.is_dir() else [target]
    digest = hashlib.sha256()
    try:
        for f in files:
            digest.update(f.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()
