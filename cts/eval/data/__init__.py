"""The benchmark's data (the bottom layer): the instance and record types, reading and
validating datasets and corpora, golden nuggets from a golden trace, a dataset's numbers."""
