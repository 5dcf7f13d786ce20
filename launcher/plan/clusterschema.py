"""The cluster's settings every backend shares (``cluster.*``): which backend runs the cells, the
resources a cell asks for, its GPUs' model and memory, its prices. Which nodes a cell may use is
each backend's own (Slurm's partition, nodelist and exclude: launcher/cluster/slurm/settings.py):
a key of another backend is refused naming it. Each backend's own settings subclass
:class:`ClusterConfig` in its folder (``launcher/cluster/NAME/settings.py``), with their checks: the
composed config's ``cluster`` is the chosen backend's class (conf/cluster/NAME.yaml names it), so a
key another backend reads is refused by the schema itself. Imports no module of the launcher but the
backends' registry (launcher/cluster/registry.py): plan/schema.py composes it into Config."""

from __future__ import annotations

import dataclasses
import functools
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from contract.codec import to_plain
from contract.spec import ConfigError
from launcher.cluster import registry


def shell(kind: str, fix: str | None = None) -> dict[str, str]:
    """A field's metadata saying that its value reaches a script or a command line, and as what
    (launcher/plan/shellsafe.py: plain, word, line); ``fix``: how to write it instead."""
    return {"shell": kind, **({"fix": fix} if fix else {})}


@dataclass
class ClusterConfig:
    name: str = "local"  # the backend: a name in launcher/cluster/backends.py's registry
    tasks_per_node: int = 1  # one rank per task
    gpus_per_node: int = 0  # 0 = CPU ranks on gloo
    cpus_per_task: int | None = None  # None: this machine's cores / ranks per node (local)
    # The job's time limit in minutes, or auto: each cell's own, from what its configuration used or
    # is forecast to use on this cluster (launcher/forecast/timelimit.py). Typed Any: an int or "auto".
    timeout_min: Any = 60
    # Host memory per node: sbatch --mem on Slurm, a memory cgroup of mem_gb x nodes locally.
    mem_gb: float | None = None
    signal_delay_s: int = 90  # USR2 this long before the time limit (preemption warning)
    # Shell lines before the ranks start: modules, venv.
    setup: list[str] = field(default_factory=list, metadata=shell(
        "line", "give one list entry per command, e.g. cluster.setup='[module load cuda, source venv/bin/activate]'."))
    # The ranks' interpreter: a path and its arguments (default: this one); shell goes in setup lines.
    python: str | None = field(default=None, metadata=shell(
        "command", "give the interpreter's path (and its arguments), e.g. cluster.python=/opt/venv/bin/python; "
        "put what must run first (source, module load, export) in cluster.setup lines."))
    # Whole nodes per cell: a benchmark that shares a node measures its neighbours too (local cells
    # never share: they run one after another).
    exclusive: bool = True
    # The GPUs' model (e.g. h100). Shared, not a backend's own: a declared machine on any backend
    # reads it for its GPUs' memory (the fit check), and the noise floor's key names it. A live
    # cluster reads it only where its backend asks its scheduler for that model (``asks_gpu_type``:
    # Slurm's gres type, sbatch --gpus-per-node=<type>:<n>); elsewhere it is refused (validate).
    gpu_type: str | None = field(default=None, metadata=shell("plain"))
    # Prices, for cost_per_1m_samples / cost_per_1m_tokens: per device-hour (GPU, or CPU rank) or per
    # node-hour (the device price wins when both are set).
    cost_per_device_hour: float | None = None
    cost_per_node_hour: float | None = None
    # GPU memory per GPU: a cell whose predicted model state exceeds it is refused before submission.
    # None: known from gpu_type, the partition's GPU type (sinfo's gres) or the local GPUs (nvidia-smi).
    gpu_mem_gib: float | None = None
    # Nodes declared, not asked: --plan checks the cells against these settings alone (GPUs per node,
    # cluster.gpu_mem_gib or cluster.gpu_type), without sinfo, scontrol or nvidia-smi, so that a laptop
    # can ask "does it fit on 24 GB GPUs?". Such a grid is planned, never submitted.
    declared: bool = False

    # Whether every node of a cell is a group of ranks on this machine: planning emulates the nodes
    # and shares the machine's cores among all ranks.
    one_machine: ClassVar[bool] = False
    # Whether the backend can keep slow nodes out of a sweep (health=auto: Backend.excluding).
    excludes_nodes: ClassVar[bool] = False
    # Whether the backend asks its scheduler for cluster.gpu_type's GPUs (else only declared nodes read it).
    asks_gpu_type: ClassVar[bool] = False

    @classmethod
    def subtype_for(cls, data: Mapping[str, Any]) -> type[ClusterConfig]:
        """The settings class of the backend ``data`` names: how sweep.json's cells and a composed
        config's keys are read (contract/codec.py, launcher/plan/schemakeys.py)."""
        return settings_class(known_backend(str(data.get("name", cls.name))))

    @classmethod
    def variant(cls, data: Mapping[str, Any]) -> tuple[type[ClusterConfig], dict[str, Any]]:
        """The class a record (sweep.json's cell) is read as, and the record without the keys of other
        backends left at their defaults: an earlier version kept every backend's keys in one class."""
        sub = cls.subtype_for(data)
        own, foreign = _keys_of(sub.name)
        return sub, {k: v for k, v in data.items() if k in own or foreign.get(k, object()) != v}

    @classmethod
    def subtypes(cls) -> list[type[ClusterConfig]]:
        """The settings classes a field of this type may hold: every backend's for ClusterConfig (the
        keys ``cluster.*`` may hold somewhere), only itself for a backend's own."""
        if cls is not ClusterConfig:
            return [cls]
        return [settings_class(name) for name in registry.usable()]  # a broken site backend left out, announced

    @property
    def cpu_tryout(self) -> bool:
        """CPU ranks on one machine: a try-out of the tool, answered while its user waits."""
        return self.one_machine and self.gpus_per_node == 0

    def runs_budget_min(self) -> float:
        """runs_budget_min=auto: the wall time a runs=auto sweep may spend here, in minutes: a
        cluster's hour; on a CPU try-out 4 (the README's main job in two to four minutes)."""
        return 4.0 if self.cpu_tryout else 60.0

    def runs_max(self) -> int:
        """runs_max=auto: runs=auto's most runs per grid point here (looks at 3, 6, 12); on a CPU
        try-out 6 (looks at 3, 6): its 4 minutes hold two rounds of the main job, and a third look
        planned but never reached would keep its share of the 5% unspent (launcher/report/sequential.py)."""
        return 6 if self.cpu_tryout else 12

    def validate(self) -> None:
        """The backend's own checks of its settings, before anything is created; the shared ones
        (ranges, prices, declared nodes) are plan/schema.py's. A backend that overrides it calls it."""
        refuse_gpu_type(self)

    def pool(self) -> str | None:
        """The named group of nodes the cells draw from, as the user named it (Slurm: the partition);
        None: the cluster's default, or this machine. Probes and their records are kept per pool."""
        return None

    def pool_words(self) -> str:
        """That group in words, as the health probe's messages and a sweep's report say it (Slurm:
        ``partition gpu``), so no shared record or message names another backend's key."""
        return "this machine" if self.one_machine else f"cluster={self.name}"

    def python_command(self) -> str:
        """The interpreter command a cell's ranks run with: cluster.python, or this one."""
        return self.python or shlex.quote(sys.executable)

    def software(self) -> str:
        """The container the ranks run in, as the fabric record's identity names it: none here."""
        return "none:"


def known_backend(name: str, setting: str = "cluster") -> str:
    """``name`` when the registry has a backend of that name; else the refusal, naming ``setting``."""
    if name not in registry.known():
        raise ConfigError(setting, name, "names no backend known here.",
                          f"use one of {', '.join(f'cluster={n}' for n in sorted(registry.known()))}, or add a "
                          "backend (docs/backends.md).")
    registry.check(name, setting)  # a site's entry point that takes a built-in's name
    return name


@functools.cache
def settings_class(name: str) -> type[ClusterConfig]:
    """The settings of backend ``name`` (its ``settings.py``): what ``cluster.*`` may hold there."""
    found = registry.load(name, "settings")
    if not issubclass(found, ClusterConfig):
        raise TypeError(f"{found.__module__}.{found.__name__} is no ClusterConfig: a backend's settings subclass it")
    return found


@functools.cache
def _keys_of(name: str) -> tuple[frozenset[str], dict[str, Any]]:
    """The keys of backend ``name``'s settings, and the other backends' keys with their defaults (as
    written): read once per backend, for a sweep document of a thousand cells."""
    own = frozenset(f.name for f in dataclasses.fields(settings_class(name)))
    foreign = {name: to_plain(value) for other in ClusterConfig.subtypes()
               for name, value in dataclasses.asdict(other()).items() if name not in own}
    return own, foreign


def refuse_gpu_type(c: ClusterConfig) -> None:
    """A GPU model that no scheduler is asked for would be silently dropped: refused instead. A
    declared machine's cluster.gpu_type says its GPUs' memory (nothing asks a scheduler for it)."""
    if c.gpu_type is None or c.declared or c.asks_gpu_type:
        return
    asking = [n for n in registry.usable() if settings_class(n).asks_gpu_type]
    why = ("names nodes, and cluster={} runs every rank on this machine" if c.one_machine
           else "names a GPU model, and cluster={} asks its scheduler for none").format(c.name)
    raise ConfigError("cluster.gpu_type", to_plain(c.gpu_type), f"{why}: nothing would read it.",
                      "drop cluster.gpu_type, or " + " or ".join(f"use cluster={n}" for n in asking)
                      + " (a cluster with nodes); cluster.declared=true reads it for its GPUs' memory (--plan).")
