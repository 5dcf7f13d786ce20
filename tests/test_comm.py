"""jobs/comm.py on synthetic profiler events: what counts as communication, compute and copies
(H2 of the GPU review), and the interval arithmetic the figures rest on."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from jobs import anatomy, comm


@dataclass
class Event:
    """The attributes of torch.autograd.profiler_util.FunctionEvent that comm.py reads."""

    name: str
    start: float
    end: float
    device_type: str = "DeviceType.CUDA"
    thread: int = 0
    is_user_annotation: bool = False
    time_range: SimpleNamespace = field(init=False)

    def __post_init__(self):
        self.time_range = SimpleNamespace(start=self.start, end=self.end)


def cpu(name, start, end, thread=1, **kw):
    return Event(name, start, end, device_type="DeviceType.CPU", thread=thread, **kw)


# An FSDP2 step on the GPU timeline: the user-annotation mirrors of record_function ranges span
# the NCCL kernels (FSDP::all_gather) and whole phases (ProfilerStep#1).
FSDP_STEP = [
    Event("ProfilerStep#1", 0, 100, is_user_annotation=True),
    Event("FSDP::all_gather", 0, 30, is_user_annotation=True),
    Event("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0, 20),
    Event("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", 20, 50),
    Event("FSDP::post_backward_reduce", 50, 100, is_user_annotation=True),
    Event("ncclKernel_ReduceScatter_RING_LL_Sum_float", 60, 90),
    Event("void at::native::vectorized_elementwise_kernel<4, ...>", 50, 70),
    Event("Memcpy HtoD (Pinned -> Device)", 90, 95),
    Event("Memset (Device)", 95, 96),
    cpu("nccl:all_gather", 0, 2),  # the CPU-side launch record: not on the GPU timeline
]


def test_gpu_annotations_are_neither_compute_nor_communication():
    kinds = comm.classify_events(FSDP_STEP, main_thread=1, on_gpu=True)
    assert sorted(kinds["comm"]) == [(0, 20), (60, 90)]
    assert sorted(kinds["compute"]) == [(20, 50), (50, 70)]
    assert sorted(kinds["memcpy"]) == [(90, 95), (95, 96)]


def test_gpu_figures_count_exposed_communication():
    kinds = comm.classify_events(FSDP_STEP, main_thread=1, on_gpu=True)
    fig = comm.figures(kinds, wall_s=0.001, n_steps=1)  # intervals in us; 1 ms step
    assert fig["comm_time_ms"] == pytest.approx(0.050)  # 20 + 30 us of NCCL kernels
    # Hidden: only 60-70 overlaps the elementwise kernel; 0-20 and 70-90 are exposed.
    assert fig["comm_exposed_ms"] == pytest.approx(0.040)
    assert fig["memcpy_time_ms"] == pytest.approx(0.006)
    assert fig["comm_share"] == pytest.approx(0.04)
    # Before the fix, the FSDP::* annotations counted as compute and hid every NCCL kernel.
    with_annotations = comm.minus_length(kinds["comm"], kinds["compute"] + [(0, 30), (50, 100)])
    assert with_annotations == 0


@pytest.mark.parametrize("name, kind", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm"),
    ("Memcpy DtoH (Device -> Pinned)", "memcpy"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memset (Device)", "memcpy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>", "compute"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "compute"),
    # A kernel that mentions nccl without being one of NCCL's kernels is not communication.
    ("void at::native::copy_for_nccl_buffer_kernel", "compute"),
])
def test_gpu_kernel_kinds(name, kind):
    assert comm.gpu_event_kind(name) == kind


def test_cpu_classification_counts_gloo_ranges_and_skips_other_annotations():
    events = [
        cpu("aten::mm", 0, 10), cpu("aten::add_", 10, 12),
        cpu("gloo:all_reduce", 5, 20, thread=7),
        cpu("aten::wait", 12, 20),  # blocking in a collective is not compute
        cpu("aten::mm", 30, 40, thread=9),  # another thread
        cpu("FSDP::all_gather", 0, 40, is_user_annotation=True),
        # gloo's collectives are record_function ranges on its worker thread: they are the
        # communication (test_real_gloo_collectives_are_counted reads them from the profiler).
        cpu("gloo:broadcast", 50, 60, thread=7, is_user_annotation=True),
    ]
    kinds = comm.classify_events(events, main_thread=1, on_gpu=False)
    assert kinds["comm"] == [(5, 20), (50, 60)]
    assert kinds["compute"] == [(0, 10), (10, 12)]


def test_events_without_the_annotation_attribute_are_read():
    class Old:  # torch builds whose FunctionEvent has no is_user_annotation
        name, thread, device_type = "ncclKernel_x", 0, "DeviceType.CUDA"
        time_range = SimpleNamespace(start=1.0, end=2.0)

    assert comm.classify_events([Old()], 0, on_gpu=True)["comm"] == [(1.0, 2.0)]


# ---- interval arithmetic ---------------------------------------------------------------------

@pytest.mark.parametrize("intervals, length", [
    ([], 0.0),
    ([(0, 10)], 10.0),
    ([(0, 10), (5, 15)], 15.0),  # overlap counted once
    ([(0, 10), (2, 3)], 10.0),  # nested
    ([(10, 20), (0, 5)], 15.0),  # unsorted
    ([(0, 5), (5, 10)], 10.0),  # touching
    ([(0, 1), (2, 3), (2.5, 4)], 3.0),
])
def test_union_length(intervals, length):
    assert comm.union_length(intervals) == pytest.approx(length)


def test_merged():
    assert comm.merged([(5, 7), (0, 2), (1, 3), (3, 4), (10, 11)]) == [(0, 4), (5, 7), (10, 11)]
    assert comm.merged([]) == []


@pytest.mark.parametrize("a, b, length", [
    ([(0, 10)], [], 10.0),
    ([(0, 10)], [(0, 10)], 0.0),
    ([(0, 10)], [(2, 4), (6, 7)], 7.0),
    ([(0, 10)], [(-5, 3), (8, 20)], 5.0),  # overhanging on both sides
    ([(0, 5), (10, 15)], [(4, 11)], 8.0),  # one b interval covering two a's
    ([(0, 5), (3, 8)], [(2, 4), (3, 6)], 4.0),  # overlapping inputs on both sides
    ([], [(0, 1)], 0.0),
])
def test_minus_length(a, b, length):
    assert comm.minus_length(a, b) == pytest.approx(length)


def test_real_gloo_collectives_are_counted(tmp_path):
    # The profiler's own events for a real gloo all-reduce, not synthetic ones.
    import os

    import torch
    import torch.distributed as dist

    from jobs.dist import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        tensor = torch.ones(1 << 20)

        def run_steps(n):
            for _ in range(n):
                tensor.mul_(1.0001)  # compute
                dist.all_reduce(tensor)

        trainer = SimpleNamespace(annotate=False)  # what jobs.anatomy.probe switches on: the trainer's ranges
        figures = anatomy.probe(run_steps, trainer, 3, on_gpu=False, world_size=1)
    finally:
        dist.destroy_process_group()
    assert figures["comm_time_ms"] > 0 and 0 < figures["comm_share"] <= 1
    assert figures["comm_all_reduce_bytes_per_step"] == 4 * (1 << 20) and trainer.annotate is False
