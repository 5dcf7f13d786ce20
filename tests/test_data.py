"""Input data: the synthetic stream, a token file and an image folder, per rank; their checks before submission."""

import numpy as np
import pytest
import torch

from contract.spec import DataKind, DataSpec, InputKind, ModelSpec
from jobs.data import (
    ImageFolderDataset,
    TokenFileDataset,
    input_batches,
    loader_batches,
    synthetic_batches,
)
from launcher.plan.grid import SweepError, compose, expand
from tests.ranks import TINY_CNN, TINY_GPT, make_spec, run_ranks

CPU = torch.device("cpu")
SEQ_LEN, N_SAMPLES = 8, 40  # samples of SEQ_LEN + 1 tokens at stride SEQ_LEN
VOCAB = 512  # above every token id of the file below


def tiny_gpt(**kw):
    return ModelSpec(**{**TINY_GPT, "input": InputKind.tokens, "seq_len": SEQ_LEN, "vocab_size": VOCAB, **kw})


@pytest.fixture
def token_file(tmp_path):
    # Token t at position t: a sample's first token says where in the file it starts.
    path = tmp_path / "train.bin"
    np.arange(N_SAMPLES * SEQ_LEN + 1, dtype=np.uint16).tofile(path)
    return path


def token_data(path, **kw):
    return DataSpec(**{"kind": DataKind.token_file, "path": str(path), **kw})


def starts(batches, n_batches):
    """The start positions (first tokens) of the next ``n_batches`` batches' samples."""
    out = []
    for _ in range(n_batches):
        x, _ = next(batches)
        out.extend(x[:, 0].tolist())
    return out


# ---- synthetic ------------------------------------------------------------------------------

def test_synthetic_stream_does_not_depend_on_how_a_step_is_split():
    model = tiny_gpt()
    whole = synthetic_batches(model, 4, seed=3, rank=1, device=CPU)
    halves = synthetic_batches(model, 2, seed=3, rank=1, device=CPU, accum_steps=2)
    for _ in range(6):
        x, y = next(whole)
        (x1, y1), (x2, y2) = next(halves), next(halves)
        assert torch.equal(x, torch.cat([x1, x2])) and torch.equal(y, torch.cat([y1, y2]))
    other_rank = next(synthetic_batches(model, 4, seed=3, rank=0, device=CPU))[0]
    assert not torch.equal(other_rank, next(synthetic_batches(model, 4, seed=3, rank=1, device=CPU))[0])


# ---- token file -----------------------------------------------------------------------------

def test_token_file_samples_shapes_and_targets(token_file):
    ds = TokenFileDataset(str(token_file), SEQ_LEN, VOCAB)
    assert len(ds) == N_SAMPLES
    x, y = ds[3]
    assert x.dtype == torch.int64 and x.shape == (SEQ_LEN,) and y.shape == (SEQ_LEN,)
    assert x.tolist() == list(range(3 * SEQ_LEN, 4 * SEQ_LEN))  # stride seq_len
    assert torch.equal(y[:-1], x[1:]) and y[-1] == 4 * SEQ_LEN  # next-token targets


def test_token_file_ranks_get_disjoint_samples_every_epoch(token_file):
    world, batch = 2, 4
    per_epoch = N_SAMPLES // world // batch  # batches per rank per epoch
    epochs = []  # per rank: [epoch 0 starts, epoch 1 starts]
    for rank in range(world):
        batches = input_batches(token_data(token_file), tiny_gpt(), batch_size=batch, accum_steps=1, seed=0,
                                rank=rank, world_size=world, device=CPU)
        x, y = next(batches)
        assert x.shape == (batch, SEQ_LEN) and y.shape == (batch, SEQ_LEN)
        # The stream cycles on into a second epoch.
        epochs.append([x[:, 0].tolist() + starts(batches, per_epoch - 1), starts(batches, per_epoch)])
    for epoch in (0, 1):
        shares = [set(epochs[rank][epoch]) for rank in range(world)]
        assert not shares[0] & shares[1]
        # 40 samples split evenly, none repeated, none dropped.
        assert shares[0] | shares[1] == set(range(0, N_SAMPLES * SEQ_LEN, SEQ_LEN))
    assert epochs[0][0] != epochs[0][1]  # set_epoch reshuffles


def test_token_file_order_is_deterministic_and_seeded(token_file):
    def first(seed, workers=0):
        data = token_data(token_file, num_workers=workers)
        return starts(input_batches(data, tiny_gpt(), batch_size=4, accum_steps=1, seed=seed, rank=1, world_size=2,
                                    device=CPU), 3)

    assert first(0) == first(0) and first(0) != first(1)
    # A worker process with persistent workers and prefetching yields the same stream.
    assert first(0, workers=1) == first(0)


def test_token_file_errors_name_the_fix(tmp_path, token_file):
    with pytest.raises(ValueError, match="model.vocab_size"):
        TokenFileDataset(str(token_file), SEQ_LEN, vocab_size=16)[5]
    short = tmp_path / "short.bin"
    np.arange(SEQ_LEN, dtype=np.uint16).tofile(short)
    with pytest.raises(ValueError, match="seq_len"):
        TokenFileDataset(str(short), SEQ_LEN, VOCAB)
    with pytest.raises(ValueError, match="smaller batch_size"):
        loader_batches(TokenFileDataset(str(token_file), SEQ_LEN, VOCAB), token_data(token_file), batch_size=32,
                       seed=0, rank=0, world_size=2, device=CPU)


# ---- image folder ---------------------------------------------------------------------------

@pytest.fixture
def image_folder(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):  # images of various sizes, resized on load
            Image.fromarray(rng.integers(0, 255, (10 + i, 12, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
        for i in range(3):  # arrays: no Pillow needed
            np.save(root / name / f"a{i}.npy", rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_samples(image_folder):
    ds = ImageFolderDataset(str(image_folder), image_size=16)
    assert ds.classes == ["cat", "dog"] and len(ds) == 12
    labels = sorted(int(ds[i][1]) for i in range(len(ds)))
    assert labels == [0] * 6 + [1] * 6
    for i in range(len(ds)):
        x, _ = ds[i]
        assert x.shape == (3, 16, 16) and x.dtype == torch.float32
    model = ModelSpec(**{**TINY_CNN, "input": InputKind.image})
    data = DataSpec(kind=DataKind.image_folder, path=str(image_folder))
    batches = [input_batches(data, model, batch_size=3, accum_steps=1, seed=0, rank=r, world_size=2, device=CPU)
               for r in range(2)]
    (x0, y0), (x1, _) = next(batches[0]), next(batches[1])
    assert x0.shape == (3, 3, 16, 16) and y0.shape == (3,) and y0.dtype == torch.int64
    assert not torch.equal(x0, x1)


# ---- checks before submission ----------------------------------------------------------------

def composed(*overrides):
    points, swept = expand(list(overrides), multirun=True)
    return compose(points, swept)


def refused(*overrides):
    with pytest.raises(SweepError) as info:
        composed(*overrides)
    return str(info.value)


def test_real_data_composes_with_a_matching_model(token_file, image_folder):
    [point] = composed("data=token_file", f"data.path={token_file}", f"model.seq_len={SEQ_LEN}", "batch_size=4")
    assert point.config.data.kind is DataKind.token_file and point.config.data.num_workers == 2
    [point] = composed("data=image_folder", f"data.path={image_folder}", "model=cnn", "batch_size=4")
    assert point.config.data.kind is DataKind.image_folder


@pytest.mark.parametrize("overrides, setting, fix", [
    (["data=token_file"], "data.path=None", "set data.path"),
    (["data=token_file", "data.path=/nonexistent/train.bin"], "data.path='/nonexistent/train.bin'",
     "existing dataset"),
    (["data=image_folder", "data.path=/nonexistent"], "data.path='/nonexistent'", "existing dataset"),
])
def test_missing_data_path_is_refused(overrides, setting, fix):
    message = refused(*overrides)
    assert setting in message and "Fix:" in message and fix in message, message


def test_data_must_fit_the_model_and_the_ranks(token_file, image_folder):
    message = refused("data=token_file", f"data.path={token_file}", "model=cnn")
    assert "model.input=image" in message and "model=gpt_tiny" in message
    message = refused("data=image_folder", f"data.path={image_folder}", "model=gpt_tiny")
    assert "model.input=tokens" in message and "model=cnn" in message
    # A directory given as a token file, and a file as an image folder.
    assert "data.path" in refused("data=token_file", f"data.path={image_folder}")
    assert "data.path" in refused("data=image_folder", f"data.path={token_file}", "model=cnn")
    # 40 samples of 9 tokens over 2 nodes x 2 ranks: 10 per rank, fewer than batch_size=16.
    message = refused("data=token_file", f"data.path={token_file}", f"model.seq_len={SEQ_LEN}", "batch_size=16",
                      "nodes=2", "cluster.tasks_per_node=2")
    assert "10 per rank" in message and "batch_size=16" in message
    message = refused("data=image_folder", f"data.path={image_folder}", "model=cnn", "model.num_classes=1")
    assert "model.num_classes" in message


# ---- real ranks -----------------------------------------------------------------------------

@pytest.mark.slow
def test_two_ranks_train_on_a_token_file_and_an_image_folder(tmp_path, token_file, image_folder):
    specs = [
        make_spec(tmp_path / "tokens", model={**TINY_GPT, "seq_len": SEQ_LEN, "vocab_size": VOCAB},
                  data={"kind": "token_file", "path": str(token_file), "num_workers": 1}, steps=6, warmup_steps=1),
        make_spec(tmp_path / "images", model=TINY_CNN, data={"kind": "image_folder", "path": str(image_folder)},
                  batch_size=3, steps=3, warmup_steps=1),
    ]
    for spec, results in zip(specs, run_ranks(specs, world_size=2, timeout_s=120), strict=True):
        for result in results:
            assert "error" not in result, result["error"]
        summary = results[0]["summary"]
        assert summary["world_size"] == 2 and summary["throughput_samples_per_s"] > 0
        assert all(np.isfinite(results[0]["losses"])), spec.cell
        # Loading is measured: time spent waiting for batches is part of the summary.
        assert 0 <= summary["data_time_share"] < 1
