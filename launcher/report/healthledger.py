"""The node ledger, read and written one way (launcher/report/health.py judges the probes it keeps;
launcher.health, health=auto and launcher.history read it).

Every probe of a cluster is appended to ``health-<cluster>.jsonl`` in the output root, beside
``fabrics.json``, under its lock and atomically (contract/records.py, append_line): one line per
probe with every node's figures, every pair's, the verdicts and what was asked. A line that is not
such a record (cut short by a full disk, other JSON, edited by hand) is named in a warning and set
aside (contract/records.py, read_lines): not read, and left where it is in the file, for a person
to repair or delete (its place matters: ``--check`` answers undecided for a node when a damaged
line may be the node's latest probe). A NaN or infinite figure is set aside alone, the rest of its
probe kept.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from contract import records


def ledger_path(root: Path, cluster_key: str) -> Path:
    """``<output_root>/health-slurm_debug.jsonl``: one ledger per cluster, beside fabrics.json."""
    return Path(root) / f"health-{re.sub(r'[^A-Za-z0-9_.-]+', '_', cluster_key)}.jsonl"


def history_dir(ledger: Path) -> Path:
    """Where ``python -m launcher.history --ledger`` writes the ledger's history: report.md and
    history.png in ``health-<cluster>-history/`` beside the ledger."""
    return Path(ledger).with_name(Path(ledger).stem + "-history")


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one probe's record (a damaged line stays where it is)."""
    records.append_line(path, record)


Ledger = records.Lines  # a ledger as read: its probes with their line numbers, and the lines set aside


_SHAPE: dict[str, type | tuple[type, ...]] = {"cluster": str, "measured_at": str, "nodes": dict, "pairs": dict,
                                              "verdicts": dict, "asked": dict}
_VERDICTS: dict[str, type | tuple[type, ...]] = {"flagged": list, "slow_nodes": dict, "slow_links": dict,
                                                 "dcgm_failed": dict, "note": str, "judged": bool}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape(rec: dict[str, Any]) -> str | None:
    """Why ``rec`` is not a probe record (None: it is one)."""
    for where, want, got in [*((k, t, rec.get(k)) for k, t in _SHAPE.items()),
                             *((f"verdicts.{k}", t, (rec.get("verdicts") or {}).get(k)) for k, t in _VERDICTS.items()
                               if isinstance(rec.get("verdicts"), dict))]:
        if not isinstance(got, want):
            return f"JSON of another shape ({where} is {'missing' if got is None else type(got).__name__})"
    for host, node in rec["nodes"].items():
        if not isinstance(node, dict) or not isinstance(node.get("figures"), dict) or not all(
                v is None or _number(v) for v in node["figures"].values()):
            return f"JSON of another shape (nodes.{host} holds no figures)"
        if not isinstance(node.get("repeats", {}), dict) or not all(
                isinstance(v, list) and all(_number(x) for x in v) for v in node.get("repeats", {}).values()):
            return f"JSON of another shape (nodes.{host}.repeats are not lists of numbers)"
    if not all(v is None or _number(v) for v in rec["pairs"].values()):
        return "JSON of another shape (pairs are not numbers)"
    return None


def _finite(rec: dict[str, Any]) -> list[str]:
    """Set aside each NaN or infinite figure of ``rec`` (a figure None, a repeat dropped); their names."""
    bad = []
    for host, node in rec["nodes"].items():
        for fig, value in node["figures"].items():
            if value is not None and not math.isfinite(value):
                node["figures"][fig] = None
                bad.append(f"nodes.{host}.figures.{fig}")
        for fig, values in node.get("repeats", {}).items():
            if not all(math.isfinite(v) for v in values):
                node["repeats"][fig] = [v for v in values if math.isfinite(v)]
                bad.append(f"nodes.{host}.repeats.{fig}")
    for pair, value in rec["pairs"].items():
        if value is not None and not math.isfinite(value):
            rec["pairs"][pair] = None
            bad.append(f"pairs.{pair}")
    return bad


def read_ledger(path: Path, warn: bool = True) -> Ledger:
    """The ledger's records with their line numbers; each damaged line set aside and (``warn``) named
    in a warning on stderr, every good record kept. No ledger (or none readable): an empty one."""
    return records.read_lines(Path(path), _shape, _finite, what="probe", say=warn)


def may_hold(ledger: Ledger, number: int, node: str) -> bool:
    """Whether damaged line ``number`` may be a probe of ``node``: unreadable, or naming it."""
    return number in ledger.unreadable or json.dumps(node) in ledger.text.get(number, "")


def read(path: Path) -> list[dict[str, Any]]:
    """Every probe of the ledger, oldest first (a damaged line named in a warning and set aside)."""
    return [rec for _, rec in read_ledger(path).records]
