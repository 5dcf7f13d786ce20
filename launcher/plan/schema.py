"""The composed config: the worker's spec types plus what only the launcher needs.

Registered in Hydra's ConfigStore as ``config_schema``; conf/config.yaml lists it first in its
defaults, so every YAML value and command-line override is type-checked against these
dataclasses (Enum fields accept their member names). ``OmegaConf.to_object`` then builds the
objects, and :meth:`Config.validate` runs every check that needs no cluster.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from contract.datasets import image_folder_classes, token_file_samples
from contract.errors import non_negative, positive
from contract.parallel import ParallelDims
from contract.spec import (
    BatchNormUnits,
    CheckpointSpec,
    ConfigError,
    DataKind,
    DataSpec,
    InputKind,
    Layout,
    ModelSpec,
    Precision,
    PrecisionMode,
    PrecisionSpec,
    Strategy,
    StrategySpec,
    TrainSpec,
)
from launcher.cluster import registry
from launcher.plan.clusterschema import ClusterConfig, known_backend, settings_class
from launcher.plan.fit import gpu_mem_gib_of
from launcher.plan.shellsafe import check_config


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


AUTO = "auto"  # runs=auto

# The settings read only with runs=auto (refused with a number of runs): a command that runs a sweep's
# own grid once (python -m launcher.forecast) leaves them out with runs.
AUTO_ONLY = ("runs_min", "runs_max", "runs_budget_min", "baseline")
# The settings of cells=auto (the grid searched instead of swept, launcher/forecast/search.py): a
# command that runs cells one by one (python -m launcher.forecast) leaves them out.
SEARCH_ONLY = ("cells", "cells_max", "cells_budget_min")
CELLS_ALL = "all"


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
    runs: Any = AUTO  # the main job decides: runs=3 for fixed runs is one setting away
    runs_min: int = 3  # runs=auto: the first round's runs per grid point
    # runs=auto: no grid point runs more often. auto: the cluster's (12; on one machine with CPU ranks
    # 6, the rounds its 4-minute budget holds), at least runs_min; read through resolved_runs_max.
    runs_max: Any = AUTO
    # runs=auto: no round starts that would end after this (wall time, minutes). auto: the cluster's
    # (ClusterConfig.runs_budget_min: 60 on a cluster; on one machine with CPU ranks 4, a try-out
    # answered while you wait); None: no wall-time budget (runs_max alone bounds the sweep).
    runs_budget_min: Any = AUTO
    # runs=auto: a previous sweep directory; its configurations are compared with this sweep's (as
    # launcher.report --compare does), and those comparisons decide where runs are added too.
    baseline: str | None = None
    # "all": every cell of the grid runs; "auto": a pilot, then rounds that run only the cells whose
    # forecast can still beat the best measured at their scale (docs/deciding.md). Typed Any as runs.
    cells: Any = CELLS_ALL
    cells_max: int | None = None  # cells=auto: no more configurations (grid points) run, pilot included
    cells_budget_min: float | None = None  # cells=auto: no round starts that would end after this (wall time)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)

    @property
    def resolved_runs_max(self) -> int:
        """runs_max resolved: the number given, or the cluster's (ClusterConfig.runs_max), at least runs_min."""
        return max(self.runs_min, self.cluster.runs_max()) if self.runs_max == AUTO else self.runs_max

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
        positive("cluster.tasks_per_node", c.tasks_per_node, "use one task per rank, e.g. cluster.tasks_per_node=1.")
        non_negative("cluster.gpus_per_node", c.gpus_per_node, "use 0 for CPU ranks or the GPUs per node.")
        if isinstance(c.timeout_min, str) and c.timeout_min.strip().isdigit():  # a quoted number ("15")
            c.timeout_min = int(c.timeout_min)
        if c.timeout_min != AUTO and (isinstance(c.timeout_min, bool) or not isinstance(c.timeout_min, int)
                                      or c.timeout_min < 1):
            raise ConfigError("cluster.timeout_min", c.timeout_min, "is neither a whole number of minutes nor auto.",
                              "give the job's time limit in whole minutes (e.g. cluster.timeout_min=60), or auto "
                              "(each cell's own, from what its configuration used or is forecast to use: "
                              "docs/deciding.md).")
        positive("collective_timeout_s", self.collective_timeout_s, "use e.g. collective_timeout_s=300.")
        self._validate_runs()
        self._validate_cells()
        self._validate_limits()
        self.checkpoint.validate()
        if c.cpus_per_task is not None:
            positive("cluster.cpus_per_task", c.cpus_per_task, "use 1 or more, or drop it to derive it.")
        if c.gpus_per_node and c.tasks_per_node != c.gpus_per_node:
            raise ConfigError(
                "cluster.tasks_per_node", c.tasks_per_node,
                f"with cluster.gpus_per_node={c.gpus_per_node} the worker runs one rank per task and one task per GPU.",
                f"set cluster.tasks_per_node={c.gpus_per_node}.",
            )
        self._validate_precision_mode()
        self._validate_devices()
        self._validate_preset()
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
            positive("runs", self.runs, "use runs=3 (claims need the spread between independent runs), runs=auto, "
                      "or runs=1 for a quick look that claims nothing.")
            for key in AUTO_ONLY:
                if getattr(self, key) != getattr(Config, key):
                    raise ConfigError(key, getattr(self, key), f"is read only with runs=auto, and runs={self.runs}.",
                                      f"add runs=auto, or drop {key}"
                                      + (" (compare afterwards: python -m launcher.report --compare A B)."
                                         if key == "baseline" else "."))
            return
        if self.runs_min < 2:
            raise ConfigError("runs_min", self.runs_min, "gives the first round no spread between runs to decide with.",
                              "use runs_min=3 (the default) or at least 2.")
        if self.runs_max != AUTO and (isinstance(self.runs_max, bool) or not isinstance(self.runs_max, int)):
            raise ConfigError("runs_max", self.runs_max, "is neither a number of runs nor auto.",
                              f"use runs_max=auto (the cluster's: {self.cluster.runs_max()} here) or a whole number "
                              f"of at least runs_min={self.runs_min}.")
        if self.resolved_runs_max < self.runs_min:
            raise ConfigError("runs_max", self.runs_max, f"is below runs_min={self.runs_min}.",
                              f"set runs_max to at least {self.runs_min} (or auto), or lower runs_min.")
        if self.runs_budget_min is not None and self.runs_budget_min != AUTO:
            positive("runs_budget_min", self.runs_budget_min, "give the sweep's wall-time budget in minutes, auto "
                     "(the cluster's default), or null (runs_max alone limits the sweep).")
        if self.baseline is not None:
            import os

            if not os.path.isfile(os.path.join(self.baseline, "sweep.json")):
                raise ConfigError("baseline", self.baseline, "holds no sweep.json: it is not a sweep directory.",
                                  "give the directory a previous sweep printed (it holds sweep.json).")

    def _validate_preset(self) -> None:
        """A preset's promise kept on the cell's ranks: the degrees alone may be any FSDP2 layout, but
        strategy=hsdp promised a hybrid one (shard groups within a node, replicas across nodes)."""
        if self.strategy.preset != "hsdp":
            return
        nodes, tasks = self.nodes, self.cluster.tasks_per_node
        dims = ParallelDims.of(self.strategy, Layout(nodes=nodes, tasks_per_node=tasks))
        if not dims.hybrid:
            raise ConfigError("strategy", "hsdp", f"shards within a node and replicates across nodes, but on nodes="
                              f"{nodes} x cluster.tasks_per_node={tasks} it comes to {dims.dp_replicate} replica(s) of "
                              f"a shard group of {dims.dp_shard}: no hybrid (the preset needs nodes >= 2 and "
                              f"cluster.tasks_per_node >= 2).", "use nodes=2 or more with cluster.tasks_per_node=2 or "
                              "more, or strategy=fsdp (strategy=fsdp_noshard for replicas only).")

    def _validate_cells(self) -> None:
        """cells: all or auto; cells_max and cells_budget_min only with auto, each a real bound."""
        if self.cells not in (CELLS_ALL, AUTO):
            raise ConfigError("cells", self.cells, "is neither all nor auto.",
                              "use cells=auto (a pilot, then only the cells that can still win), or drop it (every "
                              "cell runs).")
        if self.cells != AUTO:
            for key in SEARCH_ONLY[1:]:
                if getattr(self, key) is not None:
                    raise ConfigError(key, getattr(self, key), f"is read only with cells=auto, and cells={self.cells}.",
                                      f"add cells=auto, or drop {key}.")
            return
        if self.cells_max is not None and (isinstance(self.cells_max, bool) or not isinstance(self.cells_max, int)
                                           or self.cells_max < 1):
            raise ConfigError("cells_max", self.cells_max, "must be a whole number of configurations of at least 1 "
                              "(the pilot's included).", "give the most configurations the search may run, e.g. "
                              "cells_max=12, or drop it (the grid's size bounds it).")
        if self.cells_budget_min is not None:
            positive("cells_budget_min", self.cells_budget_min, "give the search's wall-time budget in minutes, e.g. "
                      "cells_budget_min=60, or drop it.")

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
        positive("limits.budget_min", lim.budget_min, "give the longest wall time in minutes, e.g. 10080 (a week).")
        runs = self.resolved_runs_max if self.auto else self.runs
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
        if c.one_machine and not c.declared:
            check_local_ranks("nodes", self.nodes, self.nodes * c.tasks_per_node, lim.local_ranks_per_core,
                              f"x cluster.tasks_per_node={c.tasks_per_node} ")
        for setting, minutes in (("runs_budget_min", self.runs_budget_min), ("cells_budget_min", self.cells_budget_min),
                                 ("cluster.timeout_min", c.timeout_min)):
            if minutes is not None and minutes != AUTO and minutes > lim.budget_min:
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
        _check_settings_class(c)
        check_config(self)  # every value that reaches a script, a command line or a file name
        c.validate()  # the backend's own checks (launcher/cluster/NAME/settings.py)
        non_negative("cluster.signal_delay_s", c.signal_delay_s, "use e.g. 90 (seconds of warning before the limit).")
        for key in ("cost_per_device_hour", "cost_per_node_hour", "gpu_mem_gib"):
            if getattr(c, key) is not None:
                non_negative(f"cluster.{key}", getattr(c, key), "give a price per hour (or GiB) of 0 or more.")
        if c.mem_gb is not None:
            positive("cluster.mem_gb", c.mem_gb, "give the memory per node in GiB, or null for the default.")
        if not self.tracking.experiment.strip():
            raise ConfigError("tracking.experiment", self.tracking.experiment, "is empty.",
                              "name the MLflow experiment, e.g. tracking.experiment=ddp-vs-fsdp.")
        if c.declared:
            _check_declared(c)
        if self.health is not HealthMode.off and not c.excludes_nodes:
            raise ConfigError("health", self.health.value, f"excludes slow nodes with cluster.exclude, which cluster="
                              f"{c.name} (one machine) does not have.", "use health=auto with cluster=slurm, or probe "
                              "this machine with python -m launcher.health cluster=local health.nodes=3.")

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



def check_local_ranks(setting: str, value: Any, ranks: int, per_core: int, how: str = "") -> None:
    """One machine's bound (limits.local_ranks_per_core): at most ``per_core`` ranks per core, else
    the ranks would measure the machine's scheduler. The sweep's cells and launcher.health's emulated
    nodes alike; ``setting`` is what the user gave, ``how`` how it makes ``ranks``."""
    import os

    cores = os.cpu_count() or 1
    if ranks > per_core * cores:
        raise ConfigError(setting, value, f"{how}starts {ranks} ranks on this machine's {cores} core(s), beyond "
                          f"limits.local_ranks_per_core={per_core} per core: they would measure the machine's "
                          "scheduler.", f"use at most {per_core * cores} ranks here, cluster=slurm for more, or raise "
                          "limits.local_ranks_per_core.")


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


def _check_settings_class(c: ClusterConfig) -> None:
    """The backend is chosen with the group (cluster=NAME), which composes NAME's settings class:
    ``cluster.name`` changed alone would leave the settings of another backend."""
    if type(c) is not settings_class(known_backend(c.name, "cluster.name")):
        raise ConfigError("cluster.name", c.name, f"is not the backend these settings were composed for "
                          f"({type(c).__name__}): a backend is chosen with the config group, which brings its "
                          "own settings.", f"use cluster={c.name} instead of cluster.name={c.name}.")


def register() -> None:
    """The schema, and each backend's settings as the option ``NAME_schema`` of the cluster group
    (conf/cluster/NAME.yaml's first default): a composed ``cluster`` is its backend's class."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for name in registry.usable():  # a site's backend that cannot be imported: announced, left out
        store.store(group="cluster", name=f"{name}_schema", node=settings_class(name))
