"""The rendezvous port a job derives from its id, the same on every rank of the job: the local
executor's and Slurm's ranks (launcher/cluster/*/ranks.py) both derive MASTER_PORT from it, so it
lives here, shared, not in a backend's folder (Slurm's node-list syntax is Slurm's own:
launcher/cluster/slurm/nodelist.py).
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
