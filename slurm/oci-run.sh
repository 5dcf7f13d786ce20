#!/usr/bin/env bash
# The local Slurm cluster's OCI run command (oci.conf RunTimeRun, written by local-cluster.sh): runs
# one task of a step in its OCI bundle with runc, after adding the task's own rank variables.
#
# Why: Slurm 22.05 writes the STEP's environment into the bundle's config.json, the same for every
# task, so a task in a container has no SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID or
# SLURMD_NODENAME, and every rank would take itself for rank 0. They follow from the node's name
# and the task's index on it (Slurm's %n and %t) under the block distribution, Slurm's default:
# a task's rank is the tasks of the nodes before its node, plus its index on its node.
#
# Usage (oci.conf): oci-run.sh RUNC_ROOT BUNDLE NODE LOCAL_TASK CONTAINER_ID
set -euo pipefail
export PATH="/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
[[ $# -eq 5 ]] || { echo "usage: $0 RUNC_ROOT BUNDLE NODE LOCAL_TASK CONTAINER_ID" >&2; exit 2; }
runc_root=$1 bundle=$2 node=$3 local_task=$4 id=$5
task_bundle=$bundle/task$local_task
mkdir -p "$task_bundle"
python3 - "$bundle/config.json" "$task_bundle/config.json" "$node" "$local_task" <<'EOF'
import json
import os
import re
import sys

src, dst, node, local_task = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


def hostnames(nodelist):
    """node[1-3,5],gpu7 -> [node1, node2, node3, node5, gpu7] (Slurm's host list syntax)."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            names += [f"{prefix}{i:0{len(first)}d}" for i in range(int(first), int(last or first) + 1)]
    return names


def tasks_per_node(spec):
    """2(x3),1 -> [2, 2, 2, 1] (Slurm's SLURM_STEP_TASKS_PER_NODE)."""
    counts = []
    for count, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", spec):
        counts += [int(count)] * int(times or 1)
    return counts


config = json.load(open(src))
env = dict(item.split("=", 1) for item in config["process"]["env"])
nodes = hostnames(env["SLURM_STEP_NODELIST"])
node_id = nodes.index(node)
rank = sum(tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])[:node_id]) + local_task
config["process"]["env"] += [f"SLURM_PROCID={rank}", f"SLURM_LOCALID={local_task}", f"SLURM_NODEID={node_id}",
                             f"SLURMD_NODENAME={node}"]
if not os.path.isabs(config["root"]["path"]):
    config["root"]["path"] = os.path.join(os.path.dirname(os.path.abspath(src)), config["root"]["path"])
json.dump(config, open(dst, "w"))
EOF
exec runc --root="$runc_root" run "$id" -b "$task_bundle"
