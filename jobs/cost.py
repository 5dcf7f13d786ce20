"""What a run costs in money: the price of a million samples (or tokens) at the measured throughput."""

from __future__ import annotations


def cost_per_1m(throughput_per_s: float, *, devices: int, nodes: int, cost_per_device_hour: float | None,
                cost_per_node_hour: float | None) -> float | None:
    """What a million samples (or tokens: pass the token throughput) cost: the job's price per
    hour (devices x cost_per_device_hour, else nodes x cost_per_node_hour) over its throughput
    per hour, times 1e6. None without a price or a throughput."""
    if cost_per_device_hour is not None:
        per_hour = devices * cost_per_device_hour
    elif cost_per_node_hour is not None:
        per_hour = nodes * cost_per_node_hour
    else:
        return None
    if not throughput_per_s or throughput_per_s <= 0:
        return None
    return per_hour / (throughput_per_s * 3600.0) * 1e6
