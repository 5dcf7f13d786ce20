"""A cell's parallel layout as one value: how its ranks split the model and the data.

torchtitan's ``ParallelDims`` is the model. The rule that turns a strategy and a layout (nodes x
tasks) into degrees is :meth:`ParallelDims.of`, and it exists only here: the fit and the traffic
model (launcher/plan/), the forecasts (launcher/forecast/inputs.py), data sharding
(jobs/data.py through the worker), the summary's reductions (jobs/summary.py) and the FSDP mesh
(jobs.parallel.fsdp_mesh) all read the value it makes. A new variant (another HSDP split, a
model-parallel group) changes the rule; its consumers follow (tests/test_parallel_dims.py changes
the rule in one place and shows it).

Ranks are numbered as torch's ``init_device_mesh`` lays them out: the model-parallel degree
innermost, then the shard group, then the replicate group. Importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.spec import ConfigError, Layout, Sharding, Strategy, StrategySpec

REPLICATE, SHARD = "replicate", "shard"


@dataclass(frozen=True)
class Holds:
    """The share of the whole model's parameters, gradients and optimizer state one rank holds
    (before FSDP2's uneven last chunk: launcher/plan/fit.py counts the exact bytes)."""

    params: float
    grads: float
    optimizer: float


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of one cell's ranks, validated when made (errors name the setting)."""

    dp_replicate: int  # groups that hold the same shards and all-reduce their gradients
    dp_shard: int  # ranks one parameter is split over (FSDP's shard group)
    nodes: int = 1
    tasks_per_node: int = 1
    # Ranks that read the same batch (a tensor-, context- or pipeline-parallel group). No strategy
    # has one yet, so the rule gives 1; data sharding and the summary already read the
    # data-parallel degree, so a strategy that adds one changes the rule alone.
    model_parallel: int = 1
    # The FSDP device mesh's dimensions, outermost first; () where the model is not sharded by FSDP
    # (DDP needs no mesh).
    mesh_dims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError("nodes", self.nodes, "a cell runs on at least one node.", "use nodes=1 or more.")
        if self.tasks_per_node < 1:
            raise ConfigError("cluster.tasks_per_node", self.tasks_per_node, "a node runs at least one rank.",
                              "use cluster.tasks_per_node=1 or more.")
        for name in ("dp_replicate", "dp_shard", "model_parallel"):
            if getattr(self, name) < 1:
                raise ConfigError("strategy.sharding", name, f"gives a {name} degree of {getattr(self, name)}.",
                                  "every degree is 1 or more: pick another strategy.")
        if self.dp_replicate * self.dp_shard * self.model_parallel != self.world_size:
            raise ConfigError(
                "strategy.sharding", f"{self.dp_replicate}x{self.dp_shard}x{self.model_parallel}",
                f"replicate x shard x model-parallel degrees must cover the cell's {self.world_size} rank(s) "
                f"(nodes={self.nodes} x cluster.tasks_per_node={self.tasks_per_node}).",
                "change nodes or cluster.tasks_per_node, or pick a strategy whose groups divide them.")
        if any(d not in (REPLICATE, SHARD) for d in self.mesh_dims) or len(set(self.mesh_dims)) != len(self.mesh_dims):
            raise ConfigError("strategy.sharding", self.mesh_dims, "names a mesh dimension twice or one FSDP "
                              "does not know.", f"use {REPLICATE!r} and {SHARD!r}, each once.")

    @classmethod
    def of(cls, strategy: StrategySpec, layout: Layout) -> ParallelDims:
        """The rule: a strategy on ``layout.nodes`` x ``layout.tasks_per_node`` ranks.

        ddp: every rank replicates. fsdp full / grad_op: one shard group of every rank (a 1-D mesh).
        hybrid (HSDP): shard within a node, replicate across nodes. none: FSDP2 as DDP, a shard
        group of one on a 2-D mesh."""
        nodes, per_node = layout.nodes, layout.tasks_per_node
        world = nodes * per_node
        if strategy.name is Strategy.ddp:
            return cls(world, 1, nodes, per_node)
        if strategy.sharding is Sharding.hybrid:
            if nodes < 2:
                raise ConfigError("strategy", "hsdp", f"hybrid sharding replicates across nodes, and nodes={nodes}.",
                                  "use nodes=2 or more, or strategy=fsdp for one node.")
            return cls(nodes, per_node, nodes, per_node, mesh_dims=(REPLICATE, SHARD))
        if strategy.sharding is Sharding.none:
            return cls(world, 1, nodes, per_node, mesh_dims=(REPLICATE, SHARD))
        return cls(1, world, nodes, per_node, mesh_dims=(SHARD,))

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def data_parallel(self) -> int:
        """How many ranks read different batches: a sampler's replicas, the summary's samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def hybrid(self) -> bool:
        """Sharded within groups that are then replicated: gradients reduce-scattered in the shard
        group, then all-reduced across the replicas."""
        return self.dp_replicate > 1 and self.dp_shard > 1

    def holds(self) -> Holds:
        share = 1 / self.dp_shard
        return Holds(params=share, grads=share, optimizer=share)

    def data_rank(self, rank: int) -> int:
        """Which data-parallel replica global ``rank`` reads for (its model-parallel peers read
        the same batch)."""
        return rank // self.model_parallel

    def mesh_shape(self) -> tuple[int, ...]:
        """The FSDP mesh's sizes, in :attr:`mesh_dims` order."""
        sizes = {REPLICATE: self.dp_replicate, SHARD: self.dp_shard}
        return tuple(sizes[d] for d in self.mesh_dims)

    def group(self, kind: str) -> tuple[int, bool]:
        """(ranks, whether they span nodes) of the group a collective of ``kind`` runs over:
        all-gathers and reduce-scatters over the shard group; an all-reduce over the replicas
        under HSDP, else over every data-parallel rank."""
        if kind == "all_reduce" and self.hybrid:
            return self.dp_replicate, self.nodes > 1
        if kind == "all_reduce" or self.dp_shard == 1:
            return self.data_parallel, self.nodes > 1
        return self.dp_shard, self.dp_shard * self.model_parallel > self.tasks_per_node
