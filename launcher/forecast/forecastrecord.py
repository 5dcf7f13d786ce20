"""How far forecasts on a cluster have been off: a record that every sweep adds to.

``forecast-errors.json`` beside the sweep directories (the output root, next to the noise floor's
``noise-floor.json``), keyed like the noise floor by cluster (launcher/cluster/base.py,
noise_floor_key): for each cluster a list of checked forecasts, each ``{sweep, cell, kind, predicted,
measured, log_error, at}`` with kind ``loo`` (a sweep's leave-one-out, launcher/forecast/inputs.py)
or ``verify`` (``python -m launcher.forecast --verify``: a forecast cell run once). A sweep's
report replaces that sweep's own entries (a report written again counts once); the newest
``KEEP`` entries are kept. Every forecast's interval rests on them.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from contract import records
from launcher.forecast import perfmodel

RECORD_FILE = "forecast-errors.json"
KEEP = 500


def add(root: Path, key: str, sweep: str, entries: list[dict[str, Any]]) -> None:
    """Replace ``sweep``'s entries of the cluster ``key`` with ``entries`` (each: cell, kind,
    predicted, measured); best effort, like the noise floor (a read-only root keeps its record)."""
    now = datetime.now().isoformat(timespec="seconds")

    def added(records: dict[str, Any]) -> dict[str, Any]:
        kept = [e for e in records.get(key, []) if isinstance(e, dict) and e.get("sweep") != sweep]
        kept += [{**e, "sweep": sweep, "at": now, "log_error": perfmodel.log_error(e["predicted"], e["measured"])}
                 for e in entries if e.get("predicted") and e.get("measured")]
        records[key] = kept[-KEEP:]
        return records

    records.update_keyed(Path(root) / RECORD_FILE, added, _entry)  # under its lock, atomic, damage set aside


def errors(root: Path, key: str, without_sweep: str | None = None) -> list[dict[str, Any]]:
    """The cluster's checked forecasts (oldest first), leaving out one sweep's own where asked."""
    return [e for e in _read(root).get(key, []) if isinstance(e, dict) and isinstance(e.get("log_error"), float)
            and e.get("sweep") != without_sweep]


def ratio_errors(entries: list[dict[str, Any]]) -> list[float]:
    """How far forecast *ratios* between two configurations have been off: for every pair of checked
    forecasts of one sweep, the difference of their log errors (ln of forecast ratio over measured
    ratio). One model forecasts both sides of a recommendation, so their errors share its biases;
    the ratio's error is what decides whether one configuration is apart from another."""
    by_sweep: dict[str, list[float]] = {}
    for e in entries:
        by_sweep.setdefault(str(e.get("sweep")), []).append(float(e["log_error"]))
    return [a - b for errors in by_sweep.values() for i, a in enumerate(errors) for b in errors[i + 1:]]


def said(entries: list[dict[str, Any]], key: str) -> str:
    """One sentence: how far forecasts on this cluster have been off, and on how many."""
    if not entries:
        return (f"No forecast on cluster {key} has been checked yet: intervals rest on this sweep's own points only "
                f"({RECORD_FILE} beside the sweep directories keeps them from now on).")
    off = [abs(math.expm1(e["log_error"])) for e in entries]
    spread = perfmodel.spread([e["log_error"] for e in entries])
    sweeps = len({e.get("sweep") for e in entries})
    wide = f"; {spread.coverage:.0%} of them within ×/÷{math.exp(spread.half_width):.2f}" if spread else ""
    return (f"Forecasts on cluster {key} have been off by {statistics.median(off):.1%} (median) over "
            f"{len(entries)} checked forecast(s) from {sweeps} sweep(s), the latest {str(entries[-1].get('at'))[:10]}"
            f"{wide} ({RECORD_FILE}).")


def _read(root: Path) -> dict[str, Any]:
    # None recorded yet, or a damaged file (set aside and named): intervals rest on the sweep's own points.
    return records.read_keyed(Path(root) / RECORD_FILE, _entry)


def _entry(entry: Any) -> str | None:
    """Why an entry of forecast-errors.json is not a checked forecast (None: it is one)."""
    return records.lacks(entry, {"predicted": records.NUMBER, "measured": records.NUMBER,
                                 "log_error": records.NUMBER})
