"""Where a rank's shard sits in a full tensor: one answer for sharded initialisation
(jobs/parallel.py) and for loading full weights into sharded parameters (jobs/models/hf.py)."""

from __future__ import annotations


def local_slices(global_shape, mesh, placements) -> tuple:
    """The index of this rank's shard in the full tensor (FSDP2: Shard(0), Replicate on HSDP)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(global_shape, mesh, placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
