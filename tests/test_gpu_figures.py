"""GPU figures on CPU: energy from NVML's counter or its power samples, the job's own GPU system
metrics, the measured matmul peak's guards, and what a CPU run reports instead (no numbers, a tag
that says why). NVML is a stateful FAKE here (FakeNvml), CUDA too where a device is needed
(tests/fake_cuda.py); the arithmetic is pinned in
tests/test_metrics.py, the real devices in tests/test_gpu.py."""

import json
import time
from types import SimpleNamespace

import pytest

from jobs import energy, matmul_peak
from jobs.interference import GpuSampler
from jobs.sinks import FanOut, JsonlSink, MlflowSink


class NVMLError_NotSupported(Exception):  # noqa: N801 - pynvml's own class name
    """Stands for pynvml.NVMLError_NotSupported (its str is "Not Supported")."""

    def __str__(self):
        return "Not Supported"


class FakeNvml:
    """A FAKE of the pynvml functions the GPU sampler calls, stateful: the energy counter (mJ)
    advances by ``mj_per_read`` at every read and starts at ``counter_mj``; power, memory and
    utilisation are constants; a function named in ``refuse`` raises NotSupported, as pynvml does
    on GPUs without it. ``calls`` counts the calls per function."""

    def __init__(self, *, counter_mj=1_000_000, mj_per_read=5_000, power_mw=250_000, used_bytes=3 * 2**30,
                 util=80, refuse=(), indices=None):
        self.counter_mj, self.mj_per_read = counter_mj, mj_per_read
        # {UUID as NVML writes it: NVML index}; a UUID not listed is index 0.
        self.indices = dict(indices or {})
        self.power_mw, self.used_bytes, self.util, self.refuse = power_mw, used_bytes, util, set(refuse)
        self.calls = {}

    def _call(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.refuse:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._call("nvmlDeviceGetHandleByUUID")
        return ("handle", uuid)

    def nvmlDeviceGetIndex(self, handle):
        self._call("nvmlDeviceGetIndex")
        uuid = handle[1].decode() if isinstance(handle[1], bytes) else handle[1]
        return self.indices.get(uuid, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=10, usedGpuMemory=self.used_bytes)]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.util, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._call("nvmlDeviceGetPowerUsage")
        return self.power_mw

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=80 * 2**30, used=self.used_bytes, free=80 * 2**30 - self.used_bytes)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        value = self.counter_mj
        self.counter_mj = (self.counter_mj + self.mj_per_read) % 2**64  # an unsigned 64-bit counter
        return value


def window(sampler, seconds=0.12):
    sampler.event("start")
    time.sleep(seconds)
    sampler.event("end")


def test_energy_from_the_counter_read_at_the_window_boundaries():
    fake = FakeNvml(counter_mj=2**64 - 2_000, mj_per_read=5_000)  # wraps between the two reads
    sampler = GpuSampler(fake, "GPU-x", pid=10, interval_s=0.02)
    window(sampler)
    energy = sampler.energy()
    assert energy["method"] == "nvml_energy_counter"
    assert energy["energy_j"] == pytest.approx(5.0)
    assert 0.1 <= energy["window_s"] < 2.0
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2  # at start and at end, never per sample


def test_energy_from_power_samples_where_the_counter_is_not_supported():
    fake = FakeNvml(power_mw=250_000, refuse={"nvmlDeviceGetTotalEnergyConsumption"})
    sampler = GpuSampler(fake, "GPU-x", pid=10, interval_s=0.02)
    window(sampler)
    energy = sampler.energy()
    assert energy["method"] == "nvml_power_samples"
    # Constant 250 W: the integral over the samples' span is 250 W x that span, whatever the timing.
    assert energy["energy_j"] / energy["window_s"] == pytest.approx(250.0)
    assert len(sampler.samples) >= 3  # start, the thread's samples, end
    # Refused once, not asked again (start only: the end read is skipped).
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert "Not Supported" in sampler.unsupported["energy"]


def test_no_energy_figure_without_counter_or_power():
    fake = FakeNvml(refuse={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"})
    sampler = GpuSampler(fake, "GPU-x", pid=10, interval_s=0.02)
    window(sampler)
    missing = sampler.energy()["missing"]
    assert "nvmlDeviceGetTotalEnergyConsumption" in missing and "nvmlDeviceGetPowerUsage" in missing
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    summary, tags = energy.energy_figures([sampler.energy()], samples_in_window=100)
    assert summary == {} and tags["energy_missing"].startswith("rank 0: ")
    assert GpuSampler(FakeNvml(), "GPU-x", pid=10).energy() == {"missing": "no complete measured window"}


def test_series_carry_the_job_devices_in_units_and_thin_out():
    fake = FakeNvml(power_mw=300_500, used_bytes=int(1.5 * 2**30), util=64)
    sampler = GpuSampler(fake, "GPU-x", pid=10, interval_s=0.001)
    window(sampler, 0.1)
    series = sampler.series(node_id=1, device_index=2)
    assert len(series["samples"]) <= energy.SYSTEM_MAX_POINTS
    assert series["samples"][0] == {"unix_s": pytest.approx(time.time(), abs=5), "util_percent": 64.0,
                                    "mem_used_gib": pytest.approx(1.5), "power_w": pytest.approx(300.5)}
    records = energy.system_records([series])
    assert set(records[0]) == {"step", "time", "system/node1/gpu2_utilization_percent",
                               "system/node1/gpu2_memory_used_gib", "system/node1/gpu2_power_w"}
    assert [r["step"] for r in records] == list(range(len(records)))
    # The figures the interference check reads are unchanged by the extra readings.
    assert sampler.figures() == pytest.approx({"foreign_gpu_share": 0.0, "gpu_util_mean": 0.64})


@pytest.mark.parametrize("model, precision, math", [
    ("cnn", "fp32", "tf32"),  # cuDNN convolutions use TF32 by default: the datasheet MFU divides by TF32
    ("gpt_tiny", "fp32", "fp32"),  # fp32 matmuls, TF32 off by default
    ("cnn", "bf16", "bf16"),
])
def test_matmul_peak_is_timed_in_the_math_the_model_runs(monkeypatch, model, precision, math):
    # R5: an fp32 CNN's datasheet peak is TF32's, so its measured peak must be timed with TF32
    # matmuls too (allow_tf32 is False by default: timing plain fp32 makes mfu_measured_peak ~7-10x
    # too high). CUDA is a stateful fake (tests/fake_cuda.py); the flag is read at each matmul.
    import torch

    from contract.spec import InputKind, ModelSpec
    from jobs import models
    from tests import fake_cuda

    spec = ModelSpec(name=model, input=InputKind.image if model == "cnn" else InputKind.tokens)
    with torch.device("meta"):
        built = models.build_model(spec)
    cuda = fake_cuda.install(monkeypatch, visible=1)
    flags_at_matmul = []
    real_matmul = torch.matmul

    def matmul(*args, **kwargs):
        flags_at_matmul.append(torch.backends.cuda.matmul.allow_tf32)
        return real_matmul(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", matmul)
    with matmul_peak.matmul_tf32(torch, False):  # PyTorch's default, whatever this process set
        assert matmul_peak.math_mode(torch, built, precision) == math
        with cuda.tensors():
            measured = matmul_peak.measure(torch.device("cuda", 0), precision,
                                           matmul_peak.math_mode(torch, built, precision))
        assert torch.backends.cuda.matmul.allow_tf32 is False  # restored after the timing
    assert "missing" not in measured, measured
    assert measured["math"] == math and measured["tf32"] == (math == "tf32")
    assert flags_at_matmul and set(flags_at_matmul) == {math == "tf32"}
    assert measured["timed_cuda_matmul_allow_tf32"] == str(math == "tf32")
    assert cuda.calls[-1] == "empty_cache"


def test_system_metrics_are_named_by_the_nvml_index_under_per_task_binding(monkeypatch):
    # R7: Slurm's per-task binding shows each rank one GPU, as cuda:0. Two ranks of node 1 bound to
    # its GPUs 3 and 5 must log gpu3_* and gpu5_* (NVML's index, found by UUID), not gpu0_* twice.
    import torch

    from jobs.dist import nvml_uuid
    from jobs.interference import Interference
    from tests import fake_cuda

    nvml = FakeNvml(indices={nvml_uuid(fake_cuda.bare_uuid(i, node=1)): i for i in range(8)})
    series = []
    for gpu in (3, 5):
        fake_cuda.install(monkeypatch, visible=[gpu], node=1)
        interference = Interference(torch.device("cuda", 0), make_nvml=lambda: (nvml, None))
        assert interference.missing is None
        window(interference.gpu, 0.02)
        series.append(interference.portable("node1", node_id=1)["gpu_series"])
    assert [s["device_index"] for s in series] == [3, 5]
    keys = {k for r in energy.system_records(series) for k in r} - {"step", "time"}
    assert {k.split("_")[0] for k in keys} == {"system/node1/gpu3", "system/node1/gpu5"}


def test_system_records_reach_jsonl_and_mlflow_apart_from_training_steps(tmp_path):
    records = [{"step": 0, "time": 100.0, "system/node0/gpu0_power_w": 400.0},
               {"step": 1, "time": 100.5, "system/node0/gpu0_power_w": 410.0}]
    jsonl = JsonlSink(tmp_path / "metrics.jsonl")
    mlflow = MlflowSink("sqlite:///unused.db", run_id="r")  # buffered: nothing is sent before finish
    sink = FanOut(jsonl, mlflow)
    sink.log_system(records)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"kind": "system", **r} for r in records]
    assert jsonl.logged_steps() == set() and sink.logged_steps == set()  # a resume must not skip steps 0, 1
    # Each point at the time it was sampled (MLflow's system-metrics view plots by time).
    assert mlflow._metrics == [("system/node0/gpu0_power_w", 400.0, 100_000, 0),
                               ("system/node0/gpu0_power_w", 410.0, 100_500, 1)]


def test_matmul_peak_is_not_measured_off_cuda():
    torch = pytest.importorskip("torch")
    assert matmul_peak.measure(torch.device("cpu"), "bf16") == {
        "missing": "cpu ranks: no matmul peak is measured off CUDA"}
    assert [matmul_peak.dtype_name(p) for p in ("fp32", "bf16", "fp16")] == ["float32", "bfloat16", "float16"]
    # 3 x 8192^2 x 2 bytes = 384 MiB: fits in half of 1 GiB free; with 500 MiB free, 4096 does.
    assert matmul_peak.size_that_fits(2**30, 2) == 8192
    assert matmul_peak.size_that_fits(500 * 2**20, 2) == 4096
    assert matmul_peak.size_that_fits(2**20, 4) == 0


def test_gpu_figures_reduction_for_cuda_ranks_from_gathered_samples():
    torch = pytest.importorskip("torch")
    from jobs.summary import gpu_figures

    series = {"node_id": 0, "device_index": 0, "unsupported": {"memory": "nvmlDeviceGetMemoryInfo: NoPermission"},
              "samples": [{"unix_s": 5.0, "util_percent": 99.0, "mem_used_gib": None, "power_w": 500.0}]}
    per_rank = [{"hostname": "h0", "interference": {
        "gpu_energy": {"energy_j": 1000.0, "window_s": 4.0, "method": "nvml_energy_counter"}, "gpu_series": series}}]
    summary, tags = {}, {}
    records = gpu_figures(torch.device("cuda", 0), per_rank, summary, tags, None, samples_in_window=400)
    assert summary == pytest.approx({"energy_j": 1000.0, "energy_j_per_sample": 2.5, "power_w_mean": 250.0})
    assert tags == {"energy_method": "nvml_energy_counter", "system_metrics_devices": "node0/gpu0=h0",
                    "nvml_refused": "memory: nvmlDeviceGetMemoryInfo: NoPermission"}
    assert records == [{"step": 0, "time": 5.0, "system/node0/gpu0_utilization_percent": 99.0,
                        "system/node0/gpu0_power_w": 500.0}]
    # No NVML: no numbers, the reason as tags.
    summary, tags = {}, {}
    assert gpu_figures(torch.device("cuda", 0), per_rank, summary, tags, "pynvml is not installed", 400) == []
    assert summary == {} and tags == {"energy_missing": "pynvml is not installed",
                                      "system_metrics_missing": "pynvml is not installed"}


def test_a_cpu_run_reports_no_gpu_figures_and_says_why(tmp_path):
    pytest.importorskip("torch")
    from tests.ranks import make_spec, run_ranks

    results = run_ranks(make_spec(tmp_path, world_size=1, steps=4, warmup_steps=1), 1)
    assert "error" not in results[0], results[0].get("error")
    summary, tags = results[0]["summary"], results[0]["tags"]
    for key in ("energy_j", "energy_j_per_sample", "power_w_mean", "measured_matmul_tflops", "mfu_measured_peak"):
        assert key not in summary
    assert tags["energy_missing"] == "cpu ranks: energy is measured on CUDA devices only (NVML)"
    assert tags["mfu_measured_missing"] == "rank 0: cpu ranks: no matmul peak is measured off CUDA"
    assert tags["mfu_formula"].startswith("flops_per_sample x throughput_samples_per_s_per_device / peak_flops_per_s")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["kind"] == "system"]
