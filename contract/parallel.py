"""A cell's parallel layout as one value: how its ranks split the model and the data.

torchtitan's ``ParallelDims`` is the model. The strategy carries the degrees (data-parallel
replicate and shard, tensor parallel; -1 for the ranks the others leave: StrategySpec in
contract/spec.py); :meth:`ParallelDims.of` resolves them against a layout (nodes x tasks) and checks
them, and it exists only here: the fit and the traffic model (launcher/plan/), the forecasts
(launcher/forecast/inputs.py), the learning rate's scaling and data sharding (the worker), the
summary's reductions (jobs/summary.py) and the FSDP mesh (jobs.parallel.fsdp_mesh) all read the
value it makes. A new variant changes the rule; its consumers follow (tests/test_parallel_dims.py
changes the rule in one place and shows it).

Ranks are numbered as torch's ``init_device_mesh`` lays them out: the tensor-parallel degree
innermost, then the shard group, then the replicate group. Importable without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from contract.choices import Strategy
from contract.errors import ConfigError, non_negative, positive

REPLICATE, SHARD = "replicate", "shard"


@dataclass
class Layout:
    """The resources one grid point runs on, as the launcher planned them."""

    nodes: int = 1
    tasks_per_node: int = 1
    # 0: CPU ranks on gloo. N > 0: CUDA ranks on NCCL, one GPU each (jobs.dist.choose_device);
    # the worker follows this, never torch.cuda.is_available() alone.
    gpus_per_node: int = 0
    cpus_per_task: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def validate(self) -> None:
        positive("layout.nodes", self.nodes, "use nodes=1 or more.")
        positive("layout.tasks_per_node", self.tasks_per_node, "use one task per rank, e.g. 1.")
        non_negative("layout.gpus_per_node", self.gpus_per_node, "use 0 for CPU ranks or the GPUs per node.")
        positive("layout.cpus_per_task", self.cpus_per_task, "use 1 or more.")


class Degrees(Protocol):
    """What the rule reads of a strategy (contract.spec.StrategySpec): its wrapper and its degrees."""

    name: Strategy

    def degrees(self) -> dict[str, int]: ...


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
    # Ranks that read the same batch (a tensor-parallel group): data sharding, the learning rate
    # and the summary read the data-parallel degree, which leaves them out.
    tp: int = 1
    # The FSDP device mesh's dimensions, outermost first; () where the model is not sharded by FSDP
    # (DDP needs no mesh).
    mesh_dims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError("nodes", self.nodes, "a cell runs on at least one node.", "use nodes=1 or more.")
        if self.tasks_per_node < 1:
            raise ConfigError("cluster.tasks_per_node", self.tasks_per_node, "a node runs at least one rank.",
                              "use cluster.tasks_per_node=1 or more.")
        for name in ("dp_replicate", "dp_shard", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"strategy.{name}", getattr(self, name), "a resolved degree is 1 or more.",
                                  f"use strategy.{name}=1 or more, or -1 for the ranks the others leave.")
        if self.dp_replicate * self.dp_shard * self.tp != self.world_size:
            raise ConfigError(
                "strategy", f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp}",
                f"the degrees must cover the cell's {self.world_size} rank(s) "
                f"(nodes={self.nodes} x cluster.tasks_per_node={self.tasks_per_node}).",
                "set one degree to -1 (the ranks the others leave), or change nodes or cluster.tasks_per_node.")
        if any(d not in (REPLICATE, SHARD) for d in self.mesh_dims) or len(set(self.mesh_dims)) != len(self.mesh_dims):
            raise ConfigError("strategy", self.mesh_dims, "names a mesh dimension twice or one FSDP does not know.",
                              f"use {REPLICATE!r} and {SHARD!r}, each once.")

    @classmethod
    def of(cls, strategy: Degrees, layout: Layout) -> ParallelDims:
        """The rule: the strategy's degrees on ``layout.nodes`` x ``layout.tasks_per_node`` ranks,
        the one -1 resolved to the ranks the others leave (torchtitan's ``ParallelDims``), each
        refused naming the setting and the fix. FSDP's mesh: replicate x shard where the replicate
        degree is over 1 (HSDP, or FSDP2 replicating only), else the shard group alone; DDP has none."""
        world = layout.nodes * layout.tasks_per_node
        where = f"nodes={layout.nodes} x cluster.tasks_per_node={layout.tasks_per_node}"
        degrees = resolve_degrees(strategy.degrees(), world, where)
        replicate, shard = degrees["dp_replicate"], degrees["dp_shard"]
        mesh: tuple[str, ...] = () if strategy.name is Strategy.ddp else (REPLICATE, SHARD) if replicate > 1 else (SHARD,)
        return cls(replicate, shard, layout.nodes, layout.tasks_per_node, tp=degrees["tp"], mesh_dims=mesh)

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
        """Which data-parallel replica global ``rank`` reads for (its tensor-parallel peers read
        the same batch)."""
        return rank // self.tp

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
        return self.dp_shard, self.dp_shard * self.tp > self.tasks_per_node


def resolve_degrees(asked: dict[str, int], world: int, where: str) -> dict[str, int]:
    """The degrees ``asked`` (-1: the ranks the others leave) on ``world`` ranks, the -1 resolved.
    Refused: given degrees whose product does not divide the ranks, and a -1 that comes to a group
    of one beside a data-parallel degree over 1 (HSDP on one node is FSDP)."""
    given = {d: n for d, n in asked.items() if n != -1}
    product = math.prod(given.values())
    if world % product:
        over_one = {d: n for d, n in given.items() if n > 1}
        setting, value = (f"strategy.{next(iter(over_one))}", next(iter(over_one.values()))) if len(over_one) == 1 \
            else ("strategy", " x ".join(f"{d}={n}" for d, n in over_one.items()))
        raise ConfigError(setting, value, f"does not divide the {world} ranks ({where}).",
                          f"use degrees whose product divides {world}, or change nodes or cluster.tasks_per_node.")
    rest = [d for d, n in asked.items() if n == -1]
    if not rest:
        return dict(asked)  # degrees that do not cover the ranks are refused by ParallelDims itself
    resolved = {**asked, rest[0]: world // product}
    other = {"dp_replicate": "dp_shard", "dp_shard": "dp_replicate"}.get(rest[0])
    if other and resolved[rest[0]] == 1 and asked[other] > 1:
        group, instead = ("replicate", "strategy=fsdp") if rest[0] == "dp_replicate" else ("shard", "strategy=fsdp_noshard")
        raise ConfigError(f"strategy.{rest[0]}", -1, f"the ranks the other degrees leave come to 1 on {where} beside "
                          f"strategy.{other}={asked[other]}: a {group} group of one, which is {instead}.",
                          f"use more ranks (strategy=hsdp: nodes=2 or more), or {instead}.")
    return resolved
