"""Datasets, the pipeline per condition, the runner, scoring, diagnostics, reports, golden
construction — and the experiment configs that drive them.

Layers, each importing only from those below it (docs/architecture.md):

- cts/eval/data/: the benchmark's data (schema, datasets, golden nuggets);
- cts/eval/score/: scoring as pure functions (restore score, statistics);
- cts/eval/run/: running keys into a run directory (config, engines, pipeline, runner);
- cts/eval/report/, cts/eval/audit/, cts/eval/viewer/: what reads run directories (the report;
calibration
  and audits; `cts view`), none importing another;
- the modules here, what a whole experiment does: experiment (`cts run`, `merge`, golden
  construction), plan (`--dry-run`), rejudge, estimate and pilot.
"""
