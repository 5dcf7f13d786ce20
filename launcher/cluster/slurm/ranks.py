"""Slurm's own variables as the ones every rank reads (contract/rank_env.py: torchrun's, and the
project's few): the translation lives with the backend, so the ranks (jobs/) never read SLURM_*.

Two ways in, both ending in ``python -m jobs``'s entry on a spec file (jobs/__main__.py):
:class:`OnSlurm` wraps what submitit pickles (``SpecFile``: a cell's spec.json or a probe's
probe-spec.json, by its path alone) and translates in each task before it runs; ``python -m
launcher.cluster.slurm.ranks SPEC.json [--out DIR]`` does the same for one cell run by hand under
srun (its reproduce.sh).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from contract import rank_env
from contract.rendezvous import port_for_job
from launcher.cluster.slurm.nodelist import expand_nodelist


def torchrun_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rank's variables from a Slurm task's (SLURM_PROCID and SLURM_NTASKS: one rank per task);
    {} outside a Slurm task. MASTER_ADDR is the first host of the job's node list; MASTER_PORT
    derives from the job id (contract.rendezvous.port_for_job), the same on every task."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    hosts = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost")
    # SLURM_JOB_NUM_NODES is the allocation; SLURM_NNODES the step (the same under srun).
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or len(hosts))
    world = int(env["SLURM_NTASKS"])
    job_id = env.get("SLURM_JOB_ID", "0")
    # What `scontrol requeue` takes: the array task (123_4) when it is one, never the whole array.
    array = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
             if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") else job_id)
    out = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(world), "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
           "LOCAL_WORLD_SIZE": str(world // max(1, nodes)), "GROUP_RANK": env.get("SLURM_NODEID", "0"),
           "MASTER_ADDR": hosts[0], "MASTER_PORT": str(port_for_job(job_id)),
           rank_env.LAUNCHER: "slurm", rank_env.JOB_ID: job_id, rank_env.REQUEUE: f"scontrol requeue {array}"}
    if env.get("SLURMD_NODENAME"):
        out[rank_env.NODE_NAME] = env["SLURMD_NODENAME"]
    return out


class OnSlurm:
    """``target`` (what submitit pickles: jobs/__main__.py's ``SpecFile``) run in a Slurm task after its
    variables are translated. Neither has a ``checkpoint`` method (nor had the classes they replaced):
    a cell's ranks replace submitit's signal handlers with their own as they start, and save and
    requeue at a step boundary (jobs/preempt.py)."""

    def __init__(self, target: Callable[..., Any]) -> None:
        self.target = target

    def __call__(self, *args: Any) -> Any:
        os.environ.update(torchrun_env(os.environ))
        return self.target(*args)


if __name__ == "__main__":
    os.environ.update(torchrun_env(os.environ))
    from jobs.__main__ import main

    raise SystemExit(main(sys.argv[1:]))  # 2: the spec or --out refused before the rank started
