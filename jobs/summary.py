"""One owner of a run's measurements: the reduction across ranks, the summary schema and the
per-step records.

Every name carries its unit. Reductions across ranks: throughput is summed (each rank's own
samples over its own time), step time is the slowest rank's per step (a synchronous step ends
when the last rank ends), memory is the maximum over ranks (the rank that runs out first).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from jobs.stats import coefficient_of_variation, percentile


def gather_ranks(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (one collective, after measuring)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def summarize(per_rank: list[dict[str, Any]], *, samples_per_step: int, tokens_per_sample: int, repeats: int) -> dict[str, float]:
    """Reduce per-rank measurements of the measured window into the job's summary metrics.

    Each rank entry holds ``step_time_s`` and ``data_time_s`` (lists over measured steps),
    memory figures and model-state bytes.
    """
    world = len(per_rank)
    n_steps = len(per_rank[0]["step_time_s"])
    # The job's step time is the slowest rank's, step by step.
    slowest = [max(r["step_time_s"][i] for r in per_rank) for i in range(n_steps)]
    window = max(1, n_steps // repeats)
    windows = [range(i * window, (i + 1) * window) for i in range(repeats)]
    # Global throughput per window: sum over ranks of the rank's samples over its own time.
    per_window = [
        sum(samples_per_step * len(w) / sum(r["step_time_s"][i] for i in w) for r in per_rank) for w in windows
    ]
    throughput = statistics.fmean(per_window)
    out: dict[str, float] = {
        "world_size": world,
        "measured_steps": n_steps,
        "throughput_samples_per_s": throughput,
        "throughput_samples_per_s_per_device": throughput / world,
        "throughput_cv": coefficient_of_variation(per_window),
        "step_time_ms_p50": 1e3 * percentile(slowest, 50),
        "step_time_ms_p90": 1e3 * percentile(slowest, 90),
        "step_time_ms_max": 1e3 * max(slowest),
        "data_time_share": max(sum(r["data_time_s"]) / sum(r["step_time_s"]) for r in per_rank),
    }
    if tokens_per_sample > 1:
        out["throughput_tokens_per_s"] = throughput * tokens_per_sample
        out["throughput_tokens_per_s_per_device"] = throughput * tokens_per_sample / world
    for key in per_rank[0]:
        # Memory and communication: the worst rank is the one that limits the job.
        if key.endswith(("_gib", "_bytes")) or key.startswith(("comm_", "memcpy_", "fp16_")):
            out[key] = max(r[key] for r in per_rank)
    return out


# ---- per-step records ------------------------------------------------------------------------

def step_records(histories: list[dict[str, Any]], lo: int, hi: int) -> list[dict[str, float]]:
    """Per-step records for steps lo..hi-1 from every rank's portable history: the mean loss over
    ranks and the slowest rank's step time (a synchronous step ends when the last rank ends)."""
    out = []
    for step in range(lo, hi):
        idx = [h["steps"].index(step) for h in histories]
        pairs = list(zip(histories, idx, strict=True))
        out.append({"step": step, "loss": sum(h["losses"][i] for h, i in pairs) / len(pairs),
                    "step_time_ms": 1e3 * max(h["step_time_s"][i] for h, i in pairs)})
    return out


def mean_losses(histories: list[dict[str, Any]], total_steps: int) -> list[float]:
    """Loss per step averaged over ranks; rank 0's own when not every rank ran every step (a
    resume on a different layout: the old ranks' steps live only in rank 0's restored history)."""
    if all(h["steps"] == list(range(total_steps)) for h in histories):
        return [sum(h["losses"][i] for h in histories) / len(histories) for i in range(total_steps)]
    return histories[0]["losses"]


def skipped_steps(history: dict[str, Any]) -> dict[str, int]:
    """fp16 steps the GradScaler skipped (inf/NaN gradients), inside and before the measured window."""
    flags = history.get("skipped") or []
    pairs = list(zip(flags, history["measured"], strict=False))  # no flags without a scaler
    return {"fp16_skipped_steps": sum(1 for s, m in pairs if s and m),
            "fp16_skipped_steps_warmup": sum(1 for s, m in pairs if s and not m)}


def foreign_cpu_share(windows: list[dict[str, Any] | None]) -> float | None:
    """The largest share, over hosts, of the host's job cores' time that other processes used
    during the measured window (jobs/interference.py samples it; None without a full sample).

    Per host: the cores are the union of its ranks' affinity sets; the busy time is read from the
    first rank's sample (one consistent reading of every core); our time is the sum of the host's
    ranks' own CPU time. ``max(0, busy - ours) / (window_s * cores)``.
    """
    by_host: dict[str, list[dict[str, Any]]] = {}
    for w in windows:
        if w is None:
            return None  # a rank without a window: the comparison would miss its time
        by_host.setdefault(w["host"], []).append(w)
    shares = []
    for ranks in by_host.values():
        cores = sorted(set().union(*(set(r["cpus"]) for r in ranks)))
        ref = ranks[0]
        busy_s = sum(ref["busy_ticks_delta"].get(c, 0) for c in cores) / ref["ticks_per_s"]
        ours_s = sum(r["own_cpu_delta_s"] for r in ranks)
        capacity_s = ref["window_s"] * len(cores)
        if capacity_s <= 0:
            continue
        shares.append(max(0.0, busy_s - ours_s) / capacity_s)
    return max(shares) if shares else None


STRAGGLER_LIMIT = 1.10  # a rank this much slower than the median rank is named a straggler


def stragglers(rank_medians_s: Sequence[float], hosts: Sequence[str]) -> tuple[dict[str, float], dict[str, str]]:
    """(summary, tags) from each rank's median step time: ``step_time_rank_spread`` = slowest
    rank's median over the median of the ranks' medians; tag ``slowest_rank`` ("<rank> on
    <host>"), and ``straggler_rank`` when the slowest is more than 10% above the median."""
    if not rank_medians_s:
        return {}, {}
    middle = statistics.median(rank_medians_s)
    slowest = max(range(len(rank_medians_s)), key=lambda r: rank_medians_s[r])
    spread = rank_medians_s[slowest] / middle if middle > 0 else math.nan
    tags = {"slowest_rank": f"{slowest} on {hosts[slowest]}"}
    if spread > STRAGGLER_LIMIT:
        tags["straggler_rank"] = tags["slowest_rank"]
    return {"step_time_rank_spread": spread}, tags
