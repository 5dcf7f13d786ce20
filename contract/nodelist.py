"""Slurm's node-list syntax and the rendezvous port a job derives from its id: read one way by the
ranks (jobs/dist.py) and by the launcher (sacct and squeue output, node checks).
"""

from __future__ import annotations

import re

# Below Linux's ephemeral range (32768-60999), so an outgoing connection never holds our port.
PORT_BASE = 10000
PORT_SPAN = 20000


def port_for_job(job_id: str) -> int:
    """MASTER_PORT for a job: unique among any 20000 consecutive job ids.

    Slurm job ids (and local PIDs) are unique among running jobs and increase, so jobs that
    share a head node get different ports unless 20000 jobs separate them; the head rank
    still checks the port is free (:func:`check_port_free`) and fails with a clear message.
    Array tasks have their own SLURM_JOB_ID, so they differ too.
    """
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[1-3,7],gpu-a[01-02]`` -> node1..node3, node7, gpu-a01, gpu-a02."""
    hosts: list[str] = []
    # Split on commas that are not inside brackets.
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        expanded = []
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            if not hi:
                expanded.append(lo)
                continue
            width = len(lo)  # keep zero padding: [01-02] -> 01, 02
            expanded.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        # Nested brackets in the suffix (rare: node[1-2]-ib[0-1]) expand recursively.
        for item in expanded:
            hosts.extend(expand_nodelist(prefix + item + suffix) if "[" in suffix else [prefix + item + suffix])
    return hosts
