"""Datasets, the pipeline per condition, the runner, scoring, diagnostics, reports, golden
construction — and the experiment configs that drive them."""
