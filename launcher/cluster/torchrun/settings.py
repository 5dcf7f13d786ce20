"""cluster=torchrun's settings: the shared ones (launcher/plan/clusterschema.py) on this one machine,
as cluster=local's: nothing names a node, and no node can be kept out. Its own class, not local's:
no backend's settings subclass another's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from launcher.plan.clusterschema import ClusterConfig


@dataclass
class TorchrunSettings(ClusterConfig):
    name: str = "torchrun"
    one_machine: ClassVar[bool] = True
