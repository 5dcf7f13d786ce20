"""The probes' spec files: what ``python -m jobs FILE`` starts besides a cell (whose file is its
``spec.json``, a RunSpec). A probe's file names its program and holds its spec, so that any backend
can start it as it starts a cell's ranks, with no pickle (``torchrun ... -m jobs FILE``):

    {"program": "fabric", "spec": {...}}       jobs/fabric.py, a ProbeSpec
    {"program": "nodeprobe", "spec": {...}}    jobs/nodeprobe.py, a NodeProbeSpec
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.codec import from_plain, to_plain
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec

PROGRAMS: dict[str, type] = {"fabric": ProbeSpec, "nodeprobe": NodeProbeSpec}
SPEC_FILE = "probe-spec.json"  # in the probe's folder, beside what its backend writes


def program_of(spec: ProbeSpec | NodeProbeSpec) -> str:
    """The program that measures ``spec``."""
    return next(name for name, kind in PROGRAMS.items() if isinstance(spec, kind))


def write(folder: Path, spec: ProbeSpec | NodeProbeSpec) -> Path:
    """``spec``'s file in ``folder`` (made if need be): what ``python -m jobs`` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SPEC_FILE
    path.write_text(json.dumps({"program": program_of(spec), "spec": to_plain(spec)}, indent=1, sort_keys=True))
    return path


def is_probe(data: Any) -> bool:
    """Whether a spec file's contents are a probe's (else a cell's RunSpec)."""
    return isinstance(data, dict) and set(data) == {"program", "spec"}


def read(data: dict[str, Any]) -> tuple[str, ProbeSpec | NodeProbeSpec]:
    """(program, spec) from a probe file's contents; ValueError naming what is wrong."""
    program = data["program"]
    if program not in PROGRAMS:
        raise ValueError(f"program {program!r} is none of {', '.join(PROGRAMS)}")
    return program, from_plain(PROGRAMS[program], data["spec"])
