"""Other processes on this job's cores and GPUs during the measured window (stdlib; NVML optional).

CPU: at the window's start and end each rank reads the per-CPU busy time of /proc/stat (``cpuN``
lines) and its own process CPU time (all threads, plus live child processes such as DataLoader
workers). Per host, the CPUs are the union of the local ranks' affinity sets
(``os.sched_getaffinity``); the busy time those CPUs spent that none of the host's ranks spent is
someone else's::

    foreign_cpu_share = max(0, busy_delta_s - our_cpu_delta_s) / (window_s * n_cores)

reported as the maximum over hosts (jobs.summary.foreign_cpu_share). Samples are taken only at
the window's two boundaries, outside every step: reading /proc costs well under a millisecond,
and nothing here synchronises ranks (the per-rank samples travel with the one gather the worker
does after the window). Limits: interrupt time (irq, softirq) is not attributed to a process, so
it counts as foreign; /proc/stat counts in clock ticks (10 ms per CPU at USER_HZ=100), so a very
short window has a coarse share.

GPU: a sampling thread reads NVML every ``interval_s`` during the window: the compute processes on
this rank's device that are not this process, and the device's utilisation. ``foreign_gpu_share``
is the fraction of samples in which another process was present, ``gpu_util_mean`` the mean
utilisation (a fraction, 0..1). Without ``pynvml`` the GPU figures are skipped and the tag
``gpu_interference_missing`` says why.

The same thread also records the device's power draw and memory in use, and the device's total-
energy counter is read at the window's two boundaries: the energy the job's GPUs spent in the
window (jobs.energy.energy_figures) and the system metrics rank 0 logs for the job's own GPUs
(jobs.energy.system_records). Every rank samples its own device: each knows its device's UUID
without any exchange, the thread exists anyway, and the set of devices sampled is exactly the
job's (no device of the host that another job uses). A reading NVML refuses (NotSupported on an
older GPU, no permission) switches that reading off for the rest of the window, and the reason
travels with the figures.

Why not ``mlflow.enable_system_metrics_logging()``: MLflow's monitor samples every GPU NVML sees
on the host, other tenants' included (a job on 2 of a node's 8 GPUs would log all 8), from a
thread tied to an active run in the logging process; here only rank 0 logs, through an explicit
client at the end (jobs/sinks.py), and the other nodes' GPUs are in other processes. So each rank
samples its own device, the samples travel with the one gather after the window, and rank 0 logs
them as ``system/node<N>/gpu<I>_{utilization_percent,memory_used_gib,power_w}``, step = sample
index, timestamp = when sampled (MLflow's system-metrics view lists keys under ``system/``). ``<I>``
is the device's NVML index (nvidia-smi's), found from its UUID: not the CUDA ordinal, which is 0 on
every rank under Slurm's per-task GPU binding (R7 of the GPU review).
Device memory is the device's (nvmlDeviceGetMemoryInfo.used): another process on the same GPU
counts too, which ``foreign_gpu_share`` flags.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.metrics import ENERGY_J, FOREIGN_GPU_SHARE, GPU_UTIL_MEAN
from jobs import energy
from jobs.memory import GIB

# /proc/stat cpuN columns: user nice system idle iowait irq softirq steal guest guest_nice.
# Busy = everything but idle and iowait; guest time is already included in user (and
# guest_nice in nice), so it is not added again.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def parse_proc_stat(text: str) -> dict[int, int]:
    """{cpu index: busy clock ticks} from /proc/stat's ``cpuN`` lines (the ``cpu`` total skipped)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        values = [int(v) for v in fields]
        out[int(name[3:])] = sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
    return out


def clock_ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _stat_cpu_s(pid: int, ticks_per_s: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds; 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    # fixed: utime and stime are fields 14 and 15, i.e. the 12th and 13th after it.
    rest = text.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / ticks_per_s


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def own_cpu_s() -> float:
    """This process's CPU time (every thread) plus that of its live descendants (DataLoader
    workers): everything this rank runs on its cores."""
    ticks = clock_ticks_per_s()
    total = time.process_time()
    stack = _children(os.getpid())
    seen = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _stat_cpu_s(pid, ticks)
        stack += _children(pid)
    return total


def kernel_id() -> str | None:
    """This kernel's boot id: the same for every process whose /proc/stat counts the same cores."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def cpu_sample() -> dict[str, Any] | None:
    """One boundary sample: wall time, busy ticks of every CPU, this rank's own CPU time. None
    where /proc/stat cannot be read (not Linux)."""
    try:
        busy = parse_proc_stat(Path("/proc/stat").read_text())
    except OSError:
        return None
    return {"wall_s": time.monotonic(), "busy_ticks": busy, "own_cpu_s": own_cpu_s()}


class CpuWindow:
    """Samples at the measured window's start and end (``event("start")`` / ``event("end")``)."""

    def __init__(self) -> None:
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None

    def event(self, name: str) -> None:
        if name == "start":
            self.start, self.end = cpu_sample(), None
        elif name == "end" and self.start is not None:
            self.end = cpu_sample()

    def portable(self, hostname: str) -> dict[str, Any] | None:
        """What this rank contributes to jobs.summary.foreign_cpu_share (None: no complete window)."""
        if self.start is None or self.end is None:
            return None
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = sorted(self.start["busy_ticks"])
        # Grouped by kernel, not by host name: ranks that read the same /proc/stat share its cores,
        # even under different host names (containers, or the test cluster's namespaced nodes).
        return {"host": kernel_id() or hostname, "cpus": cpus, "ticks_per_s": clock_ticks_per_s(),
                "window_s": self.end["wall_s"] - self.start["wall_s"],
                "busy_ticks_delta": {c: self.end["busy_ticks"].get(c, 0) - self.start["busy_ticks"].get(c, 0)
                                     for c in self.start["busy_ticks"]},
                "own_cpu_delta_s": self.end["own_cpu_s"] - self.start["own_cpu_s"]}


# ---- GPU -----------------------------------------------------------------------------------

def load_nvml():
    """(the pynvml module, initialised) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py): GPU interference not measured"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no permission
        return None, f"NVML could not start ({exc}): GPU interference not measured"
    return pynvml, None


class GpuSampler:
    """Samples NVML on a daemon thread while the measured window is open.

    The thread wakes every ``interval_s`` and holds the GIL only to record a few numbers (the NVML
    calls go through ctypes, which releases it), so the step path sees no sync point and a cost
    of microseconds per sample. ``nvml``: the pynvml module or an object with the same four
    functions (tests/test_interference.py uses a stateful fake).
    """

    def __init__(self, nvml, device_uuid: str, pid: int | None = None, interval_s: float = 0.1,
                 fallback_index: int = 0) -> None:
        from jobs.dist import nvml_uuid

        self.nvml, self.pid, self.interval_s = nvml, pid or os.getpid(), interval_s
        uuid = nvml_uuid(device_uuid)
        self.handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
        # The device's NVML index names its system metrics (the same on every rank that shares the
        # node, whatever CUDA_VISIBLE_DEVICES each sees); ``fallback_index`` where NVML will not say.
        try:
            self.device_index = int(nvml.nvmlDeviceGetIndex(self.handle))
        except Exception:  # an NVML without the call, or refusing it
            self.device_index = fallback_index
        self.samples: list[dict[str, Any]] = []
        # Readings NVML refused on this device: {what: why}; not asked again (stateful on purpose:
        # a NotSupported answer does not change within a window).
        self.unsupported: dict[str, str] = {}
        self.energy_mj: dict[str, int | None] = {"start": None, "end": None}
        self.window_t_s: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _optional(self, what: str, function: str):
        """``nvml.<function>(handle)``, or None once NVML has refused it (reason kept)."""
        if what in self.unsupported:
            return None
        try:
            return getattr(self.nvml, function)(self.handle)
        except Exception as exc:  # NVMLError_NotSupported, NoPermission; a library without it
            self.unsupported[what] = f"{function}: {type(exc).__name__}: {exc}"[:200]
            return None

    def sample(self) -> None:
        t_s, unix_s = time.monotonic(), time.time()
        pids = [p.pid for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)]
        if self.pid in pids:
            others = len(pids) - pids.count(self.pid)
        else:
            # In a container NVML reports host pids, so ours does not appear: one of the listed
            # processes is still this one (it holds a context on the device since the model was built).
            others = max(0, len(pids) - 1)
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
        power_mw = self._optional("power", "nvmlDeviceGetPowerUsage")
        memory = self._optional("memory", "nvmlDeviceGetMemoryInfo")
        self.samples.append({"others": float(others), "util_share": util / 100.0, "t_s": t_s, "unix_s": unix_s,
                             "util_percent": float(util),
                             "power_w": None if power_mw is None else power_mw / 1e3,
                             "mem_used_gib": None if memory is None else memory.used / GIB})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a failing NVML read must not fail the benchmark
                return

    def event(self, name: str) -> None:
        if name == "start" and self._thread is None:
            self.samples = []
            self.window_t_s = {"start": time.monotonic()}
            self.energy_mj = {"start": self._optional("energy", "nvmlDeviceGetTotalEnergyConsumption"), "end": None}
            self.sample()
            self._thread = threading.Thread(target=self._run, name="gpu-interference", daemon=True)
            self._thread.start()
        elif name == "end" and self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            self._thread = None
            self._stop = threading.Event()
            # A last sample at the boundary: power samples then span the whole window.
            try:
                self.sample()
            except Exception:
                pass
            self.energy_mj["end"] = self._optional("energy", "nvmlDeviceGetTotalEnergyConsumption")
            self.window_t_s["end"] = time.monotonic()

    def figures(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {FOREIGN_GPU_SHARE: sum(1 for s in self.samples if s["others"] > 0) / len(self.samples),
                GPU_UTIL_MEAN: sum(s["util_share"] for s in self.samples) / len(self.samples)}

    def energy(self) -> dict[str, Any]:
        """This device's joules over the window: ``{"energy_j", "window_s", "method"}`` or
        ``{"missing": why}``. The total-energy counter first (Volta and later: exact, and not an
        average NVML smooths over about a second, which nvmlDeviceGetPowerUsage is on recent GPUs);
        else the power samples integrated over their times (trapezoid rule; the window's
        boundary samples make them span it)."""
        if "end" not in self.window_t_s:
            return {"missing": "no complete measured window"}
        joules = energy.energy_from_counter_j(self.energy_mj["start"], self.energy_mj["end"])
        if joules is not None:
            return {ENERGY_J: joules, "window_s": self.window_t_s["end"] - self.window_t_s["start"],
                    "method": "nvml_energy_counter"}
        powered = [s for s in self.samples if s.get("power_w") is not None]
        joules = energy.energy_from_power_j([s["t_s"] for s in powered], [s["power_w"] for s in powered])
        if joules is not None:
            return {ENERGY_J: joules, "window_s": powered[-1]["t_s"] - powered[0]["t_s"],
                    "method": "nvml_power_samples"}
        why = "; ".join(self.unsupported.get(k, "") for k in ("energy", "power") if k in self.unsupported)
        return {"missing": why or f"{len(powered)} power sample(s): too few to integrate"}

    def series(self, node_id: int, device_index: int | None = None) -> dict[str, Any]:
        """Utilisation, memory and power over the window, thinned (jobs.energy.thin), for rank 0's
        system metrics: ``{"node_id", "device_index", "samples": [...], "unsupported": {...}}``;
        ``device_index``: the NVML index unless given."""
        keep = ("unix_s", "util_percent", "mem_used_gib", "power_w")
        index = self.device_index if device_index is None else device_index
        return {"node_id": node_id, "device_index": index, "unsupported": dict(self.unsupported),
                "samples": [{k: s.get(k) for k in keep} for s in energy.thin(self.samples)]}


class Interference:
    """The window hook the worker chains before the caller's: CPU always, GPU when NVML is there."""

    def __init__(self, device, make_nvml: Callable[[], Any] = load_nvml) -> None:
        self.cpu = CpuWindow()
        self.gpu: GpuSampler | None = None
        self.missing: str | None = None
        if getattr(device, "type", "cpu") == "cuda":
            nvml, why = make_nvml()
            if nvml is None:
                self.missing = why
            else:
                from jobs.dist import gpu_uuid

                try:
                    self.gpu = GpuSampler(nvml, gpu_uuid(device), fallback_index=device.index or 0)
                except Exception as exc:
                    self.missing = f"NVML has no handle for this device ({exc}): GPU interference not measured"

    def event(self, name: str) -> None:
        self.cpu.event(name)
        if self.gpu is not None:
            self.gpu.event(name)

    def portable(self, hostname: str, node_id: int = 0) -> dict[str, Any]:
        """What this rank contributes to the gather after the window. ``gpu_energy`` and
        ``gpu_series`` (named by the device's NVML index) are None without a GPU sampler (CPU
        ranks, no NVML)."""
        return {"cpu_window": self.cpu.portable(hostname), "gpu": self.gpu.figures() if self.gpu else {},
                "gpu_energy": self.gpu.energy() if self.gpu else None,
                "gpu_series": self.gpu.series(node_id) if self.gpu else None}
