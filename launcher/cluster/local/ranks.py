"""submitit's local executor's variables as the ones every rank reads (contract/rank_env.py:
torchrun's, and the project's few), so the ranks (jobs/) read no executor's own. The local cluster
emulates nodes: a cell's ranks are local processes, translated here as one node of every rank (as
torchrun numbers one machine's), then regrouped by ``python -m jobs`` into the spec's nodes of
``layout.tasks_per_node`` ranks, numbered as a real cluster numbers them (jobs/__main__.py,
``emulated_nodes``: the same regrouping for every one-machine backend)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from contract import rank_env
from contract.rendezvous import port_for_job


def torchrun_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rank's variables from a local task's (SUBMITIT_LOCAL_GLOBALID and SUBMITIT_LOCAL_NTASKS), as
    one node of every rank; {} outside one."""
    if env.get("SUBMITIT_EXECUTOR") != "local" or "SUBMITIT_LOCAL_GLOBALID" not in env:
        return {}
    world = int(env["SUBMITIT_LOCAL_NTASKS"])
    rank = int(env["SUBMITIT_LOCAL_GLOBALID"])
    job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "0")
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port_for_job(job_id)),
            rank_env.LAUNCHER: "submitit-local", rank_env.JOB_ID: job_id,
            # every emulated node is this machine: a rank's GPU is picked among all of the job's ranks
            rank_env.MACHINE_RANK: str(rank), rank_env.MACHINE_RANKS: str(world)}


class OnLocal:
    """``target`` (what submitit pickles: jobs/__main__.py's ``SpecFile``, a spec file's path) run in a
    local task after its variables are translated, as one node of every rank: ``python -m jobs``
    regroups them into the spec's emulated nodes (``emulated_nodes``), as it does under torchrun."""

    def __init__(self, target: Callable[..., Any]) -> None:
        self.target = target

    def __call__(self, *args: Any) -> Any:
        os.environ.update(torchrun_env(os.environ))
        return self.target(*args)
