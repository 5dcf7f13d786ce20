"""Checks against the target cluster before submission (what Slurm would only report later)."""

from __future__ import annotations

from typing import List

from launcher.plan import Cell, SweepError
from launcher.schema import ClusterKind


def preflight(cells: List[Cell]) -> None:
    if cells and cells[0].config.cluster.name is ClusterKind.slurm:
        from launcher.slurm_checks import check_partitions

        check_partitions(cells)


__all__ = ["preflight", "SweepError"]
