"""The GPU acceptance check (``scripts/gpu-check``), second edition: parts in priority order, each
with its own time budget (compilation included), each writing its results before the next starts,
so that a check cut off at any moment leaves what it has measured. Nine minutes in all.

    scripts/gpu-check --record-tree           # here, before the tree is carried to the node
    scripts/gpu-check                         # on the GPU node, with the site's python3 and torch
    GPU_CHECK_OUT=/tmp/out scripts/gpu-check --only environment,gpt2
    scripts/gpu-check --cpu                   # the rehearsal: the same parts with CPU settings

Parts (budgets in PARTS, 540 s in all, compilation included; a part ends at its budget or at the check's, whichever comes
first; ``--budget PART=S`` changes one, ``--only`` runs some, ``--tests-k`` reruns some tests,
``--worker-set PATH=JSON`` adds a worker setting):

1. environment: device, capability, memory, driver, CUDA, NCCL, NVML, TF32 settings;
2. install: the offline bundle (``scripts/offline-bundle``) with no index, the site's torch kept;
3. tests: ``pytest -m gpu tests/test_gpu.py -k energy``: the job's energy and system metrics;
4. gpt2: bench/tuned.py for GPT-2 small (32 x 1024 tokens, bf16): the tuned bare loop, the worker's
   DDP and the worker's FSDP alternating in one job at one rank; then the step's anatomy at one rank
   on NCCL (jobs.anatomy.probe) and the fabric probe's collective timing at one rank;
5. resnet50: the same for ResNet-50 (256 images of 224 x 224, bf16);
6. cells: the worker through the launcher (``tracking=off``), one run per model x {DDP, FSDP} in
   bf16: the user's path, its report, energy, and the peak memory the next part reads;
7. memory: the launcher's fit check (its plan) against each cell's measured ``max_memory_allocated``;
8. resnet50-fp16: part 5 in fp16;
9. gpt2-fp16 (beyond the nine minutes: only when its budget is left, or named by ``--only``): part 4 in fp16.

The worker is driven with every tuning setting explicit (bench/tuning.py), each only where this
tree's RunSpec has it; each part lists what it set and what it could not. What it writes into
``GPU_CHECK_OUT`` (default ``outputs/gpu-check``), at most 8 files, each rewritten whole after every
part: ``BENCH_RESULTS_GPU.md`` (the tree that ran, the targets with PASS/FAIL and the figure
measured, the parts and their figures), ``gpu-check.json`` (the same, for programs),
``sweeps.tar.gz`` (the cells' sweep directories), and the logs ``setup.log``, ``tests.log``,
``tuned.log`` and ``sweeps.log``. Runs with the standard library alone (and contract/, jobs.peaks):
the parts' own processes bring the rest. Afterwards, on a machine with MLflow: ``tar xzf
sweeps.tar.gz`` and ``python -m launcher.sync <sweep dir> --tracking-uri URI``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import tuning
from bench.common import stop_group

PROGRESS_PREFIX = "tuned.py progress: "  # bench/tuned.py's line (the check's process has no torch to import it)

REPO = Path(__file__).resolve().parent.parent
# The sum of the default parts' budgets (PARTS): one device call of at most 600 s, inside 900 s of device
# time that include the machine's start, with room for the call's own start and the files' way back.
TOTAL_BUDGET_S = 500.0
# The rehearsal (--cpu) adds the compile census, about two minutes on 2 cores.
CPU_BUDGET_S = 700.0
# A part past its budget gets SIGINT (pytest and the launcher then write what they have), and
# SIGKILL this much later.
GRACE_S = 8.0
# The files a part's tarball leaves out: checkpoints and profiler traces are large and not results.
TAR_EXCLUDE = re.compile(r"(^|/)(checkpoints?|traces?)(/|$)|\.(pt|distcp|trace\.json|pkl)$")
# The tree's identity, recorded where git is (``--record-tree``) for a node that gets the working
# tree without .git: travels as an untracked file, and is left out of what it describes.
TREE_RECORD = "gpu-check-tree.json"


@dataclass
class Outcome:
    part: str
    budget_s: float
    took_s: float = 0.0
    verdict: str = "not run"
    figures: str = ""
    details: list[str] = field(default_factory=list)


@dataclass
class Check:
    out: Path
    python: str
    cpu: bool
    deadline: float
    env: dict[str, str]
    work: Path
    outcomes: list[Outcome] = field(default_factory=list)
    sweeps: dict[str, Path] = field(default_factory=dict)
    tests_k: str | None = None  # one pytest -k expression instead of TEST_GROUPS (a rerun of some tests)
    worker_set: list[str] = field(default_factory=list)  # PATH=JSON worker settings on top of bench/tuning.py's
    variants: list[str] = field(default_factory=list)  # bench/tuned.py's --variant: more worker sides in the tuned parts
    # What the parts measured, for the targets: "model precision" -> bench/tuned.py's config and the cells' rows.
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    cells: list[dict[str, Any]] = field(default_factory=list)
    device: str = ""
    started: str = ""  # when the check started, and the tree that ran: the head of its files
    tree: str = ""

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, name: str) -> Path:
        return self.out / name


# ---- running a part's processes ---------------------------------------------------------------

# While a part runs, its figures so far are written into the check's files this often: a call cut
# off mid-part (the device tool's limit kills the check itself) still brings them back. Shorter than
# a side's build and rounds (seconds even on CPU), so each side's figures land before the next ends.
PROGRESS_EVERY_S = 2.0


def run_logged(check: Check, cmd: list[str], log_name: str, budget_s: float,
               on_progress: Callable[[str], None] | None = None) -> tuple[int | None, str]:
    """Runs ``cmd`` in its own process group, its output appended to the log; past ``budget_s``
    SIGINT, then SIGKILL. ``on_progress(output so far)`` every :data:`PROGRESS_EVERY_S` while it runs.
    Returns (exit status, or None when it was stopped; the output)."""
    log = check.log(log_name)
    start = log.stat().st_size if log.exists() else 0

    def output() -> str:
        with log.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    with log.open("ab") as sink:
        sink.write(f"\n$ {shlex.join(cmd)}\n".encode())
        sink.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=check.env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        end = time.monotonic() + max(budget_s, 1.0)
        rc: int | None = None
        while rc is None and time.monotonic() < end:
            try:
                rc = proc.wait(timeout=max(0.01, min(PROGRESS_EVERY_S if on_progress else float("inf"),
                                                     end - time.monotonic())))
            except subprocess.TimeoutExpired:
                if on_progress is not None:
                    on_progress(output())
        if rc is None:
            stop_group(proc, ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 5.0)))
            sink.write(f"\n[gpu-check: stopped at its budget of {budget_s:.0f} s]\n".encode())
    return rc, output()


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


def tail(text: str, lines: int = 12) -> list[str]:
    return ["```", *text.rstrip().splitlines()[-lines:], "```"]


# ---- 1. environment ---------------------------------------------------------------------------

ENV_PROBE = r"""
import json, os, platform, sys
import torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cpus": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                memory_gib=round(p.total_memory / 2**30, 1), multiprocessors=p.multi_processor_count,
                gpus=torch.cuda.device_count(), nccl=".".join(map(str, torch.cuda.nccl.version())),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                float32_matmul_precision=torch.get_float32_matmul_precision(),
                cudnn=torch.backends.cudnn.version())
    try:
        import pynvml
        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["nvml"] = "nvidia-ml-py " + getattr(pynvml, "__version__", "?")
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
    except Exception as exc:
        info["nvml"] = f"unavailable: {type(exc).__name__}: {exc}"
print(json.dumps(info))
"""


def environment(check: Check, budget_s: float) -> tuple[str, str, list[str]]:
    rc, text = run_logged(check, [check.python, "-c", ENV_PROBE], "setup.log", budget_s)
    info = last_json(text)
    if rc != 0 or not info:
        return "FAIL", "no environment", tail(text)
    if not info["cuda_available"] and not check.cpu:
        return "FAIL", f"torch {info['torch']} sees no CUDA device", []
    check.device = info.get("device", "cpu")
    rows = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in info.items())]
    if info["cuda_available"]:
        figures = (f"{info['device']}, {info['memory_gib']} GiB, cc {info['capability']}, driver "
                   f"{info.get('driver', '?')}, torch {info['torch']}, CUDA {info['cuda']}, NCCL {info['nccl']}")
    else:
        figures = f"no CUDA (rehearsal on {info['cpus']} CPUs), torch {info['torch']}, Python {info['python']}"
    return "pass", figures, rows


# ---- 2. install -------------------------------------------------------------------------------

def install(check: Check, budget_s: float) -> tuple[str, str, list[str]]:
    present = [check.python, "-c", "import hydra, omegaconf, submitit"]
    if subprocess.run(present, env=check.env, capture_output=True).returncode == 0:
        return "pass", "hydra-core, omegaconf, submitit already importable: nothing installed", []
    bundle = os.environ.get("GPU_CHECK_BUNDLE", str(REPO / ".whl"))
    target = check.work / "site"
    t0 = time.monotonic()
    rc, text = run_logged(check, ["bash", str(REPO / "scripts" / "offline-install"), bundle, str(target)],
                          "setup.log", budget_s)
    if rc != 0:
        return "FAIL", f"offline-install exited {rc}", tail(text)
    # The checkout first: its code is what this check is about (the bundle's copy may be older).
    check.env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(target)])
    versions = [line.removeprefix("offline-install: ") for line in text.splitlines()
                if line.startswith("offline-install: ")]
    return "pass", f"{time.monotonic() - t0:.1f} s, no index; {versions[-1] if versions else ''}", []


# ---- 3. the GPU-marked tests ------------------------------------------------------------------

# The second edition keeps the energy test only (the NCCL matrix, resume and the rest passed on the
# first runs: `--tests-k` reruns any of them).
TEST_GROUPS = (("energy", "energy"),)


def gpu_tests(check: Check, budget_s: float) -> tuple[str, str, list[str]]:
    end = time.monotonic() + budget_s
    counts: dict[str, int] = {}
    details, stopped, failed = [], [], []
    for group, expr in ((("selected", check.tests_k),) if check.tests_k else TEST_GROUPS):
        left = end - time.monotonic()
        if left < 5:
            stopped.append(f"{group} (no time left)")
            continue
        cmd = [check.python, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-k", expr, "-rA", "-s",
               "-p", "no:cacheprovider", "-o", "addopts=", "--durations=5"]
        rc, text = run_logged(check, cmd, "tests.log", left)
        summary = _summary_line(text)
        if rc is None:
            stopped.append(f"{group} (stopped at the budget)")
        elif not summary:
            failed.append(f"{group}: pytest ended without a summary (exit {rc}): {text.strip().splitlines()[-1:]}")
        for outcome, n in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary):
            counts[n] = counts.get(n, 0) + int(outcome)
        failed += re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
        details += [f"**{group}** (`-k '{expr}'`): exit {rc if rc is not None else 'stopped'}: "
                    f"{summary or 'no summary'}", ""]
        details += _printed_figures(text)
    counts.pop("deselected", None)
    verdict = "FAIL" if failed or counts.get("error") or counts.get("errors") else (
        "partial" if stopped else ("skipped" if not counts.get("passed") else "pass"))
    figures = ", ".join(f"{n} {k}" for k, n in counts.items()) or (failed[0] if failed else "no test ran")
    figures += f"; {', '.join(stopped)}" if stopped else ""
    if failed:
        details += ["Failed:", *(f"- `{name}`" for name in failed)]
    return verdict, figures, details


def _summary_line(text: str) -> str:
    found = re.findall(r"^=+ (.*(?:passed|failed|skipped|error|deselected).*?) =+$", text, re.M)
    return found[-1] if found else ""


def _printed_figures(text: str) -> list[str]:
    """The lines the GPU tests print for this file (peaks, energy, annotations, timings)."""
    keep = re.compile(r"^(torch .* CUDA|measured matmul peak|energy .* J|GPU user annotations|BatchNorm units|"
                      r"user model first losses)")
    lines = [line for line in text.splitlines() if keep.match(line)]
    return ["```", *lines, "```", ""] if lines else []


# ---- 4, 5 and 8. the tuned reference beside the worker (bench/tuned.py) -----------------------

TUNED_PARTS = {"gpt2": ("gpt2-small", "bf16"), "resnet50": ("resnet50", "bf16"), "resnet50-fp16": ("resnet50", "fp16"),
               "gpt2-fp16": ("gpt2-small", "fp16")}
# The job stops its own work this much before the part's budget, so that it writes its figures
# itself rather than being stopped.
JOB_MARGIN_S = 5.0


def tuned_args(check: Check, part: str) -> list[str]:
    """bench/tuned.py's arguments for a part: the reported shapes on a GPU; tiny ones on CPU, which
    run the code path in seconds (no compilation there: bench/tuning.py)."""
    model, precision = TUNED_PARTS[part]
    gpt = model.startswith("gpt")
    if check.cpu:
        shape = (["--model", "gpt_tiny", "--seq-len", "64", "--vocab-size", "512", "--batch-size", "4"] if gpt
                 else ["--model", "cnn", "--image-size", "32", "--batch-size", "4"])
        timing = ["--rounds", "2", "--block-steps", "2", "--warmup-steps", "1", "--warmup-blocks", "1"]
    else:
        shape = (["--model", model, "--seq-len", str(tuning.GPT2_SEQ_LEN), "--vocab-size", "50257",
                  "--batch-size", str(tuning.GPT2_BATCH)] if gpt
                 else ["--model", model, "--image-size", "224", "--batch-size", str(tuning.RESNET50_BATCH)])
        # fp16: the GradScaler backs off from 65536 over its first steps, which stay in the warm-up.
        timing = ["--rounds", "4", "--block-s", "0.6", "--warmup-steps", "8" if precision == "fp16" else "4",
                  "--warmup-blocks", "2"]
    probes = ["--anatomy-steps", "1" if check.cpu else "3", "--fabric"] if part == "gpt2" else []
    return [*shape, *timing, "--profile-blocks", *probes, "--precisions", precision]


def tuned_part(check: Check, budget_s: float, part: str) -> tuple[str, str, list[str]]:
    out = check.work / f"tuned-{part}.json"
    out.unlink(missing_ok=True)
    cmd = [check.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           str(REPO / "bench" / "tuned.py"), *tuned_args(check, part), "--out", str(out),
           "--budget-s", f"{max(10.0, budget_s - JOB_MARGIN_S):.0f}",
           *(a for item in check.worker_set for a in ("--worker-set", item)),
           *(a for item in check.variants for a in ("--variant", item))]

    def progress(text: str) -> None:
        so_far = last_progress(text)
        if so_far.get("configs"):
            check.tuned[part] = part_config(so_far, part)
            write_results(check)

    rc, text = run_logged(check, cmd, "tuned.log", budget_s, on_progress=progress)
    result = _read_json(out) or last_progress(text)
    configs = result.get("configs") or []
    if not configs:
        return ("partial" if rc is None else "FAIL"), f"nothing measured ({'stopped' if rc is None else f'exit {rc}'})", \
            tail(text, 25)
    check.device = result.get("device", check.device)
    config = check.tuned[part] = part_config(result, part)
    figures = tuned_figures(config)
    errors = [f"{name}: {side['error'].splitlines()[0]}" for name, side in config["sides"].items() if "error" in side]
    skipped = [f"{name} skipped: {side['skipped']}" for name, side in config["sides"].items() if "skipped" in side]
    skipped += [f"rounds cut ({', '.join(f'{k}: {v}' for k, v in config['rounds_cut'].items())})"] \
        if isinstance(config.get("rounds_cut"), dict) else []
    measured = [n for n, f in figures.items() if f.get("throughput")]
    verdict = "FAIL" if errors or not measured else ("partial" if rc is None or len(measured) < len(config["sides"])
                                                    else "pass")
    unit = config["unit"]
    summary = "; ".join(f"{n} {f['throughput']:,.0f} {unit}/s" + (f" ({f['vs_tuned']:.3f}x tuned)" if f.get("vs_tuned") else "")
                        for n, f in figures.items() if f.get("throughput"))
    status = "stopped at its budget; " if rc is None else ("" if rc == 0 else f"exit {rc}; ")
    status += "".join(f"{line}; " for line in skipped)
    details = tuned_details(check, config, figures)
    if errors or rc not in (0, None):
        details += ["", "Errors and the job's last lines:", *(f"- {e}" for e in errors), *tail(text, 25)]
    return verdict, status + (summary or "; ".join(errors)), details


def part_config(result: dict[str, Any], part: str) -> dict[str, Any]:
    """The last precision of bench/tuned.py's result, with what the figures need from the job."""
    return {**result["configs"][-1], "model": result["model"], "device": result["device"], "part": part,
            "fabric": result.get("fabric")}


def last_progress(text: str) -> dict:
    """bench/tuned.py's last progress line in its output (a job stopped before it wrote its file)."""
    for line in reversed(text.splitlines()):
        if line.startswith(PROGRESS_PREFIX):
            try:
                return json.loads(line[len(PROGRESS_PREFIX):])
            except json.JSONDecodeError:
                continue
    return {}


def _round_ratios(config: dict[str, Any], reference: str, side: str) -> list[float]:
    """Per round that timed both, the reference's block time over the side's (neighbouring blocks)."""
    rounds = config.get("rounds")
    if rounds is None:  # a result of the first layout: each side's blocks, round by round
        pairs = list(zip(config["sides"].get(reference, {}).get("block_s") or [],
                         config["sides"].get(side, {}).get("block_s") or [], strict=False))
    else:
        pairs = [(r[reference], r[side]) for r in rounds if reference in r and side in r]
    return [a / b for a, b in pairs if b > 0]


def tuned_figures(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per side: throughput from its median block (in the config's unit per second), its range, MFU
    against the device's dense peak for the precision, and (worker sides) its speed relative to the
    tuned side and, for FSDP, to DDP: medians of the per-round ratios of neighbouring blocks."""
    from jobs.peaks import peak_flops_for

    per_step = config["samples_per_block_step"] * config.get("block_steps", 0)
    unit = config["unit_per_sample"]
    peak = peak_flops_for(config.get("device", ""), config["precision"]) if config.get("device") != "cpu" else None
    out: dict[str, dict[str, Any]] = {}
    for name, side in config["sides"].items():
        blocks = side.get("block_s") or []
        f: dict[str, Any] = {"blocks": len(blocks)}
        if not blocks and side.get("warmup_block_s"):
            # Built and warmed up, never timed in a round (the budget): its last warm-up block, said so.
            blocks, f["from_warmup"] = side["warmup_block_s"][-1:], True
        if blocks:
            samples_per_s = per_step / statistics.median(blocks)
            f.update(throughput=samples_per_s * unit, low=per_step / max(blocks) * unit,
                     high=per_step / min(blocks) * unit)
            if peak and config.get("flops_per_sample"):
                f["mfu"] = config["flops_per_sample"] * samples_per_s / peak
        if name != "tuned" and (ratios := _round_ratios(config, "tuned", name)):
            f.update(vs_tuned=statistics.median(ratios), vs_tuned_range=(min(ratios), max(ratios)))
        if side.get("strategy", name) == "fsdp" and (ratios := _round_ratios(config, "ddp", name)):
            f.update(vs_ddp=statistics.median(ratios), vs_ddp_range=(min(ratios), max(ratios)))
        if name == "tuned":
            f["compile_s"] = side.get("compile_s")
        elif "first_block_s" in side:
            # The first block holds the compilation; the rest of it is one ordinary block.
            f["compile_s"] = max(0.0, side["first_block_s"] - statistics.median(blocks)) if blocks else None
            f["build_s"] = side.get("build_s")
        out[name] = f
    return out


def _range(f: dict[str, Any], key: str) -> str:
    low, high = f[key]
    return f"{low:.3f}-{high:.3f}"


def tuned_details(check: Check, config: dict[str, Any], figures: dict[str, dict[str, Any]]) -> list[str]:
    unit, precision = config["unit"], config["precision"]
    lines = [f"**{config['model']}, {precision}, {config['samples_per_block_step']} samples per step"
             + (f" of {config['unit_per_sample']} tokens" if unit == "tokens" else "")
             + f", {config['device']}, one rank**: blocks of {config.get('block_steps', '?')} steps, each side timed as "
             "soon as it was built, in rounds with every side built before it (tuned; tuned, ddp; tuned, ddp, fsdp), "
             "the order reversed every other round; a block starts on an idle device and ends with one "
             "synchronisation (a worker side's block is its schedule's measured window, as the worker's own "
             "figures are: its start around the window is not in it). Ratios are medians of the per-round ratios of neighbouring blocks (time of the "
             "reference block / time of this side's), with their range.", "",
             f"| side | {unit}/s (median block; range) | MFU ({precision} dense peak) | vs tuned | FSDP / DDP "
             "| compile s (outside the blocks) |", "|---|---|---:|---|---|---:|"]
    for name, f in figures.items():
        if not f.get("throughput"):
            lines.append(f"| {name} | not measured | - | - | - | - |")
            continue
        said = "its last warm-up block: never timed in a round" if f.get("from_warmup") else f"{f['blocks']} blocks"
        lines.append(f"| {name} | {f['throughput']:,.0f} ({f['low']:,.0f}-{f['high']:,.0f}; {said}) | "
                     f"{_pct(f.get('mfu'))} | "
                     + (f"{f['vs_tuned']:.3f} ({_range(f, 'vs_tuned_range')})" if "vs_tuned" in f else "-") + " | "
                     + (f"{f['vs_ddp']:.3f} ({_range(f, 'vs_ddp_range')})" if "vs_ddp" in f else "-") + " | "
                     + (f"{f['compile_s']:.1f}" if f.get("compile_s") is not None else "-") + " |")
    tuned = figures.get("tuned", {}).get("throughput")
    published = tuning.PUBLISHED.get((config["model"], precision), [])
    if published and tuned:
        lines += ["", "| the tuned loop against a published figure | published | tuned / published |", "|---|---:|---:|"]
        for source, low, high, punit in published:
            value = f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"
            ratio = f"{tuned / low:.2f}" if low == high else f"{tuned / high:.2f}-{tuned / low:.2f}"
            lines.append(f"| {source} | {value} {punit} | {ratio} |")
    caches = {n: s["inductor_cache"] for n, s in config["sides"].items() if s.get("inductor_cache")}
    if caches:
        lines += ["", "Inductor's FX-graph cache while each side compiled (hits: graphs found compiled, by an "
                  "earlier side or a carried cache; misses: compiled anew): "
                  + "; ".join(f"{n} {c['hits']} hits, {c['misses']} misses" for n, c in caches.items()) + "."]
    for name, side in config["sides"].items():
        if name == "tuned":
            lines += ["", f"- tuned: compile {side.get('compile')}, {side.get('optimizer')}, channels-last "
                      f"{side.get('channels_last')}, vocabulary {side.get('vocab_size') or '-'}, loss "
                      f"{side.get('loss', '-')}"]
            if "loss_fallback" in side:
                lines.append(f"  - {side['loss_fallback'].splitlines()[0]}; the compiled plain cross-entropy ran instead")
        else:
            lines.append(f"- {name}: set {tuning.describe(side.get('settings_set', {}))}; not in this tree's spec: "
                         f"{', '.join(side.get('settings_not_in_spec', [])) or 'none'}"
                         + "".join(f"; REFUSED and left out: {r}" for r in side.get("settings_refused", [])))
    lines += profile_lines(config) + anatomy_lines(config) + fabric_lines(config.get("fabric"))
    return lines


def profile_lines(config: dict[str, Any]) -> list[str]:
    """bench/blockprofile.py's block of each side: whether its device or its host sets its pace."""
    probes = {n: s["profile"] for n, s in config["sides"].items() if "profile" in s}
    if not probes:
        return []
    lines = ["", "**One block of each side under the profiler** (bench/blockprofile.py; the profiler slows the "
             "host, so these compare sides, the throughput is the blocks' above), ms per step: a device busy "
             "well under the wall time, with the host's queue time near it, is a side its host holds back.", "",
             "| side | wall | host queue | device busy | device idle | kernels per step |", "|---|---:|---:|---:|---:|---:|"]
    tops: list[str] = []
    for name, f in probes.items():
        if isinstance(f, str):
            lines.append(f"| {name} | {f.splitlines()[0]} | | | | |")
            continue
        busy = f.get("device_busy_ms")
        idle = f"{100 * (1 - busy / f['wall_ms']):.0f}%" if busy is not None and f["wall_ms"] else "-"
        lines.append(f"| {name} | {f['wall_ms']:.2f} | {f['host_queue_ms']:.2f} | {_fmt2(busy)} | {idle} | "
                     f"{_fmt(f.get('device_kernels'))} |")
        for label, key in (("kernels", "top_kernels_ms"), ("host operations (self time)", "top_host_ms")):
            if f.get(key):
                tops.append(f"- {name}, {label}: " + "; ".join(f"`{n[:60]}` {ms:.2f}" for n, ms in f[key][:5]))
    return lines + [""] + tops if tops else lines


def _fmt2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


ANATOMY_PARTS = ("data_wait", "forward", "backward", "optimizer", "copies", "unattributed")


def anatomy_lines(config: dict[str, Any]) -> list[str]:
    probes = {n: s["anatomy"] for n, s in config["sides"].items() if "anatomy" in s}
    if not probes:
        return []
    lines = ["", "**The step's anatomy at one rank** (jobs.anatomy.probe, profiled steps after the blocks), ms per step:",
             "", "| side | step | " + " | ".join(ANATOMY_PARTS) + " | communication exposed | communication in flight |",
             "|---|" + "---:|" * (len(ANATOMY_PARTS) + 3)]
    for name, figures in probes.items():
        if isinstance(figures, str):
            lines.append(f"| {name} | failed: {figures.splitlines()[0]} |")
            continue
        exposed = sum(v for k, v in figures.items() if k.startswith("comm_") and k.endswith("_exposed_ms")
                      and k != "comm_exposed_ms")
        lines.append(f"| {name} | {figures.get('anatomy_step_time_ms', 0):.2f} | "
                     + " | ".join(f"{figures.get(f'anatomy_{p}_ms', 0):.2f}" for p in ANATOMY_PARTS)
                     + f" | {exposed:.2f} | {figures.get('comm_time_ms', 0):.2f} |")
    return lines


def fabric_lines(fabric: dict[str, Any] | None) -> list[str]:
    if not fabric:
        return []
    lines = ["", f"**The fabric probe's timing at one rank** (jobs.fabric.time_collective, backend "
             f"{fabric.get('backend', '?')}): what one call costs where there is no peer.", "",
             "| collective | bytes | us per call | algbw GB/s |", "|---|---:|---:|---:|"]
    lines += [f"| {p['collective']} | {p['size_bytes']:,} | {p['time_us']:.1f} | {p['algbw_gbps']:.2f} |"
              for p in fabric.get("points", [])]
    if "error" in fabric:
        lines.append(f"\nfailed: {fabric['error'].splitlines()[0]}")
    return lines


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# ---- 6. cells: the worker through the launcher ------------------------------------------------

# The default call runs one cell, the user's path for the configuration the targets name first; the
# others only when asked (--only cells-more).
CELL_ORDER = (("gpt2-small", "ddp"),)
MORE_CELLS = (("resnet50", "ddp"), ("gpt2-small", "fsdp"), ("resnet50", "fsdp"))
# The rehearsal runs the same path with each model and each strategy once.
CPU_CELL_ORDER = (("gpt2-small", "ddp"), ("resnet50", "fsdp"))


def cell_settings(check: Check, model: str, strategy: str) -> tuple[list[str], dict[str, Any], list[str]]:
    """(the launcher's settings for one cell, the tuning settings it carries, those this tree lacks)."""
    known, unknown = split_worker_settings(check, model, strategy)
    common = [f"strategy={strategy}", "precision=bf16", "runs=1", "local_probe_steps=0", "comm_probe_steps=3"]
    if check.cpu:
        shape = (["model=gpt_tiny", "batch_size=4"] if model.startswith("gpt") else ["model=cnn", "batch_size=4"])
        shape += ["steps=8", "warmup_steps=3", "repeats=1"]
    else:
        shape = (["model=gpt2-small", f"model.seq_len={tuning.GPT2_SEQ_LEN}", f"batch_size={tuning.GPT2_BATCH}"]
                 if model.startswith("gpt") else ["model=resnet50", f"batch_size={tuning.RESNET50_BATCH}"])
        shape += ["cluster.gpus_per_node=1", "cluster.tasks_per_node=1", "steps=30", "warmup_steps=10", "repeats=2"]
    return [*shape, *common, *(tuning.launcher_override(k, v) for k, v in known.items())], known, unknown


def refusal(log_lines: list[str], known: dict[str, Any]) -> list[str]:
    """[the tuning key, the launcher's sentence] when the launcher refused one of ``known``, else []."""
    for line in log_lines:
        found = re.search(r"\] ([\w.]+)=[^:]*: .*Fix: .*", line)
        key = found and tuning.refused_key(found.group(1), known)
        if found and key:
            return [key, found.group(0)[2:]]
    return []


def split_worker_settings(check: Check, model: str, strategy: str) -> tuple[dict[str, Any], list[str]]:
    wanted = tuning.worker_tuning(model, strategy, cuda=not check.cpu)
    wanted.update({k: json.loads(v) for k, v in (item.split("=", 1) for item in check.worker_set)})
    return tuning.split_known(wanted)


def run_sweep(check: Check, name: str, settings: list[str], budget_s: float) -> tuple[str, list[dict], list[str]]:
    root = check.work / "sweeps"
    before = set(root.glob("*")) if root.exists() else set()
    cmd = [check.python, "-m", "launcher", "-m", *settings, "tracking=off", f"output_root={root}"]
    rc, text = run_logged(check, cmd, "sweeps.log", budget_s)
    made = sorted(set(root.glob("*")) - before)
    if made:
        check.sweeps[name] = made[-1]
    rows = cell_rows(made[-1]) if made else []
    status = "stopped" if rc is None else f"exit {rc}"
    return status, rows, tail(text, 15)


def cell_rows(sweep: Path) -> list[dict]:
    """One row per finished cell: its settings, its summary, and the error of a failed one."""
    rows = []
    for cell in sorted((sweep / "cells").glob("*")):
        spec = _read_json(cell / "spec.json")
        result = _read_json(cell / "result.json")
        row = {"cell": spec.get("cell", cell.name), "dir": cell, "spec": spec,
               "summary": result.get("summary", {}), "tags": result.get("tags", {})}
        errors = sorted(cell.glob("error-rank*.txt"))
        if errors:
            row["error"] = errors[0].read_text(errors="replace").strip().splitlines()[-1:]
        rows.append(row)
    return rows


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def cells(check: Check, budget_s: float, order: tuple[tuple[str, str], ...] | None = None) -> tuple[str, str, list[str]]:
    end = time.monotonic() + budget_s
    table = ["| cell | samples/s | tokens/s | MFU (denominator) | peak memory GiB | J/sample | mean W | compile s | "
             "anatomy step ms |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    notes, failures, stopped, done = [], [], [], 0
    order = order or (CPU_CELL_ORDER if check.cpu else CELL_ORDER)
    for model, strategy in order:
        name = f"{model}-{strategy}"
        left = end - time.monotonic()
        if left < 10:
            stopped.append(f"{name} (no time left)")
            continue
        settings, known, unknown = cell_settings(check, model, strategy)
        status, rows, log_tail = run_sweep(check, name, settings, left)
        refused = [] if rows else refusal(log_tail, known)
        if refused:
            # The launcher refused one of the tuning settings before creating anything: the cell runs
            # again without it, and the refusal is reported.
            settings = [s for s in settings if s != tuning.launcher_override(refused[0], known.pop(refused[0]))]
            status, rows, log_tail = run_sweep(check, name, settings, end - time.monotonic())
        notes.append(f"- {name}: set {tuning.describe(known)}; not in this tree's spec: {', '.join(unknown) or 'none'}"
                     + (f"; REFUSED and left out: {refused[0]} ({refused[1]})" if refused else ""))
        for row in rows:
            s, tags = row["summary"], row["tags"]
            check.cells.append({"name": name, "cell": row["cell"], "summary": s, "tags": tags})
            if "error" in row:
                failures.append(f"- {row['cell']}: {' '.join(row['error'])}")
                continue
            if not s.get("throughput_samples_per_s"):
                continue
            done += 1
            denominator = f"{tags.get('peak_flops_math', '-')}, {_fmt((s.get('peak_flops_per_s') or 0) / 1e12)} TFLOP/s" \
                if s.get("peak_flops_per_s") else tags.get("mfu_missing", "-")
            label = name if row["cell"] == "single" else f"{name}: {row['cell']}"
            table.append(f"| {label} | {_fmt(s.get('throughput_samples_per_s_per_device'))} | "
                         f"{_fmt(s.get('throughput_tokens_per_s_per_device'))} | {_pct(s.get('mfu'))} ({denominator}) | "
                         f"{_fmt(s.get('peak_mem_allocated_gib'))} | "
                         f"{'-' if s.get('energy_j_per_sample') is None else format(s['energy_j_per_sample'], '.3f')} | "
                         f"{_fmt(s.get('power_w_mean'))} | {_fmt(s.get('compile_time_s'))} | "
                         f"{_fmt(s.get('anatomy_step_time_ms'))} |")
        if status != "exit 0":
            (stopped if status == "stopped" else failures).append(f"{name}: {status}")
            failures += [f"  {line}" for line in log_tail if status != "stopped"]
    verdict = "FAIL" if failures else ("partial" if stopped or done < len(order) else "pass")
    figures = f"{done}/{len(order)} cells measured" + (f"; {', '.join(stopped)}" if stopped else "")
    details = [*table, "", "Anatomy at one rank appears when the worker profiles one-rank cells (comm_probe_steps=3 "
               "is asked); energy and memory are the worker's own figures.", "", *notes, *failures]
    return verdict, figures, details


# ---- 7. memory: the fit check against the measurement ----------------------------------------

MEMORY_TOLERANCE = 0.10
MEMORY_PROBE = r"""
import dataclasses, json, sys
from contract.codec import from_plain
from contract.spec import RunSpec
from launcher.plan import fit
LOW = {"bf16": "bfloat16", "fp16": "float16"}
for line in sys.stdin:
    spec = from_plain(RunSpec, json.loads(line))
    shapes, activations, _ = fit.analyse(spec.model, batch_size=spec.train.batch_size,
                                      low_dtype=LOW.get(spec.precision.name.value),
                                      checkpointing=spec.train.activation_checkpointing)
    state = dataclasses.replace(fit.predict(shapes, spec.strategy, spec.layout, spec.train.optimizer),
                                activations=activations,
                                loss_grads=fit.loss_grad_bytes(spec.model, spec.train.batch_size,
                                                               spec.train.loss.value, LOW.get(spec.precision.name.value),
                                                               bool(spec.train.compile)))
    print(json.dumps({"cell": spec.cell, "state": state.total, "activations": activations,
                      "loss_grads": state.loss_grads, "peak": state.peak}), flush=True)
"""


def memory(check: Check, budget_s: float) -> tuple[str, str, list[str]]:
    # A one-cell sweep names its cell "single": each row is named by its sweep (the check's name for it).
    rows = [{**r, "name": f"{name}: {r['cell']}" if r["cell"] != "single" else name}
            for name, sweep in check.sweeps.items() for r in cell_rows(sweep) if r["spec"]]
    measured_key = "peak_mem_allocated_gib" if not check.cpu else "peak_rss_gib"
    rows = [r for r in rows if r["summary"].get(measured_key)]
    if not rows:
        return "skipped", "no measured cell", []
    specs = "\n".join(json.dumps(r["spec"]) for r in rows) + "\n"
    try:
        proc = subprocess.run([check.python, "-c", MEMORY_PROBE], input=specs, env=check.env, cwd=REPO,
                              capture_output=True, text=True, timeout=max(budget_s, 1.0))
        stdout, stopped = proc.stdout, False
        if proc.returncode != 0:
            return "FAIL", "the fit check did not run", tail(proc.stderr)
    except subprocess.TimeoutExpired as exc:  # the cells it predicted before the budget still count
        out = exc.stdout or ""
        stdout, stopped = out.decode(errors="replace") if isinstance(out, bytes) else out, True
    # One line per spec, in the order given.
    predicted = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if not predicted:
        return ("partial" if stopped else "FAIL"), "no cell predicted" + (" before the budget" if stopped else ""), []
    table = [f"| cell | predicted state GiB | activations GiB | loss gradients GiB | predicted peak GiB | "
             f"measured {measured_key} | measured / predicted |", "|---|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for row, p in zip(rows, predicted, strict=False):
        peak = p["peak"] / 2**30
        measured = row["summary"][measured_key]
        ratios.append(measured / peak)
        activations = "-" if p["activations"] is None else f"{p['activations'] / 2**30:.2f}"
        table.append(f"| {row['name']} | {p['state'] / 2**30:.2f} | {activations} | {p['loss_grads'] / 2**30:.2f} | "
                     f"{peak:.2f} | {measured:.2f} | {ratios[-1]:.2f} |")
    figures = f"measured / predicted {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} cells"
    # On CPU the measurement is the whole process's RSS (the interpreter, torch): a comparison of
    # scale only. On a GPU the prediction leaves out cuBLAS's and cuDNN's workspaces and the
    # allocator's rounding (3-8% in the first GPU checks): within MEMORY_TOLERANCE it passes; above,
    # the fit check would let cells through that do not fit. Far below (under 0.5) it refuses cells
    # that would fit, which a GPU check reports too.
    if stopped:
        verdict = "partial"
        figures += f" (stopped at its budget: {len(ratios)} of {len(rows)} cells)"
    elif check.cpu:
        verdict = "measured"
    elif max(ratios) > 1 + MEMORY_TOLERANCE:
        verdict = "under-predicts"
    else:
        verdict = "pass" if min(ratios) >= 0.5 else "over-predicts"
    return verdict, figures, table


# ---- the compile census (the rehearsal's view of the GPU's compile path) --------------------------

def compile_census(check: Check, budget_s: float) -> tuple[str, str, list[str]]:
    """bench/census.py on GPT-2 small and ResNet-50 at real depth (CPU only: on a GPU the parts
    above compile for real, and their compile times are in their tables)."""
    if not check.cpu:
        return "skipped", "on a GPU the parts compile for real; the census is the CPU's view of it", []
    rc, text = run_logged(check, [check.python, "-m", "bench.census"], "tuned.log", budget_s)
    table = [line for line in text.splitlines() if line.startswith("|")]
    failing = [line for line in table[2:] if not line.rstrip().endswith("| pass |")]
    if rc is None:
        return "partial", f"stopped at its budget after {max(0, len(table) - 2)} rows", table
    verdict = "pass" if rc == 0 and table else "FAIL"
    figures = (f"{len(table) - 2} sides, every rule held" if verdict == "pass"
               else f"{len(failing)} side(s) failing" if failing else f"exit {rc}")
    return verdict, figures, table or tail(text)


# ---- the targets: issue 38's "done when" -------------------------------------------------------

def targets(check: Check) -> list[tuple[str, str, str]]:
    """(target, the figure measured, PASS / FAIL / not measured); on CPU each is shown but not
    judged (the rehearsal's models and shapes are not the targets')."""
    rows: list[tuple[str, str, str]] = []

    def judge(value: float | None, threshold: float) -> str:
        if value is None:
            return "not measured"
        if check.cpu:
            return "not judged (CPU rehearsal)"
        return "PASS" if value >= threshold else "FAIL"

    for part, what, threshold in (("gpt2", "tokens/s", tuning.TARGET_GPT2_BF16_TOKENS_PER_S),
                                  ("resnet50", "img/s", tuning.TARGET_RESNET50_BF16_IMG_PER_S)):
        model, precision = TUNED_PARTS[part]
        config = check.tuned.get(part)
        figures = tuned_figures(config) if config else {}
        workers = {f"{n}, {config['model']}": f["throughput"] for n, f in figures.items()
                   if config and n != "tuned" and f.get("throughput")}
        workers.update({f"{strategy}, the cells part": value
                        for strategy, value in cell_throughputs(check, model, precision).items()})
        best = max(workers.items(), key=lambda kv: kv[1]) if workers else None
        shown = f"{best[1]:,.0f} ({best[0]})" if best else "-"
        rows.append((f"{model} {precision}, the worker, {what} >= {threshold:,}", shown,
                     judge(best[1] if best else None, threshold)))
    for part in TUNED_PARTS:
        config = check.tuned.get(part)
        if config is None and part in OPTIONAL_PARTS:
            continue
        model, precision = TUNED_PARTS[part]
        figures = tuned_figures(config) if config else {}
        label = f"{config['model']} {config['precision']}" if config else f"{model} {precision}"
        fsdp = figures.get("fsdp", {})
        rows.append((f"{label}: FSDP / DDP at one rank >= {tuning.TARGET_FSDP_OVER_DDP}",
                     f"{fsdp['vs_ddp']:.3f} ({_range(fsdp, 'vs_ddp_range')})" if "vs_ddp" in fsdp else "-",
                     judge(fsdp.get("vs_ddp"), tuning.TARGET_FSDP_OVER_DDP)))
        tuned_throughput = figures.get("tuned", {}).get("throughput")
        cell_figures = cell_throughputs(check, model, precision)
        for strategy in ("ddp", "fsdp"):
            f = figures.get(strategy, {})
            value, shown = f.get("vs_tuned"), "-"
            if value is not None:
                shown = f"{value:.3f} ({_range(f, 'vs_tuned_range')})"
            elif tuned_throughput and strategy in cell_figures:
                # The side was not timed beside the tuned loop; the cells part ran its configuration.
                value = cell_figures[strategy] / tuned_throughput
                shown = f"{value:.3f} (the cells part's {strategy.upper()} over the tuned blocks: not paired)"
            rows.append((f"{label}: the worker's {strategy.upper()} / the tuned loop >= {tuning.TARGET_WORKER_OVER_TUNED}",
                         shown, judge(value, tuning.TARGET_WORKER_OVER_TUNED)))
    return rows


def cell_throughputs(check: Check, model: str, precision: str) -> dict[str, float]:
    """Per strategy, the cells part's throughput for ``model`` in ``precision`` (tokens/s for a
    language model, images/s otherwise), per device."""
    key = "throughput_tokens_per_s_per_device" if model.startswith("gpt") else "throughput_samples_per_s_per_device"
    out: dict[str, float] = {}
    for cell in check.cells:
        name = cell["name"]
        if not name.startswith(model + "-") or precision != "bf16" or not cell["summary"].get(key):
            continue
        strategy = name[len(model) + 1:]
        out[strategy] = max(out.get(strategy, 0.0), float(cell["summary"][key]))
    return out


def mfu_denominators(check: Check) -> list[str]:
    """MFU's denominator for each precision, with this device's datasheet figures where known."""
    from contract.gpus import device_peaks

    table = device_peaks(check.device) if check.device and check.device != "cpu" else None

    def tflops(key: str) -> str:
        value = (table or {}).get(key)
        return f" ({value / 1e12:,.1f} TFLOP/s on {check.device})" if value else ""

    return ["MFU's denominator, per precision (dense datasheet peaks, no sparsity; jobs/peaks.py): "
            f"fp32: the TF32 dense peak{tflops('tf32')} where fp32 matmuls or convolutions run in TF32, else the "
            f"fp32 peak{tflops('fp32')}; bf16: the bf16 dense peak{tflops('bf16')}; fp16: the fp16 dense "
            f"peak{tflops('fp16')}. The check's own MFU (bench/tuned.py's sides) counts the model's FLOPs "
            "(jobs.models.flops_per_sample, the real vocabulary's) over that peak; a cell's MFU is the worker's, "
            "its denominator named in its row."]


# ---- the compiled kernels, carried between calls ------------------------------------------------

KERNELS_FILE = "inductor-cache.tar.gz"
# What comes back from a device call: at most 8 files of 16 MiB each.
KERNELS_MAX_BYTES = 15 * 2**20


def restore_kernels(cache: Path) -> str:
    """A carried cache (``$GPU_CHECK_KERNELS``, or ``KERNELS_FILE`` at the checkout's root) unpacked into
    inductor's cache directory before any part compiles; what was found, in words."""
    carried = Path(os.environ.get("GPU_CHECK_KERNELS") or REPO / KERNELS_FILE)
    if not carried.is_file():
        return ""
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(carried) as tar:
        tar.extractall(cache, filter="data")
    return f"inductor's cache from {carried.name} ({carried.stat().st_size / 2**20:.1f} MiB) unpacked into {cache}"


def keep_kernels(check: Check) -> str:
    """The inductor cache of this run into the results as ``KERNELS_FILE``, when it is small enough to
    come back from a device call; what was done, in words."""
    cache = Path(check.env["TORCHINDUCTOR_CACHE_DIR"])
    if not cache.is_dir():
        return "no inductor cache was written"
    tmp = check.out / f".{KERNELS_FILE}.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(cache, arcname=".")
    size = tmp.stat().st_size
    if size > KERNELS_MAX_BYTES:
        tmp.unlink()
        return f"inductor's cache not kept: {size / 2**20:.1f} MiB compressed, over {KERNELS_MAX_BYTES / 2**20:.0f} MiB"
    tmp.replace(check.out / KERNELS_FILE)
    return f"inductor's cache kept as {KERNELS_FILE} ({size / 2**20:.1f} MiB)"


# ---- the tree that ran -----------------------------------------------------------------------

def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def content_digest(files: dict[str, str | None]) -> str:
    """One sha256 over (path, file sha256) in path order: the content of exactly these files."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{files[path]}\n".encode())
    return h.hexdigest()


def record_tree() -> dict[str, Any]:
    """Where git is: the commit, whether the working tree differs from it, and every tracked file's
    sha256 as it is now (what a node that gets the tree without .git checks itself against)."""
    head = (_git("rev-parse", "HEAD") or "").strip()
    if not head:
        raise SystemExit("gpu-check --record-tree: no git here; record the tree where the checkout's .git is")
    # Untracked files that git does not ignore travel with the tree and are part of what runs.
    changed = [line[3:] for line in (_git("status", "--porcelain") or "").splitlines() if line[3:] != TREE_RECORD]
    files = {p: _file_digest(REPO / p) for p in (_git("ls-files", "--cached", "--others", "--exclude-standard") or "")
             .splitlines() if p != TREE_RECORD}
    return {"commit": head, "dirty": bool(changed), "changed": changed, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files, "content_sha256": content_digest(files)}


def tree_identity() -> str:
    """The tree that ran, in one sentence, and how it was found: git when the checkout has it, else
    the record ``--record-tree`` left beside the tree, checked file by file against what is here."""
    record = _read_json(REPO / TREE_RECORD)
    if record.get("files"):
        # A record beside the tree names it even where a .git travelled too: a copied checkout's .git
        # may be an older one than the tree it came with.
        here = {p: _file_digest(REPO / p) for p in record["files"]}
        if all(here[p] == record["files"][p] for p in here):
            return (f"commit {record['commit'][:12]} ({'dirty' if record['dirty'] else 'clean'} when recorded "
                    f"{record['recorded']}); content sha256 {content_digest(here)[:16]} of {len(here)} files, the "
                    f"recorded content exactly; identity from {TREE_RECORD}")
    head = (_git("rev-parse", "HEAD") or "").strip()
    if head:
        rec = record_tree()
        state = f"dirty: {len(rec['changed'])} file(s) differ from it" if rec["dirty"] else "clean"
        return (f"commit {head[:12]} ({state}); content sha256 {rec['content_sha256'][:16]} of {len(rec['files'])} "
                "files (tracked, and untracked ones git does not ignore); identity from git on this machine")
    if not record.get("files"):
        return (f"unknown: no .git here and no {TREE_RECORD} (run `scripts/gpu-check --record-tree` before carrying "
                "the tree)")
    here = {p: _file_digest(REPO / p) for p in record["files"]}
    differ = sorted(p for p in here if here[p] != record["files"][p])
    base = (f"commit {record['commit'][:12]} ({'dirty' if record['dirty'] else 'clean'} when recorded "
            f"{record['recorded']}); content sha256 {content_digest(here)[:16]} of {len(here)} files")
    if differ:
        return base + f"; DIFFERS from the record in {len(differ)} file(s): {', '.join(differ[:5])}; identity from {TREE_RECORD}"
    return base + f", the recorded content exactly; identity from {TREE_RECORD} (no .git here)"


# ---- the check ---------------------------------------------------------------------------------

PARTS: tuple[tuple[str, float, Callable[[Check, float], tuple[str, str, list[str]]]], ...] = (
    # Most important first. Each tuned part: process start and imports (~15 s), three cold compiles
    # (tuned, DDP whole, FSDP by regions: 30-70 s each on one H100 estimated, the kernels of the later
    # ones partly in inductor's in-process cache), about 25 s of blocks, the probes with what is left.
    # Each part records every side's build and compile time, which the next budgets come from.
    ("environment", 10, environment),
    ("install", 20, install),
    ("gpt2", 160, lambda check, budget_s: tuned_part(check, budget_s, "gpt2")),
    ("resnet50", 190, lambda check, budget_s: tuned_part(check, budget_s, "resnet50")),
    ("tests", 25, gpu_tests),
    # Its graphs are the gpt2 part's DDP side's: found in inductor's cache, not compiled again.
    ("cells", 80, cells),
    ("memory", 15, memory),
    # CPU only (the rehearsal): what dynamo would hand inductor on the GPU, at real depth.
    ("census", 200, compile_census),
    # Only when --only names them (OPTIONAL_PARTS).
    ("resnet50-fp16", 150, lambda check, budget_s: tuned_part(check, budget_s, "resnet50-fp16")),
    ("gpt2-fp16", 150, lambda check, budget_s: tuned_part(check, budget_s, "gpt2-fp16")),
    ("cells-more", 150, lambda check, budget_s: cells(check, budget_s, MORE_CELLS)),
)
OPTIONAL_PARTS = {"resnet50-fp16", "gpt2-fp16", "cells-more"}


def run_part(check: Check, name: str, budget_s: float, fn) -> None:
    outcome = Outcome(name, budget_s)
    check.outcomes.append(outcome)
    allowed_s = min(budget_s, check.remaining_s())
    if allowed_s < 3:
        outcome.verdict = "not run: the check's budget is spent"
        return
    t0 = time.monotonic()
    # What the files say while the part runs (its figures so far are written as they come).
    outcome.verdict = "running: the call ended inside this part"
    try:
        outcome.verdict, outcome.figures, outcome.details = fn(check, allowed_s)
    except Exception as exc:  # one part's failure must not cost the others their turn
        import traceback

        outcome.verdict, outcome.figures = "FAIL", f"{type(exc).__name__}: {exc}"
        outcome.details = tail(traceback.format_exc(), 15)
    outcome.took_s = time.monotonic() - t0


def write_results(check: Check) -> None:
    """Everything the check has so far, each file written whole and then renamed into place."""
    started, tree = check.started, check.tree
    _atomic(check.out / "BENCH_RESULTS_GPU.md", render(check, started, tree))
    _atomic(check.out / "gpu-check.json", json.dumps(
        {"started": started, "tree": tree, "parts": [asdict(o) for o in check.outcomes],
         "targets": targets(check), "tuned": check.tuned,
         "cells": [{k: v for k, v in c.items()} for c in check.cells]}, indent=1, default=str))
    if check.sweeps:
        tmp = check.out / ".sweeps.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for sweep in check.sweeps.values():
                tar.add(sweep, arcname=sweep.name, filter=lambda ti: None if TAR_EXCLUDE.search(ti.name) else ti)
        tmp.replace(check.out / "sweeps.tar.gz")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def render(check: Check, started: str, tree: str) -> str:
    """BENCH_RESULTS_GPU.md: one run of the check, whole: the tree, the targets, the parts."""
    spent = sum(o.took_s for o in check.outcomes)
    lines = ["# GPU check results" + (" (CPU rehearsal: no GPU figure here)" if check.cpu else ""), "",
             f"One run of `scripts/gpu-check {shlex.join(sys.argv[1:])}`, started {started} on "
             f"{os.uname().nodename}{', ' + check.device if check.device else ''}; {spent:.0f} s of its "
             f"{TOTAL_BUDGET_S:.0f} s budget so far. Each part writes this file before the next starts. "
             "How to run it and what each part does: [docs/gpu/README.md](docs/gpu/README.md).", "",
             f"**The tree that ran**: {tree}.", "",
             "## Targets", "", "| target | measured | verdict |", "|---|---|---|",
             *(f"| {t} | {m} | {v} |" for t, m, v in targets(check)), "",
             *mfu_denominators(check), "",
             "## Parts", "", "| part | budget s | took s | verdict | key figures |", "|---|---:|---:|---|---|"]
    lines += [f"| {o.part} | {o.budget_s:.0f} | {o.took_s:.1f} | {o.verdict} | {o.figures} |" for o in check.outcomes]
    for o in check.outcomes:
        if o.details:
            lines += ["", f"## {o.part}", "", *o.details]
    if check.sweeps:
        lines += ["", "The cells' sweeps are in `sweeps.tar.gz`; into MLflow with `tar xzf sweeps.tar.gz` and "
                  "`python -m launcher.sync <sweep dir> --tracking-uri URI` where MLflow is installed."]
    return "\n".join(lines) + "\n"


ONE_CALL = """on a machine lent for one call (docs/gpu/README.md):
  here, right before the call:
    scripts/offline-bundle && scripts/gpu-check --record-tree
  the call (carry .whl, and inductor-cache.tar.gz if an earlier call brought one back; timeout 590 s):
    PYTHONUNBUFFERED=1 GPU_CHECK_OUT=$OUT scripts/gpu-check 2>&1 | tail -40
  afterwards: BENCH_RESULTS_GPU.md over the repository's, the call's files in docs/gpu/runN/,
  gpu-check-tree.json deleted"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=ONE_CALL)
    p.add_argument("--cpu", action="store_true", help="the rehearsal: every part with CPU settings")
    p.add_argument("--only", help=f"comma-separated parts of {','.join(n for n, _, _ in PARTS)}")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"the whole check's budget (default {TOTAL_BUDGET_S:.0f} s; {CPU_BUDGET_S:.0f} s with --cpu)")
    p.add_argument("--budget", action="append", default=[], metavar="PART=S", help="one part's budget, e.g. cells=120")
    p.add_argument("--tests-k", help="the tests part runs this pytest -k expression instead of its groups")
    p.add_argument("--worker-set", action="append", default=[], metavar="PATH=JSON",
                   help="a worker setting on top of bench/tuning.py's, e.g. train.loss='\"full\"' (where the spec has it)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=STRATEGY;PATH=JSON",
                   help="one more worker side in the tuned parts, with settings of its own, e.g. "
                        "'fsdp-model=fsdp;strategy.wrap=\"model\"' (bench/tuned.py --variant)")
    p.add_argument("--record-tree", action="store_true",
                   help=f"write {TREE_RECORD} (commit, dirty, every tracked file's sha256) for a node without .git, and stop")
    args = p.parse_args(argv)
    if args.record_tree:
        record = record_tree()
        _atomic(REPO / TREE_RECORD, json.dumps(record, indent=1))
        print(f"gpu-check: recorded commit {record['commit'][:12]} ({'dirty' if record['dirty'] else 'clean'}), "
              f"{len(record['files'])} files, content sha256 {record['content_sha256'][:16]} in {TREE_RECORD}",
              file=sys.stderr)
        return 0
    budgets = {name: budget_s for name, budget_s, _ in PARTS}
    for item in args.budget:
        name, _, value = item.partition("=")
        if name not in budgets:
            p.error(f"--budget {item}: no part {name!r}; the parts: {', '.join(budgets)}")
        budgets[name] = float(value)
    for item in args.worker_set:
        path, sep, value = item.partition("=")
        try:
            json.loads(value)
        except json.JSONDecodeError:
            sep = ""
        if not sep:
            p.error(f"--worker-set {item}: give PATH=JSON, e.g. train.loss='\"full\"' or train.compile=true")
    out = Path(os.environ.get("GPU_CHECK_OUT") or REPO / "outputs" / "gpu-check").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}-work"  # sweeps and the installed bundle: beside the results, not in them
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError:  # an output folder whose parent is not ours to write (a device tool's $OUT)
        work = REPO / "outputs" / ".gpu-check-work"
        work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           # Every part's compiled kernels in one cache, which the check carries back (KERNELS_FILE).
           "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(work / "inductor-cache")}
    kernels_note = restore_kernels(Path(env["TORCHINDUCTOR_CACHE_DIR"]))
    if kernels_note:
        print(f"gpu-check: {kernels_note}", file=sys.stderr, flush=True)
    check = Check(out=out, python=os.environ.get("PYTHON", sys.executable), cpu=args.cpu,
                  deadline=time.monotonic() + (args.budget_s or (CPU_BUDGET_S if args.cpu else TOTAL_BUDGET_S)),
                  env=env, work=work, tests_k=args.tests_k,
                  worker_set=args.worker_set, variants=args.variant)
    only = set(args.only.split(",")) if args.only else None
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tree = tree_identity()
    check.started, check.tree = started, tree
    print(f"gpu-check: the tree: {tree}", file=sys.stderr, flush=True)
    for name, _, fn in PARTS:
        if only is None and name in OPTIONAL_PARTS:
            continue
        if only is None or name in only:
            run_part(check, name, budgets[name], fn)
            if name in TUNED_PARTS and not check.cpu:
                check.outcomes[-1].details.append(keep_kernels(check))
            write_results(check)
            print(f"gpu-check: {name}: {check.outcomes[-1].verdict} in {check.outcomes[-1].took_s:.0f} s "
                  f"({check.outcomes[-1].figures})", file=sys.stderr, flush=True)
            if name == "environment" and check.outcomes[-1].verdict != "pass":
                print("gpu-check: stopped: every other part needs what the environment lacks (on a machine "
                      "without a GPU, --cpu rehearses the check)", file=sys.stderr)
                return 2
    for target, measured, verdict in targets(check):
        print(f"gpu-check: target: {verdict}: {target}: {measured}", file=sys.stderr)
    print(f"gpu-check: wrote {out}", file=sys.stderr)
    return 0 if all(o.verdict in ("pass", "measured", "skipped") for o in check.outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
