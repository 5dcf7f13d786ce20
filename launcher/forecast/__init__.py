"""Forecasting: the command (``python -m launcher.forecast``) and the forecasts of cells it shares
with --plan."""
