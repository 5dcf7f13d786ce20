"""Stragglers: each rank's median step time (and its own work's, without gradient communication),
the spread across ranks, and the rank named where it lags (jobs/summary.py reports them)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from contract.metrics import STEP_TIME_RANK_SPREAD
from contract.stats import percentile

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
    return {STEP_TIME_RANK_SPREAD: spread}, tags


def shares_host_cores(device_type: str, hosts: Sequence[str]) -> bool:
    """Whether some ranks compete for one host's cores (CPU ranks, more than one on a host)."""
    return device_type == "cpu" and len(set(hosts)) < len(hosts)


def straggler_figures(per_rank: list[dict[str, Any]], summary: dict[str, Any],
                      tags: dict[str, str], device_type: str = "cpu") -> tuple[list[float], list[float]]:
    """Each rank's median step time, and its own work's (empty where not measured); the spread into
    ``summary`` and the slowest / straggling rank into ``tags``."""
    rank_medians_s = [percentile(r["step_time_s"], 50) for r in per_rank]
    # Synchronous steps take every rank as long as the slowest, so stragglers are named from each
    # rank's own work (jobs.loop.local_step_times) where it was measured, else from step times.
    by_local = all(r["local_step_time_s"] for r in per_rank)
    local_medians_s = [percentile(r["local_step_time_s"], 50) for r in per_rank] if by_local else []
    hosts = [r["hostname"] for r in per_rank]
    spread, straggler_tags = stragglers(local_medians_s if by_local else rank_medians_s, hosts)
    if "straggler_rank" in straggler_tags and shares_host_cores(device_type, hosts):
        # CPU ranks on one host share its cores: one rank's lag is the scheduler's, not its host's.
        straggler_tags.pop("straggler_rank")
        straggler_tags["straggler_withheld"] = (f"{len(hosts)} CPU ranks share the cores of "
                                                f"{len(set(hosts))} host(s): a lag between them is not a host's")
    summary.update(spread)
    tags.update(straggler_tags, straggler_measure="local_step_time" if by_local else "step_time")
    return rank_medians_s, local_medians_s
