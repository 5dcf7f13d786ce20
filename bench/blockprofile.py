"""One block of a side under the profiler: whether its device or its host sets its pace.

A side slower than the tuned loop is either slower on the device (more or slower kernels: a
layout conversion, an unfused loss) or held back by its host (Python hooks, kernel launches): its
device then idles between kernels. One block per side, the same number of steps for every side,
after the timed rounds (bench/tuned.py):

- ``device_busy_ms``: per step, the union of the device's kernel and copy intervals;
- ``wall_ms``: per step, the block's wall time, from an idle device to the block's one sync;
- ``host_queue_ms``: per step, the host's time to queue the block (before that sync): close to
  ``wall_ms`` with the device idle part of the time means the host is the bottleneck;
- the kernels with the most device time and the host operations with the most host time.

The profiler slows the host, so these figures compare sides measured the same way; the blocks'
figures stay the ones the check reports as throughput. On CPU there is no device: only the wall,
the host's queue time (the same) and the host's operations.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

TOP = 8


def profile_block(block: Callable[[], Any], sync: Callable[[], None], steps: int, on_gpu: bool) -> dict[str, Any]:
    """``block`` (``steps`` steps) run once under the profiler; the figures above, per step."""
    from torch.profiler import ProfilerActivity, profile

    from jobs.comm import device_work, span_us, union_length

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    sync()  # sync point: the block starts on an idle device
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        block()
        queued_s = time.perf_counter() - t0
        sync()  # sync point: the block's one synchronisation
        wall_s = time.perf_counter() - t0
    busy: list[tuple[float, float]] = []
    kernels: dict[str, float] = defaultdict(float)
    for e in filter(device_work, prof.events()):
        span = span_us(e)  # microseconds
        busy.append(span)
        kernels[e.name] += span[1] - span[0]
    host = sorted(((a.key, a.self_cpu_time_total) for a in prof.key_averages()), key=lambda kv: -kv[1])
    out: dict[str, Any] = {"steps": steps, "wall_ms": 1e3 * wall_s / steps, "host_queue_ms": 1e3 * queued_s / steps,
                           "top_host_ms": [[name[:120], us / 1e3 / steps] for name, us in host[:TOP]]}
    if on_gpu:
        out["device_busy_ms"] = union_length(busy) / 1e3 / steps
        out["device_kernels"] = len(busy) / steps
        out["top_kernels_ms"] = [[name[:120], us / 1e3 / steps]
                                 for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:TOP]]
    return out

