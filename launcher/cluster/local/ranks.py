"""submitit's local executor's variables as the ones every rank reads (contract/rank_env.py:
torchrun's, and the project's few), so the ranks (jobs/) read no executor's own. The local cluster
emulates nodes: a cell's ranks are local processes, numbered as a real cluster numbers them, in
groups of ``layout.tasks_per_node`` (one group: every rank of a spec that does not emulate)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from contract import rank_env
from contract.rendezvous import port_for_job


def torchrun_env(env: Mapping[str, str], tasks_per_node: int | None = None) -> dict[str, str]:
    """The rank's variables from a local task's (SUBMITIT_LOCAL_GLOBALID and SUBMITIT_LOCAL_NTASKS);
    {} outside one. ``tasks_per_node``: the emulated nodes' size (None: one node of every rank)."""
    if env.get("SUBMITIT_EXECUTOR") != "local" or "SUBMITIT_LOCAL_GLOBALID" not in env:
        return {}
    world = int(env["SUBMITIT_LOCAL_NTASKS"])
    rank = int(env["SUBMITIT_LOCAL_GLOBALID"])
    per_node = tasks_per_node or world
    job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "0")
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port_for_job(job_id)),
            rank_env.LAUNCHER: "submitit-local", rank_env.JOB_ID: job_id,
            # every emulated node is this machine: a rank's GPU is picked among all of the job's ranks
            rank_env.MACHINE_RANK: str(rank), rank_env.MACHINE_RANKS: str(world)}


class OnLocal:
    """``target`` (what submitit pickles: jobs.worker.Worker, jobs.fabric.Probe) run in a local task
    after its variables are translated; its spec (a RunSpec or ProbeSpec) says the emulated nodes."""

    def __init__(self, target: Callable[..., Any]) -> None:
        self.target = target

    def __call__(self, spec: Any) -> Any:
        os.environ.update(torchrun_env(os.environ, spec.layout.tasks_per_node if spec.emulate_nodes else None))
        return self.target(spec)
