"""Distributed checkpoints of a benchmark in flight (torch.distributed.checkpoint).

Layout under the cell's directory::

    checkpoint/latest             name of the newest complete checkpoint (written last, atomically)
    checkpoint/step-000120/       DCP shards of model + optimizer (every rank writes its own)
    checkpoint/step-000120/meta.json      step, restarts, world size, steps already logged
    checkpoint/step-000120/rank<R>.pt     per-rank state: RNG, measurement traces so far

Model and optimizer go through ``get_state_dict``/``set_state_dict``, so a checkpoint saved by N
ranks (DDP or FSDP) loads on M ranks: DCP reshards. Per-rank state (RNG streams, this rank's step
times) only means something for the same world size and is ignored otherwise.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from contract import records

CKPT_DIR = "checkpoint"


def latest(out_dir: Path) -> Path | None:
    pointer = Path(out_dir) / CKPT_DIR / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "meta.json").exists() else None


def save(out_dir: Path, model, optimizer, *, rank: int, meta: dict[str, Any], rank_state: dict[str, Any]) -> Path:
    """Collective: every rank calls it at the same step boundary."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(out_dir) / CKPT_DIR
    path = root / f"step-{meta['step']:06d}"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    torch.save(rank_state, path / f"rank{rank}.pt")
    # Sync point: the checkpoint is complete only when every rank has written its part.
    dist.barrier()
    if rank == 0:
        # How many ranks wrote their part: all of them, or the barrier above would not have passed.
        meta = {**meta, "ranks_saved": len(list(path.glob("rank*.pt")))}
        records.write_document(path / "meta.json", meta, indent=None)
        records.write_atomic(root / "latest", path.name)  # readers see the old or the new checkpoint, never half
        for old in root.glob("step-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return path


def load(path: Path, model, optimizer, *, rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Collective: restore model and optimizer in place; returns (meta, this rank's state or None)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = records.read_document(path / "meta.json", "a checkpoint's meta", "delete the checkpoint folder: the "
                                 "run starts again from its first step.")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = path / f"rank{rank}.pt"
    same_layout = meta.get("world_size") == world_size and mine.exists()
    return meta, (torch.load(mine, weights_only=False) if same_layout else None)


def rng_state(device) -> dict[str, Any]:
    """This rank's RNG streams: the CPU generator, and the CUDA generator of ``device`` on GPU
    (dropout and random inits on the GPU draw from it)."""
    import torch

    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if getattr(device, "type", "cpu") == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: Any, device) -> None:
    """Undo :func:`rng_state`; also takes the older format (the CPU state tensor alone)."""
    import torch

    if isinstance(state, torch.Tensor):
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and getattr(device, "type", "cpu") == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
