"""Communication time, from the profiler's collective events.

Method: after the measured window, ``comm_probe_steps`` more training steps run under
``torch.profiler`` (jobs/anatomy.py runs that probe and cuts its steps into parts; they are not part
of any throughput or step-time figure). This module classifies the trace's events and owns the
interval arithmetic both use. From the trace:

- collective intervals: the execution of each collective (``gloo:*`` events on gloo's worker
  threads on CPU; NCCL kernels on the GPU timeline);
- compute intervals: the training thread's ``aten::`` operators on CPU; on the GPU timeline the
  kernels that are neither NCCL kernels nor copies. GPU events that mirror ``record_function``
  ranges (``is_user_annotation``: FSDP2's ``FSDP::all_gather`` spans its NCCL kernels) are
  neither compute nor communication; only kernels named ``ncclDevKernel*``/``ncclKernel*`` are
  communication; memcpy/memset are reported on their own (``memcpy_time_ms``);
- ``comm_time_ms`` = length of the union of collective intervals, per step: time during which
  some collective was in flight;
- ``comm_exposed_ms`` = length of (collectives minus compute), per step: communication that no
  computation hid (DDP overlaps its bucketed all-reduce with backward; FSDP prefetches
  all-gathers);
- ``comm_share`` = exposed / the probe's step time: the share of a step that faster
  communication would save.

Limits: the profiler adds overhead to the probe steps (so shares, not absolute times, are the
figure to compare); on CPU, gloo's threads compete with compute for the same cores, so "hidden"
communication still slows compute down there; CPU ops that block inside an operator (a copy
waiting for data) count as compute. Reported per rank and reduced as the maximum.
"""

from __future__ import annotations

from contract.metrics import COMM_EXPOSED_MS, COMM_PROBE_STEP_TIME_MS, COMM_TIME_MS

Interval = tuple[float, float]

_COMM_MARKERS = ("nccl", "gloo:")
_NCCL_KERNELS = ("ncclDevKernel", "ncclKernel")


def _is_comm(name: str) -> bool:
    low = name.lower()
    return any(m in low for m in _COMM_MARKERS)


def gpu_event_kind(name: str) -> str:
    """"comm" (an NCCL kernel), "memcpy" (copies and fills) or "compute", for a GPU kernel."""
    if name.startswith(_NCCL_KERNELS):
        return "comm"
    low = name.lower()
    if low.startswith(("memcpy", "memset")) or "memcpy" in low:
        return "memcpy"
    return "compute"


def union_length(intervals: list[Interval]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def merged(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def minus_length(a: list[Interval], b: list[Interval]) -> float:
    """Length of union(a) minus union(b)."""
    a, b = merged(a), merged(b)
    total, j = 0.0, 0
    for lo, hi in a:
        covered = 0.0
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            covered += min(hi, b[k][1]) - max(lo, b[k][0])
            k += 1
        total += (hi - lo) - covered
    return total


def device_work(e) -> bool:
    """Whether a profiler event is the GPU's own work (a kernel, a copy or a fill). A record_function
    range's GPU mirror is not (FSDP::all_gather spans its NCCL kernels): it is no work of its own."""
    if getattr(e, "is_user_annotation", False):
        return False
    return getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")


def span_us(e) -> Interval:
    return (float(e.time_range.start), float(e.time_range.end))


def classify_events(events, main_thread: int, on_gpu: bool) -> dict[str, list[Interval]]:
    """{"comm", "compute", "memcpy"} intervals in microseconds from profiler events. On CPU, user
    annotations count: there gloo's collectives themselves are such ranges ("gloo:all_reduce" on
    gloo's worker thread is a user annotation in torch 2.13)."""
    out: dict[str, list[Interval]] = {"comm": [], "compute": [], "memcpy": []}
    for e in events:
        if on_gpu:
            if device_work(e):
                out[gpu_event_kind(e.name)].append(span_us(e))
            continue
        span = span_us(e)
        if _is_comm(e.name):
            out["comm"].append(span)
        elif e.thread == main_thread and e.name.startswith("aten::") and "wait" not in e.name:
            out["compute"].append(span)
    return out


def figures(kinds: dict[str, list[Interval]], wall_s: float, n_steps: int) -> dict[str, float]:
    """Per-step figures (ms) from classified intervals (us) of ``n_steps`` steps that took ``wall_s``."""
    comm, compute = kinds["comm"], kinds["compute"]
    comm_us = union_length(comm)
    exposed_us = minus_length(comm, compute)
    step_ms = 1e3 * wall_s / n_steps
    return {
        "memcpy_time_ms": union_length(kinds.get("memcpy", [])) / 1e3 / n_steps,
        COMM_TIME_MS: comm_us / 1e3 / n_steps,
        COMM_EXPOSED_MS: exposed_us / 1e3 / n_steps,
        COMM_PROBE_STEP_TIME_MS: step_ms,
        "comm_share": (exposed_us / 1e3 / n_steps) / step_ms if step_ms else 0.0,
    }


def main_thread_id(events, native_id: int) -> int:
    """The profiler's id of the training thread (it names threads by their native id)."""
    threads = {e.thread for e in events}
    if native_id in threads:
        return native_id
    # Fall back to the thread with the most aten:: operators (the one that trains).
    counts: dict[int, int] = {}
    for e in events:
        if e.name.startswith("aten::"):
            counts[e.thread] = counts.get(e.thread, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else -1
