"""Where a rank's shard sits in a full tensor: one answer for sharded initialisation
(jobs/parallel.py) and for loading full weights into sharded parameters (jobs/models/hf.py)."""

from __future__ import annotations


def local_slices(global_shape, mesh, placements) -> tuple:
    """The index of this rank's shard in the full tensor (FSDP2: Shard(0), Replicate on HSDP).

    Computed from the rank's mesh coordinate in plain integers, with DTensor's own chunking
    (``torch.chunk``: ceil-sized pieces, the last ones short or empty), and equal to torch's
    ``compute_local_shape_and_global_offset`` (tests/test_gpu_rehearsal.py compares them). Plain
    integers because that helper computes with tensors, which a fake-tensor rehearsal of the CUDA
    path cannot read.
    """
    coordinate = mesh.get_coordinate()
    slices = [slice(0, int(n)) for n in global_shape]
    for mesh_dim, placement in enumerate(placements):
        if not placement.is_shard():
            continue
        dim = placement.dim
        start, stop = slices[dim].start, slices[dim].stop
        chunk = -(-(stop - start) // mesh.size(mesh_dim))
        lo = min(start + coordinate[mesh_dim] * chunk, stop)
        slices[dim] = slice(lo, min(lo + chunk, stop))
    return tuple(slices)


def shard_of(full, mesh, placements):
    """This rank's shard of ``full`` as a view (``narrow``, not indexing: the CPU build's Python
    indexing opens a device guard that a fake CUDA tensor cannot satisfy)."""
    for dim, part in enumerate(local_slices(full.shape, mesh, placements)):
        full = full.narrow(dim, part.start, part.stop - part.start)
    return full
