"""Why a cell failed, from what its ranks left behind (error files, heartbeats, stall markers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# A rank that fails because a peer vanished reports a communication error; the peer is the cause.
_COMM_ERROR = re.compile(r"DistBackendError|Connection (reset|closed|refused)|Gloo|NCCL|timed out|Timeout|"
                         r"Broken pipe|recvBytes|Socket", re.IGNORECASE)


def first_failure(cell_dir: Path) -> str | None:
    """Which rank failed first, on which node, and why, from what the ranks left behind.

    Priority: a rank the stall watchdog ended; then a rank's own error (an exception that is not a
    communication error); then a rank that died without a word (its heartbeat says it was running:
    SIGKILL, the OOM killer, a segfault); then communication errors, which are consequences.
    """
    beats = {}
    for path in (cell_dir / "ranks").glob("rank*.json"):
        try:
            rec = json.loads(path.read_text())
            beats[rec["rank"]] = rec
        except (OSError, ValueError, KeyError):
            continue
    stalled = sorted((cell_dir / "ranks").glob("stalled-rank*.txt"), key=lambda p: p.stat().st_mtime)
    if stalled:
        return stalled[0].read_text().splitlines()[0]
    errors = sorted(cell_dir.glob("error-rank*.txt"), key=lambda p: p.stat().st_mtime)
    first_lines = [e.read_text().splitlines()[0] for e in errors]
    own = [line for line in first_lines if not _COMM_ERROR.search(line)]
    if own:
        return own[0]
    reported = {int(re.search(r"rank(\d+)", e.name).group(1)) for e in errors}
    silent = sorted((rec for r, rec in beats.items() if rec.get("state") in ("starting", "running") and r not in reported),
                    key=lambda rec: rec.get("time", 0))
    if silent:
        rec = silent[0]
        where = f"at step {rec['step']}" if rec.get("step") is not None else "before its first step"
        tail = f"; then {first_lines[0]}" if first_lines else ""
        return (f"rank {rec['rank']} on {rec['host']} died {where} without reporting an error (killed by a signal, "
                f"e.g. SIGKILL or the out-of-memory killer){tail}")
    return first_lines[0] if first_lines else None
