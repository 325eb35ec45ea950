"""From a run directory's records to its report (above cts/eval/run/): the diagnostics a
paper needs, comparability of runs, the keys a report stands on, report.md/html, tables."""
