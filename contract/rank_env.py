"""The variables a rank is started with, as every backend gives them: torchrun's (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), and the few the project adds that torchrun has no word for. A backend whose
scheduler has variables of its own translates them in its folder (Slurm's:
launcher/cluster/slurm/ranks.py); jobs/dist.py, the one reader on the ranks' side, reads only these.
"""

from __future__ import annotations

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # all set: a rank's place
# What the project adds: who started the ranks (the run's layout_source tag), the job's id in its
# scheduler (the run's job_id tag), the node's name where it is not the host's (several Slurm nodes on
# one machine), and the command that requeues this job when a preemption warning comes (jobs/preempt.py).
LAUNCHER = "DDP_BENCH_LAUNCHER"
JOB_ID = "DDP_BENCH_JOB_ID"
NODE_NAME = "DDP_BENCH_NODE_NAME"
REQUEUE = "DDP_BENCH_REQUEUE"
# Where a backend emulates several nodes on one machine (cluster=local), every rank of the job shares
# the machine's GPUs: this rank's index among the ranks on its machine, and their number, so that the
# rank picks its GPU by these and not by its emulated node's LOCAL_RANK. Unset: LOCAL_RANK and
# LOCAL_WORLD_SIZE (one node per machine).
MACHINE_RANK = "DDP_BENCH_MACHINE_RANK"
MACHINE_RANKS = "DDP_BENCH_MACHINE_RANKS"
