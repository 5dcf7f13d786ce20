"""Performance benchmarks of the harness itself (not tests): ratios measured side by side.

Run ``python -m bench`` (see bench/README.md); the last run is written to BENCH_RESULTS.md.
"""
