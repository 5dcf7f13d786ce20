"""Energy of the measured window and the system metrics of the job's own GPUs (NVML samples
taken by jobs/interference.py), logged by rank 0 as MLflow "system/" metrics."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from contract.metrics import ENERGY_J

# nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver was loaded, an unsigned 64-bit
# counter (Volta and later; older GPUs raise NVMLError_NotSupported).
ENERGY_COUNTER_MODULUS_MJ = 2**64


def energy_from_counter_j(start_mj: int | None, end_mj: int | None) -> float | None:
    """Joules between two readings of NVML's total-energy counter; None when either is missing.

    A reading below the first is the counter wrapping at 2**64 mJ, not a reset: the driver cannot
    be reloaded while this process holds a CUDA context on the device, which it does throughout.
    """
    if start_mj is None or end_mj is None:
        return None
    delta_mj = end_mj - start_mj
    if delta_mj < 0:
        delta_mj += ENERGY_COUNTER_MODULUS_MJ
    return delta_mj / 1e3


def energy_from_power_j(times_s: Sequence[float], power_w: Sequence[float]) -> float | None:
    """Joules from power samples by the trapezoid rule over their times (seconds, increasing).
    None with fewer than two samples: one reading says nothing about how long it held."""
    if len(times_s) != len(power_w):
        raise ValueError(f"{len(times_s)} sample times but {len(power_w)} power readings")
    if len(times_s) < 2:
        return None
    return sum(0.5 * (power_w[i] + power_w[i - 1]) * (times_s[i] - times_s[i - 1]) for i in range(1, len(times_s)))


def energy_figures(per_device: list[dict[str, Any] | None], samples_in_window: float
                   ) -> tuple[dict[str, float], dict[str, str]]:
    """(summary, tags) from each rank's device energy over the measured window.

    ``per_device``: one entry per rank (each rank has its own GPU: jobs.dist.check_unique_gpus),
    ``{"energy_j", "window_s", "method"}`` or ``{"missing": why}``; ``samples_in_window``: samples
    every rank together trained in the window.

    - ``energy_j``: joules of all the job's devices over the window (their sum);
    - ``energy_j_per_sample``: that sum over the samples (the energy the job spent per sample);
    - ``power_w_mean``: the mean over devices of each device's mean power (its joules over its
      window), i.e. what one device drew on average.

    A device without a figure gives no summary at all (a sum over the others would understate the
    job's energy); the tag ``energy_missing`` says which rank and why. Tag ``energy_method`` says
    how the joules were obtained (counter, power samples, or both across devices).
    """
    missing = [f"rank {r}: {d.get('missing') if d else 'no NVML sample'}"
               for r, d in enumerate(per_device) if not d or d.get(ENERGY_J) is None]
    if missing or not per_device:
        return {}, {"energy_missing": "; ".join(missing)[:500] or "no devices"}
    if samples_in_window <= 0:
        return {}, {"energy_missing": "no samples in the measured window"}
    devices = [d for d in per_device if d]
    total_j = sum(d[ENERGY_J] for d in devices)
    powers = [d[ENERGY_J] / d["window_s"] for d in devices if d["window_s"] > 0]
    summary = {ENERGY_J: total_j, "energy_j_per_sample": total_j / samples_in_window}
    if len(powers) == len(devices):
        summary["power_w_mean"] = statistics.fmean(powers)
    return summary, {"energy_method": ",".join(sorted({d["method"] for d in devices}))}


SYSTEM_MAX_POINTS = 300  # per device and series: enough for a plot, small in the gather and the store


def thin(items: Sequence[Any], max_points: int = SYSTEM_MAX_POINTS) -> list[Any]:
    """At most ``max_points`` items, evenly spaced, the first and last always kept."""
    if len(items) <= max_points:
        return list(items)
    if max_points < 2:
        return [items[-1]] if max_points == 1 else []
    step = (len(items) - 1) / (max_points - 1)
    return [items[round(i * step)] for i in range(max_points)]


def system_metric_prefix(node_id: int, device_index: int) -> str:
    """``system/node<N>/gpu<I>_``: MLflow's system-metrics view shows keys under ``system/``; the
    node's id and the device's index on that node name each of the job's GPUs once."""
    return f"system/node{node_id}/gpu{device_index}_"


# (series in a sample, metric name suffix with its unit)
SYSTEM_SERIES = (("util_percent", "utilization_percent"), ("mem_used_gib", "memory_used_gib"),
                 ("power_w", "power_w"))


def system_records(per_rank: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One record per device and sample, step-indexed from the window's first sample:
    ``{"step": i, "time": unix_s, "system/node<N>/gpu<I>_utilization_percent": ..., ...}``.

    ``per_rank``: each rank's ``{"node_id", "device_index", "samples": [{"unix_s", "util_percent",
    "mem_used_gib", "power_w"}, ...]}`` (a series NVML could not read is absent from its samples),
    or None for a rank without a GPU sampler."""
    out = []
    for entry in per_rank:
        if not entry:
            continue
        prefix = system_metric_prefix(entry["node_id"], entry["device_index"])
        for i, sample in enumerate(entry["samples"]):
            rec: dict[str, Any] = {"step": i, "time": sample["unix_s"]}
            for field, name in SYSTEM_SERIES:
                if sample.get(field) is not None:
                    rec[prefix + name] = sample[field]
            if len(rec) > 2:
                out.append(rec)
    return out
