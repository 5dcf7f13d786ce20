"""One machine without Slurm: each cell's ranks started by torchrun, ``python -m jobs spec.json``
(docs/backends.md)."""
