"""The worker every rank runs: rank layout, process group, model, wrapping, measured steps."""
