"""This machine, in one folder: the backend (backend), how its cells run (submit), what it can give
(resources) and its memory limits (memlimit)."""
