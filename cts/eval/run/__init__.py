"""Running keys into a run directory (above cts/eval/data/ and cts/eval/score/): the experiment
config, engines and their meter, the dialogue and pipeline of one key, the runner and its
record store, the run directory, its fingerprint, trace files, progress."""
