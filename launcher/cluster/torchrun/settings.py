"""cluster=torchrun's settings: this one machine's, as cluster=local's (launcher/cluster/local/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.cluster.local.settings import LocalSettings


@dataclass
class TorchrunSettings(LocalSettings):
    name: str = "torchrun"
