"""From measurements to claims: rows, statistics, findings, comparisons, plots and the report
(``python -m launcher.report``)."""
