"""Why a cell failed, from what its ranks left behind (error files, heartbeats, stall markers)."""

from __future__ import annotations

import re
from pathlib import Path

from contract import records

# A rank that fails because a peer vanished reports a communication error; the peer is the cause.
_COMM_ERROR = re.compile(r"DistBackendError|Connection (reset|closed|refused)|Gloo|NCCL|timed out|Timeout|"
                         r"Broken pipe|recvBytes|Socket", re.IGNORECASE)


def last_line(exc: BaseException) -> str:
    """What a failed submission or job says in one line: the last line of its error (submitit's
    errors carry the whole stderr), or its type where it says nothing."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def first_failure(cell_dir: Path) -> str | None:
    """Which rank failed first, on which node, and why, from what the ranks left behind.

    Priority: a rank the stall watchdog ended; then a rank's own error (an exception that is not a
    communication error); then a rank that died without a word (its heartbeat says it was running:
    SIGKILL, the OOM killer, a segfault); then communication errors, which are consequences.
    """
    beats = _heartbeats(cell_dir)
    stalled = sorted((cell_dir / "ranks").glob("stalled-rank*.txt"), key=lambda p: p.stat().st_mtime)
    if stalled:
        return stalled[0].read_text().splitlines()[0]
    errors = sorted(cell_dir.glob("error-rank*.txt"), key=lambda p: p.stat().st_mtime)
    first_lines = [e.read_text().splitlines()[0] for e in errors]
    own = [line for line in first_lines if not _COMM_ERROR.search(line)]
    if own:
        return own[0]
    reported = {int(m.group(1)) for e in errors if (m := re.search(r"rank(\d+)", e.name))}
    silent = sorted((rec for r, rec in beats.items() if rec.get("state") in ("starting", "running") and r not in reported),
                    key=lambda rec: rec.get("time", 0))
    if silent:
        rec = silent[0]
        where = f"at step {rec['step']}" if rec.get("step") is not None else "before its first step"
        tail = f"; then {first_lines[0]}" if first_lines else ""
        return (f"rank {rec['rank']} on {rec['host']} died {where} without reporting an error (killed by a signal, "
                f"e.g. SIGKILL or the out-of-memory killer){tail}")
    return first_lines[0] if first_lines else None


# ---- failure classes ----------------------------------------------------------------------------

OOM, COLLECTIVE_TIMEOUT, HANG, PREEMPTED = "oom", "collective_timeout", "hang", "preempted"
PORT_IN_USE, NODE_FAILURE, CONFIG_ERROR, RUNTIME_ERROR = "port_in_use", "node_failure", "config_error", "runtime_error"
# Runs that finished their steps but trained on something else (jobs/brokenrun.py): never results.
DIVERGED, LOSS_FROZEN, STEPS_SKIPPED = "diverged", "loss_frozen", "steps_skipped"
# A job the cluster refused at submission (sbatch: launcher/cluster/slurm/submit.py): the request does not fit the cluster.
SUBMIT_REFUSED = "submit_refused"
# Failures of the place, not of the configuration: run again, it may well give a result.
NOT_THE_CONFIGURATIONS = (PREEMPTED, PORT_IN_USE, NODE_FAILURE)
CLASSES = (OOM, COLLECTIVE_TIMEOUT, HANG, PREEMPTED, PORT_IN_USE, NODE_FAILURE, CONFIG_ERROR, RUNTIME_ERROR,
           DIVERGED, LOSS_FROZEN, STEPS_SKIPPED, SUBMIT_REFUSED)

# What to do about each class (shown by status and in the report's "Cells without results").
FIXES: dict[str, str] = {
    OOM: "out of memory: lower batch_size, use strategy=fsdp (shards parameters, gradients and optimizer state), "
         "precision=bf16 or activation_checkpointing=true; for host memory raise cluster.mem_gb (Slurm's --mem, or "
         "the local cell's memory cgroup).",
    COLLECTIVE_TIMEOUT: "a collective timed out: a peer died or fell behind first (see the other ranks' errors); "
                        "check the interconnect (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME), raise collective_timeout_s "
                        "if the first steps are legitimately slow, then --resubmit-failed.",
    HANG: "no step progress (stall watchdog or the time limit): read ranks/stalled-rank*.txt for the stacks; "
          "raise cluster.timeout_min if the cell was only slow, collective_timeout_s if a step is legitimately long.",
    PREEMPTED: "preempted or requeued without finishing: resubmit (python -m launcher.status <sweep> "
               "--resubmit-failed); it resumes from its checkpoint. Set checkpoint.every_steps to bound lost work.",
    PORT_IN_USE: "MASTER_PORT was taken on the head node: resubmit the cell (--resubmit-failed) for a new job id "
                 "and port, or free the port.",
    NODE_FAILURE: "a node or the job vanished (NODE_FAIL, a rank's host lost, or a job unknown to Slurm): "
                  "resubmit with --resubmit-failed, adding cluster.exclude=<node> if one node keeps failing.",
    CONFIG_ERROR: "the cell's settings cannot be built (the error names the setting): fix the override and run "
                  "the sweep again; resubmitting unchanged fails the same way.",
    RUNTIME_ERROR: "an error during training: read error-rank<R>.txt (traceback) in the cell directory; "
                   "resubmit once the cause is fixed.",
    DIVERGED: "the loss was NaN or infinite, so the run timed NaN arithmetic, not the configuration: check the "
              "model's initialisation (a _target_ model's weights must all be set by its constructor), lower lr, "
              "prefer precision=bf16 to fp16; resubmitting unchanged diverges again.",
    LOSS_FROZEN: "the loss did not change over the measured window, so nothing was trained: check that the model's "
                 "parameters require gradients, that lr is not 0 and that the output depends on the input.",
    SUBMIT_REFUSED: "sbatch refused the job (its error names the resource): fit the cell's cluster.* settings to the "
                    "partition (sinfo -N -l), then run the same command with the sweep's sweep_dir to resume it.",
    STEPS_SKIPPED: "fp16 loss scaling skipped most of the window's steps (inf/NaN gradients), so the window timed "
                   "steps without updates: use precision=bf16, lower lr, or raise warmup_steps so the scale settles.",
}

_OOM_TEXT = re.compile(r"out of memory|OutOfMemoryError|OUT_OF_MEMORY|oom[-_ ]kill|Cannot allocate memory|"
                       r"can't allocate memory|std::bad_alloc|MemoryError", re.IGNORECASE)
# A rank killed by a signal with no word of its own: mostly the kernel's OOM killer (SIGKILL).
_KILLED_TEXT = re.compile(r"died .* without reporting an error|\bKilled\b|SIGKILL|signal 9\b|exit code -9|"
                          r"exitcode -9|returncode -9", re.IGNORECASE)
_PORT_TEXT = re.compile(r"already in use|EADDRINUSE|errno 98|address in use", re.IGNORECASE)
_TIMEOUT_TEXT = re.compile(r"timed out|Timeout\(ms\)|watchdog caught collective|collective operation timeout|"
                           r"DistStoreError.*timeout|wait timeout|Socket Timeout", re.IGNORECASE)
_CONFIG_TEXT = re.compile(r"ConfigError|does not take params|unknown model name|unexpected keyword argument|"
                          r"missing \d+ required positional argument|not divisible by|No module named|"
                          r"ModuleNotFoundError|ImportError|cannot import name|model\.target|model\._target_|"
                          r"exceeds block_size|Fix: ", re.IGNORECASE)
# Exception types that, raised before the first step, mean the settings cannot be built.
_CONFIG_TYPES = re.compile(r"failed: (ValueError|TypeError|KeyError|AttributeError|NotImplementedError|"
                           r"AssertionError)\b")
# jobs.brokenrun.BrokenRun's text names its class: "BrokenRun: diverged: the loss is nan at step 3 ...".
_BROKEN_TEXT = re.compile(r"BrokenRun: (diverged|loss_frozen|steps_skipped):")
_VANISHED_TEXT = re.compile(r"neither the queue nor accounting|NODE_FAIL|node failure|No route to host|"
                            r"Connection (reset|closed|refused)|Broken pipe", re.IGNORECASE)


def _heartbeats(cell_dir: Path) -> dict[int, dict]:
    beats = {}
    for path in (cell_dir / "ranks").glob("rank*.json"):
        rec = records.maybe_document(path, "a rank's heartbeat")
        if rec is not None and isinstance(rec.get("rank"), int):
            beats[rec["rank"]] = rec
    return beats


def _first_lines(paths: list[Path]) -> list[str]:
    out = []
    for p in paths:
        try:
            out.append((p.read_text().splitlines() or [""])[0])
        except OSError:
            continue
    return out


def classify(cell_dir: Path, decided: str | None = None, error: str | None = None, *, timed_out: bool = False) -> str:
    """One of :data:`CLASSES` for a cell that ended without a result.

    ``decided``: the class the cluster's own record settles (each backend maps its states: Slurm's
    OUT_OF_MEMORY -> oom in launcher/cluster/slurm/accounting.py, a local memory cgroup's OOM kill);
    ``timed_out``: the job reached its time limit, which says less (no progress to the limit).
    Evidence, strongest first: the decided class where it is decisive (oom, node_failure,
    preempted); a preemption record (``preempted.txt``); a busy port and out-of-memory
    texts in any rank's error (the cause, whichever rank saw it); the stall watchdog's marker
    (``ranks/stalled-rank<R>.txt``); a rank's own error (not a communication error): a settings
    error raised before the first step is ``config_error``, anything else ``runtime_error``; a rank
    that died without a word while its heartbeat said running (SIGKILL, mostly the OOM killer);
    communication errors only (timeouts, or a peer whose connection vanished); the time limit (no
    progress to it); else ``runtime_error``.
    """
    cell_dir = Path(cell_dir)
    if decided in (OOM, NODE_FAILURE, PREEMPTED):
        return decided
    if (cell_dir / "preempted.txt").exists():
        return PREEMPTED
    errors = sorted(cell_dir.glob("error-rank*.txt"), key=lambda p: p.stat().st_mtime)
    lines = _first_lines(errors)
    texts = [*lines, *( [error] if error else [])]
    broken = next((m.group(1) for t in texts if (m := _BROKEN_TEXT.search(t))), None)
    if broken:
        return broken
    if any(_PORT_TEXT.search(t) for t in texts):
        return PORT_IN_USE
    if any(_OOM_TEXT.search(t) for t in texts):
        return OOM
    if list((cell_dir / "ranks").glob("stalled-rank*.txt")):
        return HANG
    own = [line for line in lines if not _COMM_ERROR.search(line)]
    if own:
        return _own_error_class(own[0], cell_dir)
    beats = _heartbeats(cell_dir)
    reported = {int(m.group(1)) for e in errors if (m := re.search(r"rank(\d+)", e.name))}
    silent = [rec for r, rec in beats.items() if rec.get("state") in ("starting", "running") and r not in reported]
    if silent and errors:
        return OOM  # a peer died without a word while the others saw only its connection close
    if lines and any(_TIMEOUT_TEXT.search(line) for line in lines):
        return COLLECTIVE_TIMEOUT
    if lines and any(_VANISHED_TEXT.search(line) for line in lines):
        return NODE_FAILURE
    if timed_out:
        return HANG
    if error and _KILLED_TEXT.search(error):
        return OOM
    if error and _VANISHED_TEXT.search(error):
        return NODE_FAILURE
    if error and _TIMEOUT_TEXT.search(error):
        return COLLECTIVE_TIMEOUT
    if error and (_CONFIG_TEXT.search(error) or _CONFIG_TYPES.search(error)):
        return CONFIG_ERROR
    if silent:
        return OOM
    return RUNTIME_ERROR


def _own_error_class(line: str, cell_dir: Path) -> str:
    if _CONFIG_TEXT.search(line):
        return CONFIG_ERROR
    if _CONFIG_TYPES.search(line):
        # Raised before any rank finished a step: building the model, data or wrapper failed.
        rank = re.match(r"rank (\d+)", line)
        beat = _heartbeats(cell_dir).get(int(rank.group(1))) if rank else None
        if beat is None or beat.get("step") is None:
            return CONFIG_ERROR
    return RUNTIME_ERROR


def describe(failure_class: str | None) -> str:
    """``"oom: out of memory: lower batch_size, ..."`` for status and the report."""
    if not failure_class:
        return ""
    return f"{failure_class}: {FIXES.get(failure_class, '')}".rstrip(": ")
