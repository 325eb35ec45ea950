"""Scoring, as pure functions over labelled nuggets (above cts/eval/data/ only): the
restore score and its paired statistics, their resampling, over-answering."""
