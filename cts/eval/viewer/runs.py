"""The run directories `cts view` reads: each one's config and records, read once at start, and
what a sample needs of it when opened (the dataset's instance, the trace file inside its
traces/). Apart from the index and the sample because how a run directory is laid out and
scoped (config.yaml, records/, traces/, cts/eval/run/scope.py) changes on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import load_instances
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Instance, Record
from cts.eval.run.config import ExperimentConfig
from cts.eval.run.records import Key, RecordStore
from cts.eval.run.run_dir import RunDir
from cts.eval.run.scope import in_scope, outside_because
from cts.eval.run.traces import inside, read_trace_file
from cts.foundation.yaml_config import ConfigError


@dataclass
class ViewRun:
    """A run directory as the viewer holds it: its records at start, the rest when asked."""

    index: int
    root: Path
    name: str
    #: None when config.yaml no longer loads (written by an older version): the records are
    #: still shown, without the dataset's queries and nuggets.
    experiment: ExperimentConfig | None
    records: dict[Key, Record]
    config_error: str | None = None
    #: The records config.yaml no longer names (a narrowing resume keeps them), with why.
    outside: dict[Key, str] = field(default_factory=dict)
    #: Their counts, as the report's summary.json gives them (`ignored_records`).
    ignored: dict[str, Any] = field(default_factory=dict)
    #: Every instance of the dataset, past dataset.limit too, by id, in the dataset's order.
    _instances: dict[str, Instance] | None = None
    _dataset_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def traces(self) -> Path:
        return RunDir(self.root).traces

    def dataset(self) -> tuple[dict[str, Instance] | None, str | None]:
        """Every instance of the run's dataset by id, or why it cannot be read here (the
        dataset moved, or is a hub dataset not cached on this machine). Read once, without
        dataset.limit: the records a narrowing resume kept name instances past it."""
        if self.experiment is None:
            return None, self.config_error
        with self._lock:
            if self._instances is None and self._dataset_error is None:
                source = self.experiment.dataset.model_copy(update={"limit": None})
                try:
                    self._instances = {i.id: i for i in load_instances(source)}
                except (DatasetError, OSError) as e:
                    self._dataset_error = f"the run's dataset cannot be read here: {e}"
        return self._instances, self._dataset_error

    def instance(self, instance_id: str) -> tuple[Instance | None, str | None]:
        """The instance as the run's dataset holds it, or why it cannot be read here."""
        instances, error = self.dataset()
        if instances is None:
            return None, error
        found = instances.get(instance_id)
        return found, None if found else "not in the run's dataset (any more)"

    def tag_scope(self) -> None:
        """Sets `outside` and `ignored`: what config.yaml does not name, as the report counts
        it (cts/eval/run/scope.py). Only a dataset.limit can leave instances out, so without one
        the dataset is not read here (it is, when a sample opens)."""
        if self.experiment is None:  # nothing to check against: every record is shown
            self.ignored = in_scope([], (), (), None).as_dict()
            return
        conditions, seeds = self.experiment.conditions, self.experiment.seeds
        beyond: list[str] | None = []
        if limit := self.experiment.dataset.limit:
            instances, _ = self.dataset()
            beyond = None if instances is None else list(instances)[limit:]
        self.ignored = in_scope(self.records.values(), conditions, seeds, beyond).as_dict()
        self.outside = {
            key: why
            for key, record in self.records.items()
            if (why := outside_because(record, conditions, seeds, beyond or ()))
        }

    def trace_file(self, record: Record) -> tuple[Path | None, str | None]:
        """The record's trace file, or why there is none. The path comes from a record, which
        is untrusted: it must resolve to a file inside this run's traces/."""
        if not record.trace_id:
            return None, "the record names no trace"
        path = inside(self.traces, record.trace_id)
        if path is None:
            return None, f"trace path {record.trace_id!r} leaves the run's traces/: not read"
        if not path.is_file():
            return None, f"trace file missing: traces/{record.trace_id}"
        return path, None

    def trace(self, record: Record) -> tuple[dict[str, Any] | None, str | None]:
        """The record's trace, or why there is none."""
        path, error = self.trace_file(record)
        if path is None:
            return None, error
        return read_trace_file(path)

    def describe(self) -> dict[str, Any]:
        """Its records and failures as its report counts them (those config.yaml names), all
        it stores, and the rest counted by why (`ignored`)."""
        return {
            "id": self.index,
            "name": self.name,
            "path": str(self.root),
            "experiment": self.experiment.name if self.experiment else None,
            "records": len(self.records) - len(self.outside),
            "failed": sum(
                r.error is not None for k, r in self.records.items() if k not in self.outside
            ),
            "stored": len(self.records),
            "ignored": self.ignored,
            "config_error": self.config_error,
        }


def load_run(index: int, root: Path) -> ViewRun:
    """A run directory's config and counted records (RunDirError without config.yaml,
    RecordFileError for a line that is not a record). Reads only. A config.yaml that does not
    load any more is no reason not to read the records: it is reported, not raised. The
    records config.yaml no longer names are kept, tagged (ViewRun.tag_scope)."""
    try:
        resolved = RunDir(root).read_config()
    except ConfigError as e:
        records = RecordStore(root).completed()
        problem = f"the run's config.yaml does not load: {e}"
        view = ViewRun(index, root.resolve(), root.name, None, records, problem)
    else:
        records = RecordStore(root).completed()
        view = ViewRun(index, root.resolve(), resolved.system_name(), resolved.experiment, records)
    view.tag_scope()
    return view


def load_runs(run_dirs: Sequence[Path]) -> list[ViewRun]:
    """Every run directory given, numbered in order; runs of the same name told apart by their
    folder (or, folders alike, their path)."""
    runs = [load_run(i, Path(d)) for i, d in enumerate(run_dirs)]
    names = [r.name for r in runs]
    folders = [r.root.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:  # same experiment and clarifier: tell them apart
            where = run.root.name if folders.count(run.root.name) == 1 else str(run.root)
            run.name = f"{run.name} [{where}]"
    return runs
