"""Report rows: the plain dicts that the table, the plots, the findings and the comparison read,
and the figures derived from them (relative performance, scaling efficiency, ranking, labels,
grouping of repeated runs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from contract import metrics
from contract.metrics import (
    RELATIVE_PERF,
    SCALING_EFFICIENCY,
    THROUGHPUT_SAMPLES_PER_S,
    THROUGHPUT_SAMPLES_PER_S_PER_DEVICE,
)
from contract.stats import scaling_efficiency
from launcher.cluster.failures import NOT_THE_CONFIGURATIONS

GIB = 1024**3
MIB = 1024**2

# Settings that say where and how a sweep was run, not what was measured: two runs that differ
# only in these (and in the node count) belong to one scaling series.
WHERE_KEYS = ("output_root", "sweep_dir", "wait", "collective_timeout_s", "cluster.timeout_min",
              "cluster.signal_delay_s", "cluster.array_parallelism", "runs", "runs_min", "runs_max", "runs_budget_min",
              "baseline", "tracking")
# The tracking params of the choices that rows carry as "strategy", "precision" and "model".
_CHOICE_PARAMS = ("strategy.name", "strategy.label", "precision.name", "model.name")


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def throughput(row: dict[str, Any]) -> float | None:
    """Total samples/s of a cell that has a result (a failed, cancelled or diverged cell has none).
    A loss that is not finite makes it no result even where an older version recorded one."""
    if any(k in row and num(row[k]) is None for k in ("loss_first", "loss_last")):
        return None
    if row.get("status") in ("cancelled", "failed", "lost"):
        return None  # a cancelled cell keeps its numbers on record, but they are not a result
    v = num(row.get(THROUGHPUT_SAMPLES_PER_S))
    return v if v else None


NO_RESULT_YET = "no result yet"


def no_result_yet(row: dict[str, Any]) -> bool:
    """Whether a configuration has no result but could still get one: none of its runs has a
    result, and some run was never run, is still queued or running, was cancelled or lost, or
    failed for a reason of the place (preempted, a node lost, a port taken). A configuration
    whose runs all failed on their own (out of memory, diverged, a bad setting) has its answer."""
    members = row.get("_members", [row])
    if any(throughput(m) for m in members):
        return False
    return any(m.get("status") not in ("done", "failed") or m.get("failure_class") in NOT_THE_CONFIGURATIONS
               for m in members)


def settings(row: dict[str, Any]) -> dict[str, str]:
    """What a cell measured, as {key: value}: its overrides (sweep directory) or its params (MLflow),
    without the where-settings, and with the row's strategy, precision and model."""
    raw = row.get("settings")
    if isinstance(raw, dict):
        out = {str(k).lstrip("+~"): str(v) for k, v in raw.items()}
    else:  # hand-made rows: the cell name holds the swept settings
        out = dict(w.split("=", 1) for w in str(row.get("cell", "")).split() if "=" in w)
    for param in _CHOICE_PARAMS:
        out.pop(param, None)
    # "run": which independent launch of a configuration (hand-made rows carry it in the cell name).
    out = {k: v for k, v in out.items()
           if k not in WHERE_KEYS and k != "run" and not k.startswith(("tracking.", "hydra.", "limits."))}
    for key in ("strategy", "precision", "model"):
        if row.get(key) is not None:
            out[key] = str(row[key])
    out.setdefault("nodes", str(row.get("nodes")))
    return out


def unit_key(row: dict[str, Any]) -> str:
    """Cells that differ only in their seed are one configuration measured several times."""
    s = {k: v for k, v in settings(row).items() if k != "seed"}
    return repr((row.get("model"), row.get("world_size"), sorted(s.items())))


def add_derived(rows: list[dict[str, Any]]) -> None:
    """Relative performance vs the best cell of the same model and world size (a cell on more
    devices is not "better" for having more of them), and scaling efficiency: per-device
    throughput relative to the smallest cell of the same series (same settings except the node
    count), preferring a base cell measured in the same sweep (absolute numbers from different
    runs are less comparable than ratios within one)."""
    measured = [r for r in rows if throughput(r)]
    for r in measured:
        peers_ws = [p[THROUGHPUT_SAMPLES_PER_S] for p in measured
                    if p.get("model") == r.get("model") and p.get("world_size") == r.get("world_size")]
        r[RELATIVE_PERF] = r[THROUGHPUT_SAMPLES_PER_S] / max(peers_ws)
        peers = [p for p in measured if p.get("series") == r.get("series")]
        if len({p["world_size"] for p in peers}) > 1:
            base = min(peers, key=lambda p: (p["world_size"], p.get("sweep") != r.get("sweep")))
            r[SCALING_EFFICIENCY] = scaling_efficiency(r[THROUGHPUT_SAMPLES_PER_S_PER_DEVICE],
                                                         base[THROUGHPUT_SAMPLES_PER_S_PER_DEVICE])


def peak_memory_gib(row: dict[str, Any]) -> float | None:
    """Peak resident set on CPU, peak allocated CUDA memory on GPUs (max over ranks; the stand-in is
    the registry's)."""
    return metrics.get("peak_mem_allocated_gib").read(row)


def series_labels(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """A short legend label per series: the cell name without its node count (plus the sweep
    where two different series would otherwise read the same)."""
    first: dict[str, dict[str, Any]] = {}
    members: dict[str, list[str]] = {}
    for r in rows:
        first.setdefault(r["series"], r)
        members.setdefault(r["series"], []).append(str(r["cell"]))
    labels = {}
    for key, r in first.items():
        joined = joined_label(members[key], ("nodes=", "seed=", "run="))
        labels[key] = joined or f"{r.get('strategy')} {r.get('precision')}"
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {k: (f"{v} ({first[k].get('sweep')})" if counts[v] > 1 else v) for k, v in labels.items()}


def cell_label(row: dict[str, Any], multi_sweep: bool) -> str:
    return f"{row['cell']} ({row.get('sweep')})" if multi_sweep and row.get("sweep") else str(row["cell"])


def ranked(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cells grouped by model and world size (fewest ranks first), best total throughput first
    within each; cells without results last. Sets each row's rank ``_rank``: 1 is the best cell
    of its model and world size, the only cells it is compared with."""
    rows = list(rows)
    models: list[Any] = []
    for r in rows:
        if r.get("model") not in models:
            models.append(r.get("model"))
    measured = sorted((r for r in rows if throughput(r)),
                      key=lambda r: (models.index(r.get("model")), r.get("world_size") or 0, -(throughput(r) or 0.0)))
    rank: dict[tuple[Any, Any], int] = {}
    for r in measured:
        key = (r.get("model"), r.get("world_size"))
        rank[key] = rank.get(key, 0) + 1
        r["_rank"] = rank[key]
    rest = [r for r in rows if not throughput(r)]
    for r in rest:
        r["_rank"] = None
    return measured + rest


def grouped(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: its independent runs (and cells that differ only in their seed)
    become one row with the mean of every figure over the runs that have a result, ``runs`` (how
    many) and ``run_spread`` (the coefficient of variation of throughput between them). A failed,
    cancelled or diverged run counts in ``runs_planned`` only. A configuration measured once keeps
    its own row."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(unit_key(r), []).append(r)
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        done = [m for m in members if throughput(m)]
        base = dict((done or members)[0])
        base["cell"] = joined_label([str(m["cell"]) for m in members]) or base["cell"]
        seeds = {settings(m).get("seed") for m in members}
        base["cell"] += f" ({len(members)} seeds)" if len(seeds) == len(members) and None not in seeds \
            else f" ({len(members)} runs)"
        base["runs"], base["runs_planned"] = len(done), len(members)
        for key in {k for m in done for k, v in m.items() if num(v) is not None}:
            values = [v for m in done if (v := num(m.get(key))) is not None]
            if len(values) == len(done):
                # Equal values keep their type (world_size stays 2, not 2.0); others are averaged.
                base[key] = done[0][key] if len(set(values)) == 1 else statistics.fmean(values)
        tps = [t for m in done if (t := throughput(m)) is not None]
        if len(tps) >= 2 and statistics.fmean(tps):
            base["run_spread"] = statistics.stdev(tps) / statistics.fmean(tps)
        base["status"] = "done" if len(done) == len(members) else f"{len(done)}/{len(members)} done"
        base["_members"] = members
        out.append(base)
    if len(out) < len(rows):
        # Series without the seed, relative performance and scaling recomputed from the means.
        out = [{**r, "series": _series_without_seed(r)} for r in out]
        add_derived(out)
    return out


def joined_label(names: Sequence[str], skip: tuple[str, ...] = ("seed=", "run=")) -> str:
    """The cell names of a group in one label, every value it groups shown: ``strategy=ddp
    cluster.timeout_min=5,7`` (words starting with ``skip`` left out)."""
    values: dict[str, list[str]] = {}
    for name in names:
        for word in name.split(" (")[0].split():
            if word.startswith(skip):
                continue
            key, _, value = word.partition("=")
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return " ".join(f"{k}={','.join(v)}" if any(v) else k for k, v in values.items())


def _series_without_seed(row: dict[str, Any]) -> str:
    return repr((row.get("model"), sorted((k, v) for k, v in settings(row).items() if k not in ("seed", "nodes"))))


def md_cell(text: Any) -> str:
    """A value as one markdown table cell: its pipes escaped, its lines joined."""
    return str(text).replace("|", "\\|").replace("\n", " ")
