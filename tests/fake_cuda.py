"""A CUDA machine for the CPU build of torch, as far as one can be faked (tests/test_gpu_rehearsal.py).

Everything here is a stand-in for hardware this machine lacks, and says so. It is stateful: it
remembers which device each call made current, which tensors were pinned and where every random
draw ran, so tests assert on what the code under test did, not on what the fake returns.

* ``torch.cuda``'s queries: ``device_count`` (the visible devices: a node's physical GPUs as
  CUDA_VISIBLE_DEVICES names them, so that ordinal 0 of a rank bound to GPU 5 is GPU 5), ``current_device`` /
  ``set_device`` (recorded), ``get_device_properties`` with each device's UUID as torch prints it
  (PyTorch's ``_CUuuid.__str__``: bare 8-4-4-4-12 hex, no "GPU-" prefix; only NVML and
  nvidia-smi write the prefix), ``get_device_name`` / ``get_device_capability`` of an H100 SXM.
* ``FakeTensorMode``: tensors on device "cuda" with shapes, dtypes and devices but no storage;
  operators run as shape functions, random initialisation included (no numbers are drawn, so the
  draws are recorded, with the device they ran on, instead of compared).
* The Python bindings of ``Tensor.copy_``, ``Tensor.to`` and integer/slice indexing, which on the
  CPU build open a CUDA device guard before dispatching (the same aten ops through ``torch.ops``
  run), and
  ``pin_memory`` / ``is_pinned``, which fake tensors do not implement: rerouted for fake tensors
  only; real tensors keep the real methods.
* The ``fake`` process-group backend (torch.testing._internal.distributed.fake_pg): every
  collective returns at once, so a rank of an 8- or 16-rank job runs alone.

What cannot run here at all, and is therefore never attempted (each would abort the process, not
raise): autograd on fake CUDA tensors (the CPU build cannot create autograd metadata for a CUDA
tensor, so no forward with parameters that require grad, no backward, no DDP reducer), CUDA
streams and events (FSDP's forward), NCCL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

H100_NAME = "NVIDIA H100 80GB HBM3"
RANDOM_OPS = ("uniform_", "normal_", "bernoulli_", "random_", "exponential_", "randn", "rand", "randint")


def bare_uuid(index: int, node: int = 0) -> str:
    """A device UUID as ``str(torch.cuda.get_device_properties(i).uuid)`` prints it."""
    return f"{node:08x}-0000-4000-8000-{index:012x}"


@dataclass
class _Props:
    """torch.cuda.get_device_properties(i) of an H100 SXM (the fields the project reads)."""

    index: int
    node: int = 0
    name: str = H100_NAME
    major: int = 9
    minor: int = 0
    total_memory: int = 80 * 1024**3
    multi_processor_count: int = 132

    @property
    def uuid(self) -> str:
        return bare_uuid(self.index, self.node)


class _Event:
    """torch.cuda.Event: no GPU timeline here, so every interval between two events is 1 ms."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        if not (self.recorded and end.recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return 1.0


class DrawRecorder(TorchDispatchMode):
    """Records (op, device) of every random operator and passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[tuple[str, torch.device]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket.__name__ in RANDOM_OPS:
            device = args[0].device if args and isinstance(args[0], torch.Tensor) else (kwargs or {}).get("device")
            self.draws.append((func._overloadpacket.__name__, torch.device(device) if device else None))
        return func(*args, **(kwargs or {}))


@dataclass
class FakeCuda:
    """The state of the fake: what the code under test asked of it."""

    physical: list[int]  # the node's GPU behind each visible ordinal (CUDA_VISIBLE_DEVICES)
    node: int = 0
    current: int = 0
    set_device_calls: list[int] = field(default_factory=list)
    pinned: set[int] = field(default_factory=set)  # storages pin_memory() was asked for
    mode: FakeTensorMode = field(default_factory=lambda: FakeTensorMode(allow_non_fake_inputs=True))
    recorder: DrawRecorder = field(default_factory=DrawRecorder)
    free_bytes: int = 70 * 1024**3
    calls: list[str] = field(default_factory=list)  # synchronize, empty_cache, peak resets, in order
    # The allocator's peaks since the last reset, as the test sets them (nothing allocates here).
    peak_bytes: dict[str, int] = field(default_factory=lambda: {"allocated": 0, "reserved": 0})

    @property
    def visible(self) -> int:
        return len(self.physical)

    @contextlib.contextmanager
    def tensors(self) -> Iterator[FakeCuda]:
        """Fake tensors (device "cuda" allowed) with every random draw recorded."""
        with self.mode, self.recorder:
            yield self

    @contextlib.contextmanager
    def real(self) -> Iterator[None]:
        """Real tensors for a moment inside :meth:`tensors` (e.g. building a device mesh: DeviceMesh
        reads its rank table's values, which a fake tensor does not have)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            yield


def install(monkeypatch, visible: int | list[int], node: int = 0) -> FakeCuda:
    """Patch torch.cuda and the tensor bindings (undone by ``monkeypatch`` after the test).
    ``visible``: how many GPUs this process sees (0..n-1), or which of the node's it sees."""
    state = FakeCuda(physical=list(range(visible)) if isinstance(visible, int) else list(visible), node=node)

    def index_of(device: Any = None) -> int:
        if device is None:
            return state.current
        if isinstance(device, int):
            return device
        device = torch.device(device)
        return state.current if device.index is None else device.index

    def set_device(device: Any) -> None:
        index = index_of(device)
        if not 0 <= index < state.visible:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} ({state.visible} visible)")
        state.current = index
        state.set_device_calls.append(index)

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: state.visible > 0)
    monkeypatch.setattr(cuda, "device_count", lambda: state.visible)
    monkeypatch.setattr(cuda, "current_device", lambda: state.current)
    monkeypatch.setattr(cuda, "set_device", set_device)
    monkeypatch.setattr(cuda, "get_device_properties",
                        lambda device=None: _Props(state.physical[index_of(device)], state.node))
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: H100_NAME)
    monkeypatch.setattr(cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (state.free_bytes, _Props(0).total_memory))
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: state.calls.append("synchronize"))
    monkeypatch.setattr(cuda, "empty_cache", lambda: state.calls.append("empty_cache"))
    monkeypatch.setattr(cuda, "Event", _Event)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: state.peak_bytes["allocated"])
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: state.peak_bytes["reserved"])

    def reset_peak_memory_stats(device=None) -> None:
        state.calls.append(f"reset_peak_memory_stats:{index_of(device)}")
        state.peak_bytes = {"allocated": 0, "reserved": 0}

    monkeypatch.setattr(cuda, "reset_peak_memory_stats", reset_peak_memory_stats)

    real_copy, real_to = torch.Tensor.copy_, torch.Tensor.to
    real_pin, real_is_pinned = torch.Tensor.pin_memory, torch.Tensor.is_pinned

    def copy_(self, src, non_blocking=False):
        if isinstance(self, FakeTensor) or isinstance(src, FakeTensor):
            return torch.ops.aten.copy_.default(self, src, non_blocking)
        return real_copy(self, src, non_blocking)

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
        if isinstance(self, FakeTensor) and target is not None and torch.device(target).type == "cuda":
            device = torch.device(target)
            device = torch.device("cuda", state.current) if device.index is None else device
            dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
            if self.device == device and (dtype is None or dtype == self.dtype):
                return self
            return torch.ops.aten._to_copy.default(self, device=device, dtype=dtype or self.dtype)
        return real_to(self, *args, **kwargs)

    real_getitem = torch.Tensor.__getitem__

    def getitem(self, key):
        # Integer and slice indexing as aten views; anything else through the real binding. On the
        # CPU build every "cuda" tensor is fake underneath (a DTensor's local shard included).
        keys = key if isinstance(key, tuple) else (key,)
        if not (self.device.type == "cuda" and all(isinstance(k, (int, slice)) for k in keys)):
            return real_getitem(self, key)
        out, dim = self, 0
        for k in keys:
            if isinstance(k, int):
                out = torch.ops.aten.select.int(out, dim, k)
            else:
                out = torch.ops.aten.slice.Tensor(out, dim, k.start, k.stop, k.step or 1)
                dim += 1
        return out

    # Pinned is a property of the storage: a view of a pinned tensor is pinned.
    def pin_memory(self, *args, **kwargs):
        if isinstance(self, FakeTensor):
            state.pinned.add(self.untyped_storage()._cdata)
            return self
        return real_pin(self, *args, **kwargs)

    def is_pinned(self, *args, **kwargs):
        if isinstance(self, FakeTensor):
            return self.untyped_storage()._cdata in state.pinned
        return real_is_pinned(self, *args, **kwargs)

    real_swap = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        # nn.Module._apply swaps fake parameters (``module.to(device)``), and swap_tensors refuses a
        # tensor with a weak reference: FakeTensorMode's real-to-fake memo holds one on tensors it
        # met during initialisation. The memo is a cache; emptied, the swap goes through.
        state.mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        return real_swap(t1, t2)

    monkeypatch.setattr(torch.utils, "swap_tensors", swap_tensors)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "is_pinned", is_pinned)
    return state


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """A default process group of ``world_size`` ranks on the ``fake`` backend, this process as ``rank``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
