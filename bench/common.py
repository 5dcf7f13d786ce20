"""Shared pieces of the suite: result rows, statistics, subprocesses, the machine description."""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# torchrun is the console script installed beside this interpreter (the venv's).
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))


@dataclass
class Row:
    """One line of the results table: a figure measured for us and for the reference."""

    figure: str
    unit: str
    ours: list[float]
    reference: list[float]
    target: str  # e.g. ">= 0.98" (ratio ours/reference), "<= 1.3", or a yes/no check
    passed: bool | None
    ratio: float | None = None
    note: str = ""
    # (low, high) of the ratio's 95% confidence interval, where one was computed (figure 1).
    ratio_ci: tuple[float, float] | None = None
    # Replaces pass/FAIL in the table when the data cannot decide ("inconclusive").
    verdict: str | None = None

    @property
    def ours_median(self) -> float | None:
        return statistics.median(self.ours) if self.ours else None

    @property
    def reference_median(self) -> float | None:
        return statistics.median(self.reference) if self.reference else None


def ratio_of_medians(ours: Sequence[float], reference: Sequence[float]) -> float | None:
    if not ours or not reference or statistics.median(reference) == 0:
        return None
    return statistics.median(ours) / statistics.median(reference)


# Two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table).
_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
          10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
          19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052,
          28: 2.048, 29: 2.045, 30: 2.042}


def t_975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, beyond it the normal
    quantile with two Cornish-Fisher terms (within 0.001 of the exact value there)."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 values (1 degree of freedom)")
    if df in _T_975:
        return _T_975[df]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def pair_ratio_ci(ours: Sequence[float], reference: Sequence[float]
                  ) -> tuple[float | None, tuple[float, float] | None]:
    """(median of the per-pair ratios ours_i / reference_i, 95% interval or None).

    Pairs are the runs of one ABBA block (run i of each side), so drift of a shared machine
    between blocks cancels within each ratio. The interval is Student's t on the log ratios,
    exponentiated: it covers the geometric mean ratio, which for the roughly symmetric log
    ratios seen here is close to the median (reported as the point). It assumes the pairs are
    independent and their log ratios roughly normal; with few pairs it is wide, and it should be:
    t with n-1 degrees of freedom widens it for small n (n=4: +-3.18 standard errors). With one
    pair there is no interval.
    """
    ratios = [o / r for o, r in zip(ours, reference, strict=True) if r > 0 and o > 0]
    if not ratios:
        return None, None
    median = statistics.median(ratios)
    if len(ratios) < 2:
        return median, None
    logs = [math.log(x) for x in ratios]
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return median, (math.exp(mean - half), math.exp(mean + half))


def ratio_verdict(median: float | None, ci: tuple[float, float] | None, at_least: float
                  ) -> tuple[bool | None, str | None]:
    """(passed, verdict) for a "ratio >= at_least" target: pass when the whole interval is at or
    above the target, FAIL when it is wholly below, "inconclusive" when it spans the target (the
    runs cannot tell). Without an interval (one pair) the median decides, as before."""
    if median is None:
        return None, None
    if ci is None:
        return median >= at_least, None
    if ci[0] >= at_least:
        return True, None
    if ci[1] < at_least:
        return False, None
    return None, "inconclusive"


def fmt_values(values: Sequence[float], digits: int = 3) -> str:
    """``median [min-max] (n)``: the spread is the full range of the repeats."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}g}"
    return f"{med:.{digits}g} [{min(values):.{digits}g}-{max(values):.{digits}g}] (n={len(values)})"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def fmt_ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:.3f}-{ci[1]:.3f}]"


def fmt_pass(passed: bool | None, target: str = "", verdict: str | None = None) -> str:
    if verdict:
        return verdict
    if passed is None and target == "(info)":
        return "-"
    return {True: "pass", False: "FAIL", None: "skipped"}[passed]


def render_table(rows: Sequence[Row]) -> str:
    lines = ["| figure | unit | ours: median [min-max] | reference: median [min-max] | ratio | target | result |",
             "|---|---|---|---|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r.figure} | {r.unit} | {fmt_values(r.ours)} | {fmt_values(r.reference)} | "
                     f"{fmt_ratio(r.ratio)}{fmt_ci(r.ratio_ci)} | {r.target} | {fmt_pass(r.passed, r.target, r.verdict)} |")
    return "\n".join(lines)


def bench_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every measured process gets: the same threads per rank on both sides."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONWARNINGS="ignore::FutureWarning")
    env.update(extra or {})
    return env


@dataclass
class Proc:
    returncode: int
    start_unix_s: float
    end_unix_s: float
    log: Path
    # Share of all CPU time the hypervisor gave to other guests while the run ran (/proc/stat
    # "steal"): a slow run with a high share was slowed from outside this VM.
    steal_share: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


def run_logged(cmd: Sequence[str], log: Path, env: dict[str, str], timeout_s: float = 600,
               cwd: Path = REPO, check: bool = True) -> Proc:
    """Run ``cmd`` to completion, output to ``log``; the start time is taken right before the spawn."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        steal_before = _steal_jiffies()
        start = time.time()
        proc = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout_s)
        end = time.time()
        steal_after = _steal_jiffies()
    if check and proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; last lines of {log}:\n{tail}")
    steal_share = (steal_after[0] - steal_before[0]) / max(1, steal_after[1] - steal_before[1])
    return Proc(proc.returncode, start, end, log, steal_share)


def stop_group(proc: subprocess.Popen, signals: Sequence[tuple[int, float]]) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): each signal in
    turn, waiting that many seconds for it to end, until it has."""
    for sig, wait_s in signals:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def read_result(path: Path, proc: Proc) -> str:
    """The JSON a run wrote, whatever its exit status.

    gloo sometimes aborts a rank at exit, after its results are written ("terminate called
    without an active exception", SIGABRT, ~2 launches in 60 on these machines): a run whose
    result file exists counts; a run without one is an error, reported with its log.
    """
    if not path.exists():
        tail = "\n".join(proc.log.read_text().splitlines()[-25:])
        raise RuntimeError(f"no {path} (exit status {proc.returncode}); last lines of {proc.log}:\n{tail}")
    return path.read_text()


def _cpu_fields() -> list[int]:
    """/proc/stat's first line: jiffies over all CPUs since boot (user nice system idle iowait irq
    softirq steal ...)."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot."""
    fields = _cpu_fields()
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _steal_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies over all CPUs since boot; (0, 0) where /proc/stat has no steal."""
    try:
        fields = _cpu_fields()
        return (fields[7] if len(fields) > 7 else 0), sum(fields)
    except (OSError, ValueError, IndexError):
        return 0, 0


def busy_cores(interval_s: float = 0.5) -> float:
    """How many cores other processes kept busy over the last ``interval_s`` (0 when unknown)."""
    try:
        b0, t0 = _cpu_jiffies()
        time.sleep(interval_s)
        b1, t1 = _cpu_jiffies()
    except (OSError, ValueError, IndexError):
        return 0.0
    return (os.cpu_count() or 1) * (b1 - b0) / max(1, t1 - t0)


# Other processes may use this much of a core before a measured run starts.
QUIET_BUSY_CORES = 0.3


def wait_for_quiet(max_wait_s: float, log: Callable[[str], None] | None = None) -> float:
    """Wait (up to ``max_wait_s``) until other processes leave the cores nearly idle.

    On a shared machine another user's job can take a core for seconds, which moves a run by tens
    of percent; both sides of every comparison wait the same way. Returns the busy cores measured
    last (recorded beside each run); gives up quietly after ``max_wait_s``.
    """
    deadline = time.monotonic() + max_wait_s
    busy = busy_cores()
    waited = False
    while busy > QUIET_BUSY_CORES and time.monotonic() < deadline:
        waited = True
        time.sleep(0.5)
        busy = busy_cores()
    if waited and log:
        log(f"    (waited for a quiet machine: {busy:.2f} cores busy at start)")
    return busy


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(torch_version: str, device: str) -> dict[str, str]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch_version,
        "device": device,
        "os": f"{platform.system()} {platform.release()}",
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in load),
        "slurm": _slurm_version(),
    }


def _slurm_version() -> str:
    if not shutil.which("sbatch"):
        return "-"
    try:
        return subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "-"


@dataclass
class Settings:
    """What both sides of every training comparison run: one place, so they cannot drift apart."""

    nproc: int = 2
    threads: int = 1
    model: str = "gpt_tiny"
    seq_len: int = 128
    vocab_size: int = 4096
    batch_size: int = 8
    steps: int = 60
    warmup_steps: int = 10
    repeats: int = 3
    quick: bool = False
    quiet_wait_s: float = 60.0  # per measured run, at most, for other processes to leave the cores
    pin: bool = False  # pin each rank to its own cores in the throughput runs (bench/pin_rank.sh)
    work: Path = field(default_factory=lambda: REPO / "outputs" / "bench")

    def train_args(self, steps: int | None = None, warmup_steps: int | None = None) -> list[str]:
        return ["--model", self.model, "--seq-len", str(self.seq_len), "--vocab-size", str(self.vocab_size),
                "--batch-size", str(self.batch_size), "--steps", str(steps or self.steps),
                "--warmup-steps", str(self.warmup_steps if warmup_steps is None else warmup_steps)]
