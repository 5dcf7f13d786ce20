"""Per-rank input batches.

Synthetic data is generated once, up front, on the training device, and cycled: the benchmark
measures the training step, not a random-number generator. Each rank draws from its own seeded
stream (seed, rank), so runs are reproducible and ranks see different samples, as with a
DistributedSampler.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Tuple

import torch

from jobs.spec import InputKind, ModelSpec

Batch = Tuple[torch.Tensor, torch.Tensor]

# Distinct batches kept per rank; cycling a few avoids a constant input the optimizer could
# overfit to in a handful of steps while costing little memory.
POOL_BATCHES = 4


def synthetic_batches(model: ModelSpec, batch_size: int, seed: int, rank: int, device: torch.device) -> Iterator[Batch]:
    gen = torch.Generator().manual_seed(seed * 100_003 + rank)
    pool = []
    for _ in range(POOL_BATCHES):
        if model.input is InputKind.tokens:
            seq = torch.randint(0, model.vocab_size, (batch_size, model.seq_len + 1), generator=gen)
            x, y = seq[:, :-1], seq[:, 1:]  # next-token prediction
        else:
            x = torch.randn(batch_size, 3, model.image_size, model.image_size, generator=gen)
            y = torch.randint(0, model.num_classes, (batch_size,), generator=gen)
        pool.append((x.contiguous().to(device), y.contiguous().to(device)))
    return itertools.cycle(pool)


def samples_unit(model: ModelSpec) -> Tuple[str, int]:
    """The throughput unit besides samples: tokens for language models (per sample count)."""
    return ("tokens", model.seq_len) if model.input is InputKind.tokens else ("images", 1)
