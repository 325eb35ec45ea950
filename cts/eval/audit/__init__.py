"""How far to trust the parts (above cts/eval/run/): the judge's and the simulated user's
calibration against people, judge agreement, and the golden audit."""
