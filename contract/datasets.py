"""The dataset files' formats, read from the file system alone: checked before submission and
read by the ranks' loaders (jobs/data.py), one definition for both.
"""

from __future__ import annotations

TOKEN_DTYPE = "uint16"
TOKEN_BYTES = 2


def token_file_samples(path: str, seq_len: int) -> int:
    """Samples of ``seq_len + 1`` tokens at stride ``seq_len`` in a token file, from its size alone."""
    import os

    return max(0, (os.path.getsize(path) // TOKEN_BYTES - 1) // seq_len)


def image_folder_classes(path: str) -> list:
    """Class names of an image folder: its subdirectories, sorted (class index = position)."""
    import os

    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
