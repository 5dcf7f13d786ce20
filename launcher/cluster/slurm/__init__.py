"""Slurm, in one folder: the backend (backend), how its jobs are submitted (submit), what Slurm says
of them (accounting), what it can give (resources) and how its commands are called (commands)."""
