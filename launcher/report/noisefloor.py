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

**Sweep-to-sweep drift** (``sweep-drift.json``, per cluster): two sweeps of the same settings run
one after the other differ by more than their runs' spread shows (the machine's state moves between
them: other load, thermal state, page cache). ``python -m launcher.report --compare A B
--record-drift`` keeps, for every configuration of such an A/A pair and every metric, the squared
log ratio of the two sweeps' means ``d^2`` and the part of it their runs explain, ``w = (se_A /
mean_A)^2 + (se_B / mean_B)^2``. The drift is the method-of-moments estimate of the variance left
over, ``tau^2 = max(0, mean(d^2 - w))`` over the cluster's kept entries (the newest DRIFT_KEEP),
with as many degrees of freedom as entries; every later comparison of two sweeps adds ``tau`` (as
a coefficient of variation) to the noise of each difference it judges (launcher/report/stats.py).
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from contract import records
from launcher.cluster.backends import backend_for
from launcher.plan.clusterschema import settings_class
from launcher.report.rows import grouped
from launcher.report.stats import METRICS, Drift, Floor, estimate, run_values
from launcher.state import SweepState

FLOOR_FILE = "noise-floor.json"
DRIFT_FILE = "sweep-drift.json"
MIN_RUNS = 3
DRIFT_KEEP = 60  # entries per cluster and metric: the newest A/A pairs describe today's machine


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

    def kept(floors: dict[str, Any]) -> dict[str, Any]:
        floors[key] = found
        return floors

    # Under the file's lock, atomic, a damaged entry set aside (contract/records.py); a read-only
    # output root keeps its old floor: the report itself does not depend on it.
    return found if records.update_keyed(Path(root) / FLOOR_FILE, kept, _floor_entry) else None


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
    # No floor yet, or a damaged file (set aside and named): none (the report says "no noise floor").
    return records.read_keyed(Path(root) / FLOOR_FILE, _floor_entry)


def _floor_entry(entry: Any) -> str | None:
    """Why an entry of noise-floor.json is not a cluster's floor (None: it is one)."""
    return records.lacks(entry, {"cv": dict, "df": int})


def _drift_entry(entry: Any) -> str | None:
    """Why an entry of sweep-drift.json is not one metric of an A/A pair (None: it is one)."""
    return records.lacks(entry, {"metric": str, "d2": records.NUMBER, "within": records.NUMBER})


def drift_entries(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """For every A/A pair of configurations (A's row, B's row) and metric measured in MIN_RUNS or
    more runs on both sides, neither flagged for interference: the squared log ratio of the means
    and the part the runs explain."""
    out = []
    for a, b in pairs:
        if any(m.get("interference") for row in (a, b) for m in row.get("_members", [row])):
            continue  # flagged: another job's load, not the machine's drift between quiet sweeps
        for metric in METRICS:
            ea, eb = estimate(a, metric), estimate(b, metric)
            if ea is None or eb is None or ea.n < MIN_RUNS or eb.n < MIN_RUNS or ea.mean <= 0 or eb.mean <= 0 \
                    or ea.se is None or eb.se is None:
                continue
            out.append({"metric": metric, "d2": math.log(eb.mean / ea.mean) ** 2,
                        "within": (ea.se / ea.mean) ** 2 + (eb.se / eb.mean) ** 2})
    return out


def record_drift(root: Path, key: str, entries: list[dict[str, Any]], pair: str) -> Drift | None:
    """Keep an A/A pair's entries under the cluster ``key`` in ``root/sweep-drift.json``; the drift now."""
    now = datetime.now().isoformat(timespec="seconds")

    def added(records: dict[str, Any]) -> dict[str, Any]:
        kept = [e for e in records.get(key, []) if isinstance(e, dict) and e.get("pair") != pair]
        kept += [{**e, "pair": pair, "at": now} for e in entries]
        by_metric: dict[str, list[dict[str, Any]]] = {}
        for e in kept:
            by_metric.setdefault(str(e.get("metric")), []).append(e)
        records[key] = [e for es in by_metric.values() for e in es[-DRIFT_KEEP:]]
        return records

    records.update_keyed(Path(root) / DRIFT_FILE, added, _drift_entry)
    return load_drift(root, key)


def load_drift(root: Path, key: str) -> Drift | None:
    """The cluster's sweep-to-sweep drift from its kept A/A entries, or None (none recorded)."""
    # Each entry that is not a metric's d2 and within (NaN among them) is named and set aside by the
    # reader, never the metric's or the cluster's record.
    read = records.read_keyed(Path(root) / DRIFT_FILE, _drift_entry).get(key)
    if not isinstance(read, list):
        return None
    left: dict[str, list[float]] = {}
    for e in read:
        left.setdefault(e["metric"], []).append(float(e["d2"]) - float(e["within"]))
    if not left:
        return None
    pairs = len({e.get("pair") for e in read})
    last = max((str(e.get("at", "?")) for e in read), default="?")
    return Drift(cv={m: math.sqrt(max(0.0, statistics.fmean(v))) for m, v in left.items()},
                 df=min(len(v) for v in left.values()),
                 where=f"{key}, {pairs} A/A pair(s) of sweeps, latest {last[:10]}")


def floor_key(state: SweepState) -> str:
    """The key of the cluster whose noise floor a sweep reads and refreshes (its backend says which)."""
    first = state.cells[0].cluster if state.cells else settings_class(state.cluster)()
    return backend_for(state.cluster).noise_floor_key(first)
