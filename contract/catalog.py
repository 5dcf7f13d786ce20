"""The project's named models, by family, with their sizes: the one list of names (standard library
only), so that the launcher checks ``model=NAME`` without importing torch; jobs/models/build.py
builds each family from it.
"""

from __future__ import annotations

GPT_SIZES = {  # name -> (n_layer, n_head, d_model)
    "gpt_tiny": (2, 4, 128),
    "gpt2-small": (12, 12, 768),  # 124M
    "gpt2-medium": (24, 16, 1024),  # 355M
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),  # 1.56B
}

BERT_SIZES = {  # name -> (n_layer, n_head, d_model)
    "bert-base": (12, 12, 768),  # 110M
    "bert-tiny": (2, 2, 128),  # Google's BERT-Tiny (L-2, H-128, A-2)
}

RESNET_DEPTHS = (18, 34, 50, 101, 152)

SMALL_MODELS = ("mlp", "cnn")

KNOWN_MODELS = tuple(sorted([*SMALL_MODELS, *GPT_SIZES, *BERT_SIZES, *(f"resnet{d}" for d in RESNET_DEPTHS)]))


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (50257, 64 -> 50304): the rows a
    GPT's embedding is built with (contract/tuning.py picks the multiple)."""
    return -(-vocab_size // multiple) * multiple
