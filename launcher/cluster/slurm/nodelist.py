"""Slurm's node-list syntax (``node[1-3,7],gpu-a[01-02]``), read one way by the Slurm backend: its
settings' ``nodelist`` and ``exclude``, sacct's and squeue's NodeList, a job's SLURM_JOB_NODELIST.
Pure: no Slurm command is run here."""

from __future__ import annotations

import re


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
