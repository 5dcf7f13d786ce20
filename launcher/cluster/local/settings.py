"""cluster=local's settings: the shared ones (launcher/plan/clusterschema.py) on this one machine,
where a cell's nodes are emulated as groups of local processes: nothing names a node, and no node
can be kept out (another backend's node keys, e.g. cluster.partition, are refused naming it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from launcher.plan.clusterschema import ClusterConfig


@dataclass
class LocalSettings(ClusterConfig):
    name: str = "local"
    one_machine: ClassVar[bool] = True
