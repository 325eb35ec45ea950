"""`cts view`: a read-only browser over run directories, for reading the samples behind a score.

The records of every run directory are read once, at start (a run's file that is not a record
stops it, as it stops `cts report`); the index is filtered, sorted and cut into pages here, so
the browser only ever holds one page of rows. A run resumed narrower keeps records its
config.yaml no longer names: the index lists, as the report does, only the others unless asked,
and counts them as the report does. A sample's trace and its instance (queries,
nuggets) are read when it is opened. Nothing is ever written into a run directory, and no
file is served but the viewer's own pages and, through the API, what the records name: a
trace path is resolved and must stay inside its run's traces/ folder.

Everything shown is untrusted text (instance ids, model outputs, pages): the pages build the
DOM with text nodes only, and the API sends it as JSON.

The Viewer here is the entry point the API (app.py) and `cts view` hold; what it answers
with lives apart, each for its own reason to change: the run directories (runs.py), the
index and its queries (index.py), one sample (sample.py: its trace's turns in trace.py,
the judge's quotes marked in highlight.py, every text cut by cuts.py), and the errors
(errors.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cts.eval.data.schema import Record
from cts.eval.viewer.errors import NotFound, ViewError
from cts.eval.viewer.index import Query, RecordIndex
from cts.eval.viewer.runs import load_runs
from cts.eval.viewer.sample import sample_detail


class Viewer:
    """Every run directory given, and the answers the API gives about them."""

    def __init__(self, run_dirs: Sequence[Path]) -> None:
        self.runs = load_runs(run_dirs)
        self.record_index = RecordIndex(self.runs)

    def describe_runs(self) -> list[dict[str, Any]]:
        """Each run: its records and failures as its report counts them (those config.yaml
        names), all it stores, and the rest counted by why (`ignored`)."""
        return [run.describe() for run in self.runs]

    def facets(self) -> dict[str, list[str]]:
        """The values the index's filters can take."""
        return self.record_index.facets()

    def index(self, query: Query) -> dict[str, Any]:
        return self.record_index.page(query)

    def keys(self, instance_id: str) -> list[dict[str, Any]]:
        """Every record of one instance, in every run: what it can be compared across."""
        return self.record_index.keys(instance_id)

    def record(self, run: int, instance_id: str, condition: str, seed: int) -> Record:
        if not 0 <= run < len(self.runs):
            raise NotFound(f"no run {run}")
        found = self.runs[run].records.get((instance_id, condition, seed))
        if found is None:
            raise NotFound(f"run {run} has no record of {instance_id!r} {condition} seed {seed}")
        return found

    def sample(self, run: int, instance_id: str, condition: str, seed: int) -> dict[str, Any]:
        """One record with all it stands on: instance, dialogue, search trace, labels."""
        record = self.record(run, instance_id, condition, seed)
        key = {"run": run, "instance": instance_id, "condition": condition, "seed": seed}
        return sample_detail(self.runs[run], record, key)

    def raw(self, run: int, instance_id: str, condition: str, seed: int, part: str) -> bytes | Path:
        """What a sample stands on, whole: its record (a JSON line) or its trace file."""
        record = self.record(run, instance_id, condition, seed)
        if part == "record":
            return record.model_dump_json().encode()
        if part != "trace":
            raise ViewError(f"part: expected record or trace, got {part!r}")
        path, error = self.runs[run].trace_file(record)
        if path is None:
            raise NotFound(str(error))
        return path
