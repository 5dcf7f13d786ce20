"""Weight initialisation: the one init every build runs, eager or deferred (jobs.models.build)."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The user model inside DDP / DataParallel and torch.compile wrappers.

    FSDP2's fully_shard changes the class in place (a subclass), so it needs no unwrapping.
    """
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(orig := getattr(model, "_orig_mod", None), nn.Module):
            model = orig
        else:
            return model


def init_weights(model: nn.Module) -> None:
    """(Re)initialise every parameter and buffer, deterministically under torch.manual_seed.

    Calls ``reset_parameters()`` on every module that has one (PyTorch's per-layer defaults; for
    BatchNorm this also resets the running statistics), in ``modules()`` order, and then the
    project model's ``custom_init()`` (its family's published init), which overrides them. A model
    with ``init_whole()`` initialises every module itself: a transformers model (HFLogits) is initialised by transformers instead, tied weights re-tied and
    ``model.pretrained_path``'s weights loaded. Meant for after ``to_empty()``, whose memory is
    uninitialised.
    """
    model = unwrap(model)
    whole = getattr(model, "init_whole", None)
    if callable(whole):  # its own init covers every module: transformers' (jobs.models.hf.HFLogits)
        whole()
        return
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    custom = getattr(model, "custom_init", None)
    if callable(custom):
        custom()
