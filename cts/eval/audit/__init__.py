"""How far to trust the parts (above cts/eval/run/): the judge's and the simulated user's
calibration against people, judge agreement, the golden audit, one request per model, and
nuggetizer's files."""
