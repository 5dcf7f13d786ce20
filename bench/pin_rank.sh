#!/bin/bash
# Runs a rank pinned to its own cores, [LOCAL_RANK * T, (LOCAL_RANK + 1) * T) with T threads per
# rank: ranks (and their communication threads) then stop migrating between cores, which on a
# small shared machine moves a run by several percent. torchrun sets LOCAL_RANK.
#   torchrun --nproc-per-node 2 --no-python bench/pin_rank.sh python bench/bare_loop.py ...
t=${BENCH_THREADS_PER_RANK:-1}
first=$((LOCAL_RANK * t))
exec taskset -c "$first-$((first + t - 1))" "$@"
