"""Report rows: the plain dicts that the table, the plots and the findings read, and the figures
derived from them (relative performance, scaling efficiency, ranking, labels)."""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

from jobs.metrics import scaling_efficiency

GIB = 1024**3
MIB = 1024**2


def num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def add_derived(rows: List[Dict[str, Any]]) -> None:
    """Relative performance vs the best cell of the same model, and scaling efficiency: per-device
    throughput relative to the smallest cell of the same series (same settings except the node
    count), preferring a base cell measured in the same sweep (absolute numbers from different
    runs are less comparable than ratios within one)."""
    measured = [r for r in rows if r.get("throughput_samples_per_s")]
    for r in measured:
        same_model = [p["throughput_samples_per_s"] for p in measured if p.get("model") == r.get("model")]
        r["relative_perf"] = r["throughput_samples_per_s"] / max(same_model)
        peers = [p for p in measured if p.get("series") == r.get("series")]
        if len({p["world_size"] for p in peers}) > 1:
            base = min(peers, key=lambda p: (p["world_size"], p.get("sweep") != r.get("sweep")))
            r["scaling_efficiency"] = scaling_efficiency(r["throughput_samples_per_s_per_device"],
                                                         base["throughput_samples_per_s_per_device"])


def peak_memory_gib(row: Dict[str, Any]) -> Optional[float]:
    """Peak resident set on CPU, peak allocated CUDA memory on GPUs (max over ranks)."""
    return row.get("peak_mem_allocated_gib", row.get("peak_rss_gib"))


def series_labels(rows: Sequence[Dict[str, Any]]) -> Dict[str, str]:
    """A short legend label per series: the cell name without its node count (plus the sweep
    where two different series would otherwise read the same)."""
    first: Dict[str, Dict[str, Any]] = {}
    for r in rows:
        first.setdefault(r["series"], r)
    labels = {}
    for key, r in first.items():
        words = [w for w in str(r["cell"]).split() if not w.startswith("nodes=")]
        labels[key] = " ".join(words) or f"{r.get('strategy')} {r.get('precision')}"
    counts: Dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {k: (f"{v} ({first[k].get('sweep')})" if counts[v] > 1 else v) for k, v in labels.items()}


def cell_label(row: Dict[str, Any], multi_sweep: bool) -> str:
    return f"{row['cell']} ({row.get('sweep')})" if multi_sweep else str(row["cell"])


def ranked(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Best total throughput first; cells without results last. Sets each row's rank ``_rank``."""
    ordered = sorted(rows, key=lambda r: -(num(r.get("throughput_samples_per_s")) or -1))
    n = 0
    for r in ordered:
        if num(r.get("throughput_samples_per_s")) is not None:
            n += 1
            r["_rank"] = n
        else:
            r["_rank"] = None
    return ordered
