"""The composed config: the worker's spec types plus what only the launcher needs.

Registered in Hydra's ConfigStore as ``config_schema``; conf/config.yaml lists it first in its
defaults, so every YAML value and command-line override is type-checked against these
dataclasses (Enum fields accept their member names). ``OmegaConf.to_object`` then builds the
objects, and :meth:`Config.validate` runs every check that needs no cluster.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from contract.codec import to_plain
from contract.datasets import image_folder_classes, token_file_samples
from contract.spec import (
    BatchNormUnits,
    CheckpointSpec,
    ConfigError,
    DataKind,
    DataSpec,
    InputKind,
    ModelSpec,
    Precision,
    PrecisionMode,
    PrecisionSpec,
    Strategy,
    StrategySpec,
    TrainSpec,
    _non_negative,
    _positive,
)
from launcher.plan.fit import gpu_mem_gib_of
from launcher.plan.shellsafe import check_config


class ClusterKind(enum.Enum):
    local = "local"  # submitit's LocalExecutor: real processes on this machine
    slurm = "slurm"
    torchrun = "torchrun"  # one machine, each cell's ranks under torchrun (python -m jobs spec.json)

    @property
    def one_machine(self) -> bool:
        """Whether every node of a cell is a group of ranks on this machine: planning emulates the nodes
        and shares the machine's cores among all ranks. (What else differs is the backend's:
        launcher/cluster/base.py.)"""
        return self in (ClusterKind.local, ClusterKind.torchrun)


class ContainerRuntime(enum.Enum):
    none = "none"
    pyxis = "pyxis"  # srun --container-image (enroot)
    apptainer = "apptainer"  # apptainer exec <image> python ...
    oci = "oci"  # srun --container=<OCI bundle directory>: Slurm's own OCI support (oci.conf, runc)


@dataclass
class ContainerConfig:
    runtime: ContainerRuntime = ContainerRuntime.none
    image: str | None = None
    mounts: list[str] = field(default_factory=list)


def _check_oci_bundle(container: ContainerConfig) -> None:
    """Slurm's OCI mode runs each task in a bundle directory on a shared file system: one the login
    node cannot see is one the nodes will not run, so it is refused here, before sbatch."""
    import os

    bundle = str(container.image)
    if not os.path.isfile(os.path.join(bundle, "config.json")):
        raise ConfigError("cluster.container.image", bundle, "is not an OCI bundle (a directory with config.json and "
                          "rootfs/), which cluster.container.runtime=oci runs each task in.",
                          "make one from the worker image: scripts/oci-bundle localhost/ddp-fsdp-bench:cpu "
                          "/shared/bundles/cpu /shared (see docker/README.md), and give its directory.")
    if container.mounts:
        raise ConfigError("cluster.container.mounts", container.mounts, "is not read in the oci mode: the bundle's "
                          "config.json holds its mounts.", "pass the directories to scripts/oci-bundle instead.")


@dataclass
class ClusterConfig:
    name: ClusterKind = ClusterKind.local
    tasks_per_node: int = 1  # one rank per task
    gpus_per_node: int = 0  # 0 = CPU ranks on gloo
    cpus_per_task: int | None = None  # None: this machine's cores / ranks per node (local)
    timeout_min: int = 60
    # Host memory per node: sbatch --mem on Slurm, a memory cgroup of mem_gb x nodes locally.
    mem_gb: float | None = None
    signal_delay_s: int = 90  # USR2 this long before the time limit (preemption warning)
    setup: list[str] = field(default_factory=list)  # shell lines before the ranks start: modules, venv
    python: str | None = None  # interpreter of the ranks; default: this one
    # Whole nodes per cell: a benchmark that shares a node measures its neighbours too (local cells
    # never share: they run one after another).
    exclusive: bool = True
    # Slurm only (submitit's parameter names where they exist); refused on cluster=local.
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    nodelist: str | None = None  # sbatch --nodelist: these nodes (at least), e.g. "node[1-2]"
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    srun_args: list[str] = field(default_factory=list)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    array_parallelism: int = 64
    # Prices, for cost_per_1m_samples / cost_per_1m_tokens: per device-hour (GPU, or CPU rank) or per
    # node-hour (the device price wins when both are set).
    cost_per_device_hour: float | None = None
    cost_per_node_hour: float | None = None
    # GPU memory per GPU: a cell whose predicted model state exceeds it is refused before submission.
    # None: known from gpu_type, the partition's GPU type (sinfo's gres) or the local GPUs (nvidia-smi).
    gpu_mem_gib: float | None = None
    # The GPU model to ask Slurm for, as its gres type (e.g. h100): sbatch --gpus-per-node=<type>:<n>.
    gpu_type: str | None = None
    # Largest job array per sbatch call; None: the cluster's MaxArraySize (scontrol show config).
    max_array_size: int | None = None
    # Nodes declared, not asked: --plan checks the cells against these settings alone (GPUs per node,
    # cluster.gpu_mem_gib or cluster.gpu_type), without sinfo, scontrol or nvidia-smi, so that a laptop
    # can ask "does it fit on 24 GB GPUs?". Such a grid is planned, never submitted.
    declared: bool = False


class FabricProbe(enum.Enum):
    auto = "auto"  # probe a shape when no fabric kept for this cluster, shape and software matches
    always = "always"  # probe every shape of the sweep again
    off = "off"


@dataclass
class FabricConfig:
    """The fabric probe (jobs/fabric.py), a job per shape before the cells (docs/fabric.md)."""

    probe: FabricProbe = FabricProbe.auto
    # The full range: every power of two from 1 KiB to 64 MiB (CPU) or 1 GiB (GPU), 20 iterations;
    # otherwise steps of 4 up to 4 MiB (CPU) or 256 MiB (GPU), 5 iterations: seconds on CPU.
    full: bool = False


class HealthMode(enum.Enum):
    off = "off"
    # The partition's nodes judged before the cells (python -m launcher.health), the slow ones kept out:
    auto = "auto"  # by the ledger's latest probe when it is recent (launcher/healthprobe.py), else a new probe
    always = "always"  # by a new probe


@dataclass
class LimitsConfig:
    """Bounds on the work one command may start, checked before anything runs (docs/configuration.md,
    Limits). Each refusal names the limit and the setting here that raises it."""

    runs: int = 50  # runs per grid point: fixed runs, and runs=auto's runs_max
    looks: int = 8  # runs=auto's planned looks (each look spends alpha: more looks, smaller levels)
    cells: int = 1000  # cells per sweep (grid points x runs)
    nodes: int = 1024  # nodes per cell, on any cluster
    local_ranks_per_core: int = 8  # cluster=local: ranks per core of this machine (they share its cores)
    budget_min: float = 10080.0  # wall-time budgets (runs_budget_min) and cluster.timeout_min: a week


@dataclass
class TrackingConfig:
    enabled: bool = True
    # None: sqlite:///<output_root>/mlflow.db, MLflow's own default store type.
    uri: str | None = None
    experiment: str = "ddp-vs-fsdp"



@dataclass
class Config(TrainSpec):
    strategy: StrategySpec = field(default_factory=StrategySpec)
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    health: HealthMode = HealthMode.off  # auto: the nodes probed before the cells, slow ones excluded (docs/health.md)
    output_root: str = "outputs"
    sweep_dir: str | None = None  # default: <output_root>/<date>_<time>
    # Block until every job ends. None: yes on the local cluster, no on Slurm (fire-and-forget).
    wait: bool | None = None
    collective_timeout_s: float = 300.0
    # Submit cells predicted not to fit in cluster.gpu_mem_gib anyway.
    allow_oom: bool = False
    # Independent launches of every grid point (separate processes; on Slurm separate array tasks):
    # the noise every claim is judged against is the spread between them (launcher/report/findings.py).
    # An int, or "auto": runs_min first, then rounds that add runs only where a comparison is still
    # open, until decided, runs_max or the budget (launcher/decide.py). Typed Any: OmegaConf 2.3 has
    # no int-or-str union; validate() accepts exactly these two forms.
    runs: Any = 3
    runs_min: int = 3  # runs=auto: the first round's runs per grid point
    runs_max: int = 12  # runs=auto: no grid point runs more often
    runs_budget_min: float | None = None  # runs=auto: no round starts that would end after this (wall time)
    # runs=auto: a previous sweep directory; its configurations are compared with this sweep's (as
    # launcher.report --compare does), and those comparisons decide where runs are added too.
    baseline: str | None = None
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)

    @property
    def auto(self) -> bool:
        return self.runs == AUTO

    @property
    def first_runs(self) -> int:
        """The runs of every grid point in the first (for fixed runs: the only) round."""
        return self.runs_min if self.auto else int(self.runs)

    def validate(self) -> None:
        TrainSpec.validate(self)
        self.strategy.validate()
        self.precision.validate()
        self.model.validate()
        self.data.validate()
        c = self.cluster
        _positive("cluster.tasks_per_node", c.tasks_per_node, "use one task per rank, e.g. cluster.tasks_per_node=1.")
        _non_negative("cluster.gpus_per_node", c.gpus_per_node, "use 0 for CPU ranks or the GPUs per node.")
        _positive("cluster.timeout_min", c.timeout_min, "give the job's time limit in minutes.")
        _positive("collective_timeout_s", self.collective_timeout_s, "use e.g. collective_timeout_s=300.")
        self._validate_runs()
        self._validate_limits()
        self.checkpoint.validate()
        if c.cpus_per_task is not None:
            _positive("cluster.cpus_per_task", c.cpus_per_task, "use 1 or more, or drop it to derive it.")
        if c.gpus_per_node and c.tasks_per_node != c.gpus_per_node:
            raise ConfigError(
                "cluster.tasks_per_node", c.tasks_per_node,
                f"with cluster.gpus_per_node={c.gpus_per_node} the worker runs one rank per task and one task per GPU.",
                f"set cluster.tasks_per_node={c.gpus_per_node}.",
            )
        self._validate_precision_mode()
        self._validate_devices()
        self.tuning()
        self._validate_data()
        self._validate_cluster_settings()

    def tuning(self):
        """The step's tuning settings resolved for this cell's device (contract/tuning.py): a value
        the device cannot run is refused here, before submission."""
        from contract import tuning

        return tuning.resolve(self, self.strategy, self.model, cuda=self.cluster.gpus_per_node > 0,
                              world_size=self.nodes * self.cluster.tasks_per_node,
                              tasks_per_node=self.cluster.tasks_per_node)

    def _validate_runs(self) -> None:
        """runs: a positive int or auto; the auto settings only with auto, and a plan they can keep."""
        if not self.auto:
            if isinstance(self.runs, bool) or not isinstance(self.runs, int):
                raise ConfigError("runs", self.runs, "is neither a number of runs nor auto.",
                                  "use runs=auto (runs added where a comparison is still open), runs=3, or runs=1 "
                                  "for a quick look that claims nothing.")
            _positive("runs", self.runs, "use runs=3 (claims need the spread between independent runs), runs=auto, "
                      "or runs=1 for a quick look that claims nothing.")
            for key in ("runs_min", "runs_max", "runs_budget_min", "baseline"):
                if getattr(self, key) != getattr(Config, key):
                    raise ConfigError(key, getattr(self, key), f"is read only with runs=auto, and runs={self.runs}.",
                                      f"add runs=auto, or drop {key}"
                                      + (" (compare afterwards: python -m launcher.report --compare A B)."
                                         if key == "baseline" else "."))
            return
        if self.runs_min < 2:
            raise ConfigError("runs_min", self.runs_min, "gives the first round no spread between runs to decide with.",
                              "use runs_min=3 (the default) or at least 2.")
        if self.runs_max < self.runs_min:
            raise ConfigError("runs_max", self.runs_max, f"is below runs_min={self.runs_min}.",
                              f"set runs_max to at least {self.runs_min} (default 12), or lower runs_min.")
        if self.runs_budget_min is not None:
            _positive("runs_budget_min", self.runs_budget_min, "give the sweep's wall-time budget in minutes, or "
                      "drop it (runs_max alone limits the sweep).")
        if self.baseline is not None:
            import os

            if not os.path.isfile(os.path.join(self.baseline, "sweep.json")):
                raise ConfigError("baseline", self.baseline, "holds no sweep.json: it is not a sweep directory.",
                                  "give the directory a previous sweep printed (it holds sweep.json).")

    def _validate_limits(self) -> None:
        """The work one grid point may start, bounded before anything runs (the cells per sweep are
        bounded by launcher/plan/grid.py, which sees them all)."""
        lim = self.limits
        for key in ("runs", "looks", "cells", "nodes", "local_ranks_per_core"):
            value = getattr(lim, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"limits.{key}", value, "must be a whole number of at least 1.",
                                  f"raise limits.{key} to the bound you mean, or drop it for the default "
                                  f"({getattr(LimitsConfig, key)}).")
        _positive("limits.budget_min", lim.budget_min, "give the longest wall time in minutes, e.g. 10080 (a week).")
        runs = self.runs_max if self.auto else self.runs
        setting = "runs_max" if self.auto else "runs"
        if runs > lim.runs:
            raise ConfigError(setting, runs, f"is beyond limits.runs={lim.runs} runs per grid point"
                              + (" (every run more splits the looks' alpha further)" if self.auto else "") + ".",
                              f"use {setting}={min(runs, lim.runs)} or fewer, or raise limits.runs={runs} if you "
                              "mean it.")
        # limits.looks: launcher/preflight.py, which may read the looks' schedule (launcher/report).
        if self.nodes > lim.nodes:
            raise ConfigError("nodes", self.nodes, f"is beyond limits.nodes={lim.nodes} nodes per cell.",
                              f"use fewer nodes, or raise limits.nodes={self.nodes} if the cluster has them.")
        c = self.cluster
        if c.name.one_machine and not c.declared:
            import os

            cores = os.cpu_count() or 1
            ranks = self.nodes * c.tasks_per_node
            if ranks > lim.local_ranks_per_core * cores:
                raise ConfigError("nodes", self.nodes, f"x cluster.tasks_per_node={c.tasks_per_node} starts {ranks} "
                                  f"ranks on this machine's {cores} core(s), beyond limits.local_ranks_per_core="
                                  f"{lim.local_ranks_per_core} per core: they would measure the machine's scheduler.",
                                  f"use at most {lim.local_ranks_per_core * cores} ranks here, cluster=slurm for more, "
                                  f"or raise limits.local_ranks_per_core.")
        for setting, minutes in (("runs_budget_min", self.runs_budget_min), ("cluster.timeout_min", c.timeout_min)):
            if minutes is not None and minutes > lim.budget_min:
                raise ConfigError(setting, minutes, f"is beyond limits.budget_min={lim.budget_min:g} minutes.",
                                  f"use a shorter time, or raise limits.budget_min={minutes:g} if you mean it.")

    def _validate_devices(self) -> None:
        """Settings that need nodes of a kind: several nodes, or GPUs (the device follows gpus_per_node)."""
        c, s = self.cluster, self.strategy
        on_cpu = c.gpus_per_node == 0
        if s.cpu_offload and on_cpu:
            raise ConfigError(
                "strategy.cpu_offload", True,
                "CPU offload moves parameters from an accelerator to host memory; these ranks run on the CPU already "
                "(PyTorch refuses it without an accelerator).",
                "drop the offload (strategy=fsdp) or run on GPU nodes (cluster.gpus_per_node>0).",
            )
        if self.precision.name is Precision.fp16 and on_cpu:
            raise ConfigError(
                "precision", "fp16",
                "fp16 is a GPU mode; on CPU it is emulated (convolution backward about 150x slower than fp32), "
                "so its numbers would mislead.",
                "use precision=bf16 on CPU, or fp16 on GPU nodes (cluster.gpus_per_node>0).",
            )
        if self.sync_batchnorm and on_cpu:
            raise ConfigError(
                "sync_batchnorm", True,
                "PyTorch's SyncBatchNorm refuses CPU input (\"expected input tensor to be on GPU\"), and these ranks "
                "run on the CPU.",
                "drop it (sync_batchnorm=false: each rank normalises over its own batch) or run on GPU nodes "
                "(cluster.gpus_per_node>0).",
            )

    def _validate_cluster_settings(self) -> None:
        """What reaches sbatch or MLflow: plain values, ranges, an image for a container runtime."""
        c = self.cluster
        check_config(self)  # every value that reaches a script, a command line or a file name
        if c.name.one_machine:
            _refuse_slurm_only(c)
        _non_negative("cluster.signal_delay_s", c.signal_delay_s, "use e.g. 90 (seconds of warning before the limit).")
        for key in ("cost_per_device_hour", "cost_per_node_hour", "gpu_mem_gib"):
            if getattr(c, key) is not None:
                _non_negative(f"cluster.{key}", getattr(c, key), "give a price per hour (or GiB) of 0 or more.")
        if c.mem_gb is not None:
            _positive("cluster.mem_gb", c.mem_gb, "give the memory per node in GiB, or null for the default.")
        if not self.tracking.experiment.strip():
            raise ConfigError("tracking.experiment", self.tracking.experiment, "is empty.",
                              "name the MLflow experiment, e.g. tracking.experiment=ddp-vs-fsdp.")
        if c.container.runtime is not None and c.container.runtime.value != "none" and not c.container.image:
            raise ConfigError("cluster.container.image", None,
                              f"cluster.container.runtime={c.container.runtime.value} needs an image.",
                              "set cluster.container.image to the worker image (see docker/).")
        if c.container.runtime is ContainerRuntime.oci:
            _check_oci_bundle(c.container)
        if c.declared:
            _check_declared(c)
        if self.health is not HealthMode.off and c.name is ClusterKind.local:
            raise ConfigError("health", self.health.value, "excludes slow nodes with cluster.exclude, which the local cluster "
                              "(one machine) does not have.", "use health=auto with cluster=slurm, or probe this "
                              "machine with python -m launcher.health cluster=local health.nodes=3.")

    def _validate_precision_mode(self) -> None:
        """Settings that only FSDP's parameter casting reads."""
        p = self.precision
        if p.mode is PrecisionMode.params and self.strategy.name is Strategy.ddp:
            raise ConfigError("precision.mode", "params", "casting parameters to the low dtype is FSDP's "
                              "MixedPrecisionPolicy; DDP has no public equivalent.",
                              "use precision.mode=autocast (the default; the same numerics under DDP and FSDP), or an "
                              "FSDP strategy.")
        if p.batchnorm is not BatchNormUnits.unit and p.mode is not PrecisionMode.params:
            raise ConfigError("precision.batchnorm", p.batchnorm.value, "only FSDP with precision.mode=params shards "
                              "BatchNorms apart (under autocast they stay fp32 in their blocks); nothing would read it.",
                              "drop it, or add precision.mode=params with an FSDP strategy.")

    def _validate_data(self) -> None:
        """A dataset that fits the model and the ranks (DataSpec.validate has checked the path exists)."""
        d, m = self.data, self.model
        needs = {DataKind.token_file: InputKind.tokens, DataKind.image_folder: InputKind.image}.get(d.kind)
        if needs is not None and m.input is not needs:
            raise ConfigError(
                "data", d.kind.value, f"it feeds {needs.value} to the model, and model.input={m.input.value}.",
                f"use a model that takes {needs.value} (model.input={needs.value})"
                + (", e.g. model=gpt_tiny." if needs is InputKind.tokens else ", e.g. model=cnn or model=resnet50."),
            )
        ranks = self.nodes * self.cluster.tasks_per_node
        if d.kind is DataKind.token_file:
            samples = token_file_samples(d.path or "", m.seq_len)  # DataSpec.validate: set for this kind
            if samples // ranks < self.batch_size:
                raise ConfigError(
                    "data.path", d.path,
                    f"holds {samples} samples of model.seq_len+1={m.seq_len + 1} tokens: {samples // ranks} per rank "
                    f"for {ranks} ranks, fewer than batch_size={self.batch_size}.",
                    "use a larger token file, or lower batch_size or model.seq_len.",
                )
        if d.kind is DataKind.image_folder:
            classes = image_folder_classes(d.path or "")
            if not classes or len(classes) > m.num_classes:
                raise ConfigError(
                    "data.path", d.path,
                    f"has {len(classes)} class subdirectories and model.num_classes={m.num_classes}.",
                    "give a directory <path>/<class>/<image> with at least one class, and set model.num_classes "
                    f"to at least its number of classes ({len(classes)}).",
                )


AUTO = "auto"  # runs=auto
SLURM_ONLY = ("partition", "account", "qos", "constraint", "exclude", "nodelist", "additional_parameters", "srun_args",
              "container", "array_parallelism", "max_array_size", "gpu_type")


def _refuse_slurm_only(c: ClusterConfig) -> None:
    """A Slurm setting on the local cluster would be silently dropped: refuse it instead. A declared
    machine's cluster.gpu_type says its GPUs' memory (nothing asks Slurm for it)."""
    default = ClusterConfig()
    for key in SLURM_ONLY:
        if key == "gpu_type" and c.declared:
            continue
        if getattr(c, key) != getattr(default, key):
            raise ConfigError(f"cluster.{key}", to_plain(getattr(c, key)),
                              "only Slurm reads it, and this cell runs on cluster=local (processes on this machine).",
                              f"drop cluster.{key}, or use cluster=slurm.")


def declared_gpu_mem_gib(c: ClusterConfig) -> float | None:
    """The memory of a declared node's GPUs: cluster.gpu_mem_gib, or what cluster.gpu_type holds."""
    return c.gpu_mem_gib or (gpu_mem_gib_of(c.gpu_type) if c.gpu_type else None)


def _check_declared(c: ClusterConfig) -> None:
    """Declared GPUs must say their memory: nothing will be asked, and the fit check needs it."""
    if c.gpus_per_node and not declared_gpu_mem_gib(c):
        named = (f"cluster.gpu_type={c.gpu_type} names no GPU model whose memory is known"
                 if c.gpu_type else "neither cluster.gpu_mem_gib nor cluster.gpu_type is set")
        raise ConfigError("cluster.declared", True, f"declares {c.gpus_per_node} GPU(s) per node, and {named}: the "
                          "fit check would have nothing to check against.",
                          "give the memory per GPU, e.g. cluster.gpu_mem_gib=22.35 (a 24 GB card), or a known "
                          "cluster.gpu_type (h100, h200, a100_80g, a100_40g, l40s, a10g, l4, t4, v100_32g, mi300x).")


# ---- the schema's keys: strict overrides, open dicts, finite numbers -------------------------

@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls: type, name: str) -> Any:
    """The type hint of dataclass ``cls``'s field ``name``; None when it has no such field."""
    return _hints(cls).get(name)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_open(tp: Any) -> bool:
    """A dict-typed field (model.params, cluster.additional_parameters): any key may go in it."""
    tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp) if typing.get_origin(tp) is Union else tp
    return typing.get_origin(tp) in (dict, dict) or tp is dict


@functools.cache
def schema_keys(cls: type | None = None, prefix: str = "") -> dict[str, bool]:
    """{dotted key: is an open dict} for every key of the schema (Config by default)."""
    out: dict[str, bool] = {}
    for name, tp in _hints(cls or Config).items():
        key = prefix + name
        out[key] = _is_open(tp)
        if _is_dataclass_type(tp):
            out.update(schema_keys(tp, key + "."))
    return out


def unknown_keys(tree: Any, cls: type | None = None, prefix: str = "") -> list[str]:
    """Keys of a composed config (plain dicts) that the schema does not have; open dicts are not looked into."""
    hints = _hints(cls or Config)
    found = []
    for key, value in (tree or {}).items():
        if key not in hints:
            found.append(prefix + str(key))
        elif _is_dataclass_type(hints[key]) and isinstance(value, dict):
            found.extend(unknown_keys(value, hints[key], f"{prefix}{key}."))
    return found


def did_you_mean(key: str) -> str:
    """The closest valid key, as a hint: "did you mean strategy.bucket_cap_mb?" (or the group's keys)."""
    keys = list(schema_keys())
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    parent = key.rpartition(".")[0]
    siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
    return f"valid keys{' of ' + parent if parent else ''}: {', '.join(siblings)}."


def non_finite(obj: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is a float NaN or infinity (a YAML .nan, or lr=nan on the command line)."""
    if dataclasses.is_dataclass(obj):
        return [k for f in dataclasses.fields(obj) for k in non_finite(getattr(obj, f.name), f"{prefix}{f.name}.")]
    if isinstance(obj, dict):
        return [k for name, v in obj.items() for k in non_finite(v, f"{prefix}{name}.")]
    if isinstance(obj, list):
        return [k for i, v in enumerate(obj) for k in non_finite(v, f"{prefix}{i}.")]
    return [prefix[:-1]] if isinstance(obj, float) and not math.isfinite(obj) else []


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="config_schema", node=Config)
