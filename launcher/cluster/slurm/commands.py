"""How Slurm's commands are run here: the one place that calls them and reads their output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Where Slurm's own commands look for their configuration (besides $SLURM_CONF), including the
# configless cache that slurmd keeps on a node.
CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
              "/run/slurm/conf/slurm.conf")


def configured() -> bool:
    return bool(os.environ.get("SLURM_CONF")) or any(Path(p).exists() for p in CONF_PATHS)



def run(args: list[str]) -> str:
    """The command's output, or "" when it failed."""
    return call(args) or ""


def call(args: list[str]) -> str | None:
    """The command's output, or None when it failed (a Slurm command that did not answer)."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
