"""Repeats spread over nodes: the runs of one configuration go to different nodes where the
partition allows, so that the spread between runs holds the spread between nodes too (on real
clusters identical GPUs and hosts differ by several percent, which repeats on one node never see).

* **First round** (every run planned at once): the partition's nodes are cut into windows of the
  cell's node count; run ``k`` of the ``j``-th configuration gets window ``(j + k - 1) mod windows``
  as its ``cluster.nodelist``. Consecutive runs of a configuration land on different windows, and
  different configurations start on different windows (so the first runs of all configurations
  do not queue for the same nodes).
* **Later rounds** (``runs=auto``): a new run gets ``cluster.exclude`` of the nodes its
  configuration's earlier runs ran on, while enough other nodes are left for it.

Only where the partition has at least two windows, and never over a ``cluster.nodelist`` or
``cluster.exclude`` the user set. Pure functions: the node lists come from the backend
(SlurmBackend.check_resources, .placing_apart, .excluding), the only code that rewrites them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from launcher.cluster.slurm import settings
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.plan.cell import Cell, configuration


def windows(nodes: Sequence[str], width: int) -> list[list[str]]:
    """The partition's nodes cut into consecutive groups of ``width``."""
    return [list(nodes[i:i + width]) for i in range(0, len(nodes) - width + 1, width)] if width > 0 else []


def repeated(cells: Sequence[Cell]) -> bool:
    """Whether some grid point runs more than once (only then is there something to spread)."""
    names = [configuration(c.name) for c in cells]
    return len(set(names)) < len(names)


def rotation(cells: Sequence[Cell], partition_nodes: dict[str | None, list[str]]) -> dict[int, str]:
    """{cell index: its nodelist} that gives each run of a grid point with several runs its own window
    of its partition's nodes (``partition_nodes``: partition -> its nodes in order; None: the
    default partition). Changes nothing: the caller applies each as a placement (Resolved.placement)."""
    order: dict[str, int] = {}
    runs: dict[str, int] = {}
    for cell in cells:
        runs[configuration(cell.name)] = runs.get(configuration(cell.name), 0) + 1
    out = {}
    for cell in cells:
        name = configuration(cell.name)
        j = order.setdefault(name, len(order))
        c = settings.of(cell.cluster)
        if runs[name] < 2 or c.nodelist or c.exclude or cell.placed:
            continue
        found = windows(partition_nodes.get(c.partition) or [], cell.layout.nodes)
        if len(found) >= 2:  # else the partition has room for one placement only
            out[cell.index] = ",".join(found[(j + cell.run - 1) % len(found)])
    return out


def exclude_used(cell: Cell, used: Collection[str], seen: Collection[str]) -> bool:
    """A later run of a configuration: exclude the nodes its earlier runs used (``used``) when the
    nodes known to run jobs (``seen``) leave enough others; clears the rotation copied from them."""
    c = settings.of(cell.cluster)
    used, seen = set(used), set(seen)
    if cell.placed == f"nodelist={c.nodelist}":
        c.nodelist = None  # the placement copied from the run it was made from
    elif cell.placed == f"exclude={c.exclude}":
        c.exclude = None
    if c.nodelist or c.exclude:
        return False  # the user's own placement
    if len(seen - used) < cell.layout.nodes:
        cell.placed = None
        return False
    c.exclude = ",".join(sorted(used))
    cell.placed = f"exclude={c.exclude}"
    return True


def keep_out(cell: Cell, nodes: Collection[str]) -> None:
    """``cell`` runs on none of ``nodes``: added to its exclude (on a settings object of its own). A
    node list holding one of them is dropped, and with it the launcher's placement: Slurm places the
    run elsewhere."""
    if not nodes:
        return
    c = settings.of(cell.cluster)
    own = expand_nodelist(c.exclude) if c.exclude else []
    nodelist = c.nodelist
    if nodelist and set(expand_nodelist(nodelist)) & set(nodes):
        nodelist, cell.placed = None, None
    cell.cluster = dataclasses.replace(c, exclude=",".join(dict.fromkeys([*own, *nodes])), nodelist=nodelist)
