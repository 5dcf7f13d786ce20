"""A cluster's own between-run noise, measured from repeated runs and kept for sweeps that run once.

Every sweep report that holds configurations measured in at least ``MIN_RUNS`` independent runs
(all done, none flagged for interference) records the pooled between-run coefficient of variation
of throughput, step time and peak memory for its cluster in ``noise-floor.json`` beside the sweep
directories (the output root). A later report whose configurations ran once uses the newest
floor of the same cluster as their noise (launcher/report/stats.py), and says so in every claim. The
dedicated measurement is ``python -m launcher -m +experiment=noise_floor`` (one configuration,
8 runs); any sweep with ``runs >= 3`` refreshes it too.

Pooling: ``cv = sqrt(sum((n_i - 1) cv_i^2) / sum(n_i - 1))`` over the configurations, with
``sum(n_i - 1)`` degrees of freedom (the pooled variance of one-way ANOVA, on relative values).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.report.rows import grouped
from launcher.report.stats import METRICS, Floor, run_values

FLOOR_FILE = "noise-floor.json"
MIN_RUNS = 3


def measure(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pooled between-run noise of the rows' configurations with MIN_RUNS or more runs."""
    sums: dict[str, float] = {}
    dfs: dict[str, int] = {}
    configurations = 0
    for unit in grouped(rows):
        if any(m.get("interference") for m in unit.get("_members", [unit])):
            continue
        counted = False
        for metric in METRICS:
            values = run_values(unit, metric)
            if len(values) < MIN_RUNS or not statistics.fmean(values):
                continue
            cv = statistics.stdev(values) / statistics.fmean(values)
            sums[metric] = sums.get(metric, 0.0) + (len(values) - 1) * cv**2
            dfs[metric] = dfs.get(metric, 0) + len(values) - 1
            counted = True
        configurations += counted
    if not dfs:
        return None
    return {"cv": {m: math.sqrt(sums[m] / dfs[m]) for m in dfs}, "df": min(dfs.values()),
            "configurations": configurations}


def record(root: Path, key: str, rows: list[dict[str, Any]], sweep: str) -> dict[str, Any] | None:
    """Measure the rows' floor and keep it under ``key`` in ``root/noise-floor.json`` (newest wins)."""
    found = measure(rows)
    if found is None:
        return None
    found.update(sweep=sweep, measured_at=datetime.now().isoformat(timespec="seconds"))
    floors = _read(root)
    floors[key] = found
    tmp = root / (FLOOR_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(floors, indent=1, sort_keys=True))
        os.replace(tmp, root / FLOOR_FILE)  # atomic: a concurrent reader sees the old or the new file
    except OSError:
        return None  # a read-only output root keeps its old floor; the report itself does not depend on it
    return found


def load(root: Path, key: str) -> Floor | None:
    """The newest floor kept for ``key`` under ``root``, or None."""
    found = _read(root).get(key)
    if not isinstance(found, dict):
        return None
    try:
        return Floor(cv={str(k): float(v) for k, v in found["cv"].items()}, df=int(found["df"]),
                     where=f"{key}, {found['df']} df, {str(found.get('measured_at', '?'))[:10]}")
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def _read(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(root) / FLOOR_FILE).read_text())
    except (OSError, ValueError):
        return {}  # no floor yet, or a damaged file: treated as none (the report says "no noise floor")
    return data if isinstance(data, dict) else {}
