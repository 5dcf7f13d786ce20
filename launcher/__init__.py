"""Turns one command into a grid of distributed-training benchmark jobs (conf -> submitit)."""
