"""Scoring, as pure functions over labelled nuggets (above eval/data/ only): the
restore score and its paired statistics, their resampling, over-answering."""
