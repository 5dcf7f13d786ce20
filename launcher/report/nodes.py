"""The spread between nodes against the spread within a node, and nodes slow wherever they ran.

Pure functions over report rows (each run's ``hostnames``: its ranks' nodes). A run's placement is
the node, or set of nodes, it ran on. Per configuration, each run's throughput is taken relative to
the configuration's mean (logarithms, so that a factor counts alike everywhere); pooled over the
configurations as in a one-way analysis of variance:

* **between placements**: the spread of the placements' means around their configuration's mean
  (``sqrt(SS_between / df_between)``, df = placements - 1 per configuration);
* **within a placement**: the spread of runs on the same placement around its mean
  (``sqrt(SS_within / df_within)``); it needs two runs of a configuration on one placement.

A node is named slow when every configuration it ran (at least two, each also run elsewhere) was
slower on it, by at least the minimum effect, than on the other nodes: a host's problem
(thermals, a noisy neighbour, a slow link) rather than one run's bad luck.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from launcher.report.rows import grouped, md_cell, throughput
from launcher.report.stats import MIN_EFFECT


def _runs(unit: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(placement, throughput, cell) of each run of a configuration with a result and a host."""
    return [(str(m["hostnames"]), t, str(m.get("cell"))) for m in unit.get("_members", [unit])
            if (t := throughput(m)) and m.get("hostnames")]


def spread(rows: list[dict[str, Any]]) -> tuple[float | None, int, float | None, int]:
    """(between-placement CV, its df, within-placement CV, its df), pooled over configurations."""
    ss_b = ss_w = 0.0
    df_b = df_w = 0
    for unit in grouped(rows):
        runs = _runs(unit)
        if len(runs) < 2:
            continue
        centre = statistics.fmean(math.log(t) for _, t, _ in runs)
        by_place: dict[str, list[float]] = {}
        for place, t, _ in runs:
            by_place.setdefault(place, []).append(math.log(t) - centre)
        for values in by_place.values():
            mean = statistics.fmean(values)
            ss_b += len(values) * mean**2
            ss_w += sum((v - mean) ** 2 for v in values)
            df_w += len(values) - 1
        df_b += len(by_place) - 1
    between = math.sqrt(ss_b / df_b) if df_b else None
    within = math.sqrt(ss_w / df_w) if df_w else None
    return between, df_b, within, df_w


def slow_nodes(rows: list[dict[str, Any]], effect: float = MIN_EFFECT["throughput"]) -> dict[str, list[str]]:
    """{node: ["<cell> (0.62x the runs elsewhere)", ...]} for nodes slower in every configuration they ran."""
    touched: dict[str, list[tuple[bool, list[str]]]] = {}
    for unit in grouped(rows):
        runs = _runs(unit)
        for node in {n for place, _, _ in runs for n in place.split(",")}:
            here = [(t, cell) for place, t, cell in runs if node in place.split(",")]
            elsewhere = [t for place, t, _ in runs if node not in place.split(",")]
            if not elsewhere:
                continue
            ratio = statistics.fmean(t for t, _ in here) / statistics.fmean(elsewhere)
            touched.setdefault(node, []).append(
                (ratio < 1 - effect, [f"{cell} ({ratio:.2f}× the runs elsewhere)" for _, cell in here]))
    return {node: [c for _, cells in seen for c in cells] for node, seen in sorted(touched.items())
            if len(seen) >= 2 and all(slow for slow, _ in seen)}


def section(rows: list[dict[str, Any]]) -> list[str]:
    """The findings' lines on nodes; [] when every run ran on one host (nothing to separate)."""
    hosts = {n for r in rows if r.get("hostnames") for n in str(r["hostnames"]).split(",")}
    if len(hosts) < 2:
        return []
    between, df_b, within, df_w = spread(rows)
    lines = [f"Runs ran on {len(hosts)} nodes. Spread of throughput between placements (the node or nodes a run "
             f"ran on): " + (f"{between:.1%} ({df_b} df)" if between is not None else "not measured (each "
                             "configuration ran on one placement)")
             + "; within a placement: " + (f"{within:.1%} ({df_w} df)." if within is not None else
                                             "not measured (no configuration ran twice on one placement).")]
    for node, cells in slow_nodes(rows).items():
        lines.append(f"- **{md_cell(node)}** was slower in every configuration it ran: {md_cell('; '.join(cells))}. "
                     "Look at that node (thermals, a noisy neighbour, a slow link), or exclude it "
                     "(cluster.exclude).")
    return lines
