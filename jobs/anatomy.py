"""A step's anatomy: where the probe's step time went, part by part, and the bytes each collective
kind moved.

The profiled probe after the measured window (:func:`probe`; its steps are in no throughput or
step-time figure) runs with the trainer's parts named (``step::data``, ``step::forward``,
``step::backward``, ``step::optimizer``: jobs/loop.py sets them only here) and the profiler
recording shapes. From its trace, per step and per rank, the step's wall time is cut into parts
that do not overlap, so that they add up to it exactly:

- ``data_wait``: inside ``step::data`` (waiting for the next batch);
- ``comm_<kind>_exposed``: a collective of that kind in flight while no computation runs
  (jobs/comm.py's intervals: gloo's ops on CPU, NCCL kernels on a GPU, and the spans a wrapped
  collective marks ``comm::<kind>``) and not waiting for data;
  where kinds overlap each other, the earlier kind in :data:`KINDS` takes the time;
- ``forward``, ``backward``, ``optimizer``: the rest of each named range: the computation and the
  host's own work in that phase, communication that nothing hid taken out;
- ``copies``: on a GPU, memcpy/memset time outside every part above (0 on CPU, where copies are
  operators of the phase that runs them);
- ``unattributed``: the remainder (the step loop, between the named ranges, the end-of-step sync).
  It is shown, never spread over the parts.

Beside the parts, not in the sum: ``comm_<kind>_overlapped`` (in flight while computation ran),
``comm_<kind>_bytes_per_step`` and the achieved bandwidths of nccl-tests
(``algbw = bytes / time of that kind in flight``, ``busbw = algbw x`` :data:`BUSBW_FACTOR`, GB/s =
1e9 bytes/s). Bytes follow nccl-tests' sizes: all-reduce and broadcast the buffer, all-gather the
gathered output, reduce-scatter the input before scattering; they are read from the c10d operators'
recorded shapes and dtypes (the ``_base`` forms carry both tensors), or from the backend's event
matched to its operator in issue order (gloo records the buffer of a list form; gloo runs a
reduce-scatter as an all-reduce of the whole input, which is why the operator, not gloo's event,
names the kind).

Reduced over ranks as the mean (contract/metrics.py): a mean of sums is the sum of means, so the
reduced parts still add up to the reduced step time. The probe's step time
(``anatomy_step_time_ms``) is shown beside the window's: the profiler's own cost is visible in it.
On a GPU the phases are the host's ranges and the collectives the device's kernels, so a phase
there is the host's view of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from contract.metrics import ANATOMY_COPIES_MS, ANATOMY_DATA_WAIT_MS, ANATOMY_STEP, ANATOMY_UNATTRIBUTED_MS, comm_bytes
from contract.metrics import COLLECTIVE_KINDS as KINDS
from jobs import comm
from jobs.comm import Interval, merged, minus_length, span_us, union_length

PHASES = ("data", "forward", "backward", "optimizer")  # the trainer's named ranges (jobs/loop.py)
RANGE_PREFIX = "step::"
PROBE_RANGE = RANGE_PREFIX + "probe"
# A collective wrapped by code of its own (a compression hook, a model's own collective) marks its
# whole span ``comm::<kind>`` (e.g. ``comm::all_reduce``): the wrapper's time counts as that kind.
WRAPPED_PREFIX = "comm::"


def busbw_factor(kind: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: what each rank's link carries per byte of the collective."""
    n = max(1, world_size)
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


# Element sizes of the dtype names the profiler records (c10 spellings).
_DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "int": 4, "long int": 8,
                "unsigned char": 1, "signed char": 1, "bool": 1, "short int": 2, "c10::Float8_e4m3fn": 1,
                "c10::Float8_e5m2": 1}


def kind_of(name: str) -> str | None:
    """The collective kind of a c10d operator, a gloo op or an NCCL kernel's name; None if none."""
    low = name.lower().replace("_", "")
    if not (name.startswith(("c10d::", "gloo:", "nccl")) or "nccl" in low):
        return None
    if "barrier" in low or "wait" in low:
        return None
    for kind, marks in (("reduce_scatter", ("reducescatter",)), ("all_gather", ("allgather",)),
                        ("all_reduce", ("allreduce",)), ("broadcast", ("broadcast",))):
        if any(m in low for m in marks):
            return kind
    return "other"


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _bytes(shape, dtype: str) -> int | None:
    size = _DTYPE_BYTES.get(dtype)
    return None if size is None or not isinstance(shape, (list, tuple)) else _numel(shape) * size


def op_bytes(kind: str, shapes: list, dtypes: list) -> int | None:
    """nccl-tests' size of one c10d operator from its recorded inputs, where they carry it: the
    ``_base`` forms name both tensors (all-gather: output first; reduce-scatter: output, input)."""
    tensors = [(s, d) for s, d in zip(shapes, dtypes, strict=False) if s and d in _DTYPE_BYTES]
    if not tensors:
        return None
    if kind == "all_gather":
        return _bytes(*tensors[0])
    if kind == "reduce_scatter" and len(tensors) >= 2:
        return _bytes(*tensors[1])
    return _bytes(*tensors[0]) if kind != "reduce_scatter" else None


@dataclass
class Collective:
    kind: str
    span: Interval  # in flight (us): the backend's execution
    bytes: int | None = None
    issued: float | None = None  # when its operator was called (us): which step it belongs to

    def issued_in(self, window: Interval) -> bool:
        """Issued inside the window: the issuing thread's time decides, because the backend's own
        event can be recorded late (a loaded host deschedules gloo's thread after the wait returns)."""
        at = self.issued if self.issued is not None else (self.span[0] + self.span[1]) / 2
        return window[0] <= at <= window[1]


@dataclass
class Trace:
    """What the anatomy reads from one rank's profile (times in us on the profiler's clock)."""

    window: Interval
    phases: dict[str, list[Interval]]
    collectives: list[Collective]
    compute: list[Interval]
    copies: list[Interval] = field(default_factory=list)


def collectives_of(events, on_gpu: bool) -> list[Collective]:
    """Each collective's span (backend events) with the kind and bytes of its c10d operator,
    matched in issue order. A backend runs a process group's operators in the order they were
    issued; where it recorded fewer events than there were operators (the last ones still being
    recorded when the profile stopped), the rest are counted at their operators' own spans.
    Where it recorded more, its events stand alone (the backend's own name and shape)."""
    ops = sorted((e for e in events if e.name.startswith("c10d::") and kind_of(e.name)),
                 key=lambda e: e.time_range.start)
    backend = sorted((e for e in events if _is_backend_comm(e, on_gpu)), key=lambda e: e.time_range.start)
    if len(backend) > len(ops):
        out = [_own(ev) for ev in backend]
    else:
        out = [_matched(op, backend[i] if i < len(backend) else None) for i, op in enumerate(ops)]
    for ev in events:
        if ev.name.startswith(WRAPPED_PREFIX) and not (on_gpu and str(getattr(ev, "device_type", "")).endswith("CUDA")):
            kind = ev.name[len(WRAPPED_PREFIX):]
            out.append(Collective(kind if kind in KINDS else "other", span_us(ev)))
    return out


def _own(ev) -> Collective:
    """A backend event alone: its own name's kind and its own recorded shape."""
    kind = kind_of(ev.name) or "other"
    return Collective(kind, span_us(ev), _event_bytes(kind, ev))


def _matched(op, ev) -> Collective:
    """One operator and the backend's event that ran it (None: not recorded): the operator names
    the kind (gloo runs a reduce-scatter as an all-reduce) and its shapes give the bytes where they
    carry them (a list form's do not: then the event's)."""
    kind = kind_of(op.name) or "other"
    size = _event_bytes(kind, op)
    if ev is None:
        return Collective(kind, span_us(op), size, issued=float(op.time_range.start))
    return Collective(kind, span_us(ev), size if size is not None else _event_bytes(kind_of(ev.name) or kind, ev),
                      issued=float(op.time_range.start))


def _is_backend_comm(e, on_gpu: bool) -> bool:
    if on_gpu:
        is_device = getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")
        return is_device and comm.gpu_event_kind(e.name) == "comm"
    return e.name.startswith("gloo:") and kind_of(e.name) is not None


def _event_bytes(kind: str, e) -> int | None:
    return op_bytes(kind, list(getattr(e, "input_shapes", None) or []), list(getattr(e, "input_dtypes", None) or []))


def read_trace(events, main_thread: int, on_gpu: bool) -> Trace:
    """The probe's window, the named parts, collectives, computation and copies of one profile."""
    phases: dict[str, list[Interval]] = {p: [] for p in PHASES}
    window: Interval | None = None
    for e in events:
        if not e.name.startswith(RANGE_PREFIX) or (on_gpu and getattr(e, "is_user_annotation", False)
                                                   and str(getattr(e, "device_type", "")).endswith("CUDA")):
            continue
        span = span_us(e)
        if e.name == PROBE_RANGE:
            window = span
        elif e.name[len(RANGE_PREFIX):] in phases:
            phases[e.name[len(RANGE_PREFIX):]].append(span)
    if window is None:
        raise ValueError(f"the probe's trace has no {PROBE_RANGE!r} range")
    kinds = comm.classify_events(events, main_thread, on_gpu)
    return Trace(window, phases, collectives_of(events, on_gpu), kinds["compute"], kinds.get("memcpy", []))


def _clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """union(a) minus union(b), as intervals."""
    out: list[Interval] = []
    bm = merged(b)
    for lo, hi in merged(a):
        cur = lo
        for blo, bhi in bm:
            if bhi <= cur or blo >= hi:
                continue
            if blo > cur:
                out.append((cur, blo))
            cur = max(cur, bhi)
        if cur < hi:
            out.append((cur, hi))
    return out


def anatomy(trace: Trace, n_steps: int, world_size: int) -> dict[str, float]:
    """Per-step parts (ms) that add up to the probe's step time, and per kind the overlapped time,
    bytes and bandwidths."""
    w = trace.window
    per_step_ms = 1e-3 / n_steps
    data = _clip(trace.phases["data"], w)
    compute = _clip(trace.compute, w)
    taken: list[Interval] = list(data)  # time already given to a part
    out: dict[str, float] = {ANATOMY_STEP: (w[1] - w[0]) * per_step_ms,
                             ANATOMY_DATA_WAIT_MS: union_length(data) * per_step_ms}
    for kind in KINDS:
        spans = _clip([c.span for c in trace.collectives if c.kind == kind], w)
        exposed = _minus(_minus(spans, compute), taken)
        taken += exposed
        in_flight_ms = union_length(spans) * per_step_ms
        out[f"comm_{kind}_exposed_ms"] = union_length(exposed) * per_step_ms
        out[f"comm_{kind}_overlapped_ms"] = max(0.0, in_flight_ms - minus_length(spans, compute) * per_step_ms)
        out.update(_traffic(kind, [c for c in trace.collectives if c.kind == kind and c.issued_in(w)],
                            in_flight_ms, n_steps, world_size))
    for phase in PHASES[1:]:
        own = _minus(_clip(trace.phases[phase], w), taken)
        taken += own
        out[f"anatomy_{phase}_ms"] = union_length(own) * per_step_ms
    copies = _minus(_clip(trace.copies, w), taken)
    taken += copies
    out[ANATOMY_COPIES_MS] = union_length(copies) * per_step_ms
    out[ANATOMY_UNATTRIBUTED_MS] = max(0.0, out[ANATOMY_STEP] - union_length(taken) * per_step_ms)
    return out


def _traffic(kind: str, calls: list[Collective], in_flight_ms: float, n_steps: int,
             world_size: int) -> dict[str, float]:
    """Bytes per step of one kind, and nccl-tests' algbw/busbw over the time it was in flight."""
    sizes = [c.bytes for c in calls if c.bytes is not None]  # a wrapped span's bytes are its collective's
    if not sizes:
        return {} if not calls else {f"comm_{kind}_calls_per_step": len(calls) / n_steps}
    per_step = sum(sizes) / n_steps
    out = {comm_bytes(kind): per_step, f"comm_{kind}_calls_per_step": len(calls) / n_steps}
    if in_flight_ms > 0:
        algbw = per_step / (in_flight_ms * 1e-3) / 1e9
        out[f"comm_{kind}_algbw_gbps"] = algbw
        out[f"comm_{kind}_busbw_gbps"] = algbw * busbw_factor(kind, world_size)
    return out


def probe(run_steps: Callable[[int], None], trainer, n_steps: int, on_gpu: bool,
          world_size: int) -> dict[str, float]:
    """Run ``run_steps(n_steps)`` under the profiler with the trainer's parts named: jobs/comm.py's
    communication figures and the step's anatomy, per step."""
    import threading
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    trainer.annotate = True
    try:
        with profile(activities=activities, record_shapes=True) as prof:
            t0 = time.perf_counter()
            with record_function(PROBE_RANGE):
                run_steps(n_steps)
            wall_s = time.perf_counter() - t0
    finally:
        trainer.annotate = False
    events = prof.events()
    main_thread = comm.main_thread_id(events, threading.get_native_id())
    kinds = comm.classify_events(events, main_thread, on_gpu)
    figures: dict[str, Any] = comm.figures(kinds, wall_s, n_steps)
    figures.update(anatomy(read_trace(events, main_thread, on_gpu), n_steps, world_size))
    return figures
