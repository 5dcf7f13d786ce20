"""Collect a sweep's results and render the comparison table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.state import SweepState


def collect(state: SweepState) -> List[Dict[str, Any]]:
    """One row per cell: its state plus the summary its head rank wrote (result.json)."""
    rows = []
    for cell in state.cells:
        result_path = state.cell_dir(cell) / "result.json"
        summary = json.loads(result_path.read_text())["summary"] if result_path.exists() else {}
        # Cells that differ only in their node count form one scaling series.
        series = " ".join(o for o in cell.overrides if o.split("=", 1)[0].lstrip("+~") != "nodes")
        rows.append({"cell": cell.name, "strategy": cell.strategy, "precision": cell.precision, "model": cell.model,
                     "nodes": cell.nodes, "world_size": cell.world_size, "status": cell.status, "series": series,
                     **summary})
    add_derived(rows)
    return rows


def add_derived(rows: List[Dict[str, Any]]) -> None:
    """Relative performance vs the best cell, and scaling efficiency: per-device throughput relative
    to the smallest cell of the same series (same settings except the node count)."""
    measured = [r for r in rows if r.get("throughput_samples_per_s")]
    if not measured:
        return
    best = max(r["throughput_samples_per_s"] for r in measured)
    for r in measured:
        r["relative_perf"] = r["throughput_samples_per_s"] / best
        peers = [p for p in measured if p.get("series") == r.get("series")]
        base = min(peers, key=lambda p: p["world_size"])
        if len({p["world_size"] for p in peers}) > 1:
            from jobs.metrics import scaling_efficiency

            r["scaling_efficiency"] = scaling_efficiency(r["throughput_samples_per_s_per_device"],
                                                         base["throughput_samples_per_s_per_device"])


def _fmt(value: Optional[float], spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


COLUMNS = [
    ("cell", "cell", "s"),
    ("ranks", "world_size", "d"),
    ("samples/s", "throughput_samples_per_s", ".1f"),
    ("samples/s/dev", "throughput_samples_per_s_per_device", ".1f"),
    ("step p50 ms", "step_time_ms_p50", ".1f"),
    ("peak mem GiB", None, ".2f"),
    ("state GiB", None, ".3f"),
    ("rel perf", "relative_perf", ".0%"),
    ("scaling eff", "scaling_efficiency", ".0%"),
    ("status", "status", "s"),
]


def _value(row: Dict[str, Any], title: str, key: Optional[str]):
    if title == "peak mem GiB":
        return row.get("peak_rss_gib", row.get("peak_mem_allocated_gib"))
    if title == "state GiB":
        b = row.get("model_state_bytes")
        return None if b is None else b / 1024**3
    return row.get(key)


def table(rows: List[Dict[str, Any]]) -> str:
    """Markdown table, best throughput first; cells without results last."""
    ordered = sorted(rows, key=lambda r: -(r.get("throughput_samples_per_s") or -1))
    header = "| " + " | ".join(t for t, _, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if f == "s" else "---:" for _, _, f in COLUMNS) + "|"
    lines = [header, sep]
    for r in ordered:
        cells = []
        for title, key, spec in COLUMNS:
            v = _value(r, title, key)
            cells.append(str(v) if spec in ("s",) else _fmt(v, spec))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m launcher.report <sweep_dir>")
        return 0 if args else 2
    state = SweepState.load(Path(args[0]))
    print(table(collect(state)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
