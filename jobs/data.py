"""Per-rank input batches: synthetic, a token file, or an image folder.

Synthetic data is generated once, up front, on the training device, and cycled: the benchmark
measures the training step, not a random-number generator. Each rank draws from its own seeded
stream (seed, rank), so runs are reproducible and ranks see different samples, as with a
DistributedSampler.

Real data (``data=token_file``, ``data=image_folder``) goes through a DistributedSampler (disjoint
samples per rank, shuffled with the run's seed, the same order on every rank's sampler) and a
DataLoader, and cycles over epochs with ``sampler.set_epoch``:

* token_file: a flat binary file of uint16 token ids, nanoGPT's ``train.bin`` layout. Sample ``i``
  is the ``seq_len + 1`` tokens starting at ``i * seq_len`` (inputs are the first ``seq_len``,
  targets the last ``seq_len``), so every next-token pair of the file is used exactly once per epoch.
* image_folder: ``<path>/<class name>/<file>``, classes numbered in sorted name order. Image files
  (.png, .jpg, ...) are decoded with Pillow; ``.npy`` files holding an ``(H, W, 3)`` array (uint8
  0-255, or float 0-1) are read with numpy and need no Pillow. Every sample is resized to
  ``model.image_size`` and normalised with the ImageNet channel statistics.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from contract.choices import DataKind, InputKind
from contract.datasets import TOKEN_DTYPE, image_folder_classes, token_file_samples

if TYPE_CHECKING:
    from contract.spec import DataSpec, ModelSpec

Batch = tuple[torch.Tensor, torch.Tensor]

# Optimizer steps' worth of distinct synthetic samples kept per rank; cycling a few avoids a
# constant input the optimizer could overfit to in a handful of steps while costing little memory.
POOL_STEPS = 4

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
ARRAY_SUFFIX = ".npy"
# ImageNet channel statistics, as torchvision's reference training scripts normalise.
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)


def input_batches(
    data: DataSpec, model: ModelSpec, *, batch_size: int, accum_steps: int, seed: int, rank: int, world_size: int,
    device: torch.device, channels_last: bool = False,
) -> Iterator[Batch]:
    """This rank's endless stream of (input, target) micro-batches of ``batch_size`` samples.
    ``rank`` and ``world_size``: its place among the ranks that read different batches (the
    worker passes contract.parallel.ParallelDims.data_rank and .data_parallel); ``channels_last``:
    images in the channels-last memory format (train.channels_last)."""
    if data.kind is DataKind.synthetic:
        return synthetic_batches(model, batch_size, seed, rank, device, accum_steps=accum_steps,
                                 channels_last=channels_last)
    if data.path is None:  # DataSpec.validate refuses this for every kind that reads files
        raise ValueError(f"data.kind={data.kind.value} reads files, and data.path is not set.")
    if data.kind is DataKind.token_file:
        dataset: TokenFileDataset | ImageFolderDataset = TokenFileDataset(data.path, model.seq_len, model.vocab_size)
    else:
        dataset = ImageFolderDataset(data.path, model.image_size)
    return loader_batches(dataset, data, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size,
                          device=device, channels_last=channels_last)


def synthetic_batches(
    model: ModelSpec, batch_size: int, seed: int, rank: int, device: torch.device, *, accum_steps: int = 1,
    channels_last: bool = False,
) -> Iterator[Batch]:
    # The pool is drawn in one call and cut into micro-batches in order, so the sample stream
    # depends on (seed, rank, samples per optimizer step) only: batch_size=2 with
    # grad_accum_steps=2 sees exactly the samples of batch_size=4 without accumulation.
    gen = torch.Generator().manual_seed(seed * 100_003 + rank)
    n_samples = POOL_STEPS * accum_steps * batch_size
    if model.input is InputKind.tokens:
        seq = torch.randint(0, model.vocab_size, (n_samples, model.seq_len + 1), generator=gen)
        x, y = seq[:, :-1], seq[:, 1:]  # next-token prediction
    else:
        x = torch.randn(n_samples, 3, model.image_size, model.image_size, generator=gen)
        y = torch.randint(0, model.num_classes, (n_samples,), generator=gen)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    pool = [(x[i : i + batch_size].contiguous(memory_format=layout).to(device),
             y[i : i + batch_size].contiguous().to(device)) for i in range(0, n_samples, batch_size)]
    return itertools.cycle(pool)


def samples_unit(model: ModelSpec) -> tuple[str, int]:
    """The throughput unit besides samples: tokens for language models (per sample count)."""
    return ("tokens", model.seq_len) if model.input is InputKind.tokens else ("images", 1)


# ---- real data -------------------------------------------------------------------------------

class TokenFileDataset(torch.utils.data.Dataset):
    def __init__(self, path: str, seq_len: int, vocab_size: int) -> None:
        self.path, self.seq_len, self.vocab_size = path, seq_len, vocab_size
        self.n_samples = token_file_samples(path, seq_len)
        if self.n_samples == 0:
            raise ValueError(f"data.path={path!r} holds fewer than seq_len+1={seq_len + 1} {TOKEN_DTYPE} tokens; "
                             "use a larger token file or a smaller model.seq_len.")

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, index: int) -> Batch:
        import numpy as np

        # A fresh memmap per read (nanoGPT does the same): a memmap kept open accumulates the
        # file's pages in this process's resident set, and one pickled into DataLoader workers
        # would be copied whole.
        tokens = np.memmap(self.path, dtype=TOKEN_DTYPE, mode="r")
        start = index * self.seq_len
        chunk = torch.from_numpy(tokens[start : start + self.seq_len + 1].astype(np.int64))
        del tokens
        top = int(chunk.max())
        if top >= self.vocab_size:
            raise ValueError(f"data.path={self.path!r}: token id {top} in sample {index} is not below "
                             f"model.vocab_size={self.vocab_size}; set model.vocab_size to the tokenizer's "
                             "vocabulary (50257 for GPT-2's).")
        return chunk[:-1], chunk[1:]


class ImageFolderDataset(torch.utils.data.Dataset):
    def __init__(self, path: str, image_size: int) -> None:
        self.path, self.image_size = path, image_size
        self.classes = image_folder_classes(path)
        self.samples: list[tuple[str, int]] = []
        for label, name in enumerate(self.classes):
            for file in sorted(Path(path, name).iterdir()):
                if file.suffix.lower() in IMAGE_SUFFIXES + (ARRAY_SUFFIX,):
                    self.samples.append((str(file), label))
        if not self.samples:
            raise ValueError(f"data.path={path!r} has no class subdirectories holding images "
                             f"({', '.join(IMAGE_SUFFIXES)} or {ARRAY_SUFFIX}); expected <path>/<class>/<file>.")
        self._mean = torch.tensor(IMAGE_MEAN).view(3, 1, 1)
        self._std = torch.tensor(IMAGE_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Batch:
        file, label = self.samples[index]
        image = _read_array(file) if file.endswith(ARRAY_SUFFIX) else _read_image(file, self.image_size)
        if image.shape[-2:] != (self.image_size, self.image_size):
            image = torch.nn.functional.interpolate(image[None], size=(self.image_size, self.image_size),
                                                    mode="bilinear", align_corners=False)[0]
        return (image - self._mean) / self._std, torch.tensor(label)


def _read_image(file: str, size: int) -> torch.Tensor:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(f"{file}: decoding images needs Pillow (pip install pillow); without it, store each "
                          f"image as an (H, W, 3) uint8 array in a {ARRAY_SUFFIX} file.") from exc
    import numpy as np

    with Image.open(file) as img:
        rgb = np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).float().div_(255.0)


def _read_array(file: str) -> torch.Tensor:
    import numpy as np

    array = np.load(file)
    if array.ndim == 2:  # greyscale
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"{file}: expected an (H, W, 3) image array, found shape {array.shape}.")
    image = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
    return image.float().div_(255.0) if array.dtype == np.uint8 else image.float()


def loader_batches(
    dataset: TokenFileDataset | ImageFolderDataset, data: DataSpec, *, batch_size: int, seed: int, rank: int,
    world_size: int, device: torch.device, channels_last: bool = False,
) -> Iterator[Batch]:
    """Endless batches of this rank's share of ``dataset``, epoch after epoch (images channels-last
    on the device when ``channels_last``)."""
    from torch.utils.data import DataLoader, DistributedSampler

    # drop_last: every rank gets the same number of samples (a rank with one batch more would
    # wait forever in a collective) and every batch has the same shape.
    sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                                          seed=seed, drop_last=True)
    if len(sampler) < batch_size:
        raise ValueError(f"data.path={data.path!r}: {len(dataset)} samples give each of {world_size} ranks "
                         f"{len(sampler)}, fewer than batch_size={batch_size}; use more data or a smaller batch_size.")
    pin = data.pin_memory and device.type == "cuda"  # pinned host memory only helps copies to a GPU
    workers = data.num_workers
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers, pin_memory=pin,
        # Both are refused by DataLoader without worker processes.
        prefetch_factor=data.prefetch_factor if workers > 0 else None, persistent_workers=workers > 0,
    )
    layout = torch.channels_last if channels_last else torch.preserve_format
    return _epochs(loader, sampler, device, non_blocking=pin, layout=layout)


def _epochs(loader, sampler, device: torch.device, non_blocking: bool,
            layout: torch.memory_format = torch.preserve_format) -> Iterator[Batch]:
    for epoch in itertools.count():
        # A new shuffle each epoch, the same permutation on every rank, so shares stay disjoint.
        sampler.set_epoch(epoch)
        for x, y in loader:
            yield (x.to(device, non_blocking=non_blocking, memory_format=layout),
                   y.to(device, non_blocking=non_blocking))
