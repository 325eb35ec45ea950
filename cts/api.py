"""The objects of the front door that are the API's own (cts/__init__.py lists the rest): a
finished or running run read as one object, several runs as one table, and a rejudge in one
call. Everything here reads what the commands write; nothing is computed differently."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from cts.eval.data.schema import Record
from cts.eval.rejudge import RejudgeResult, rejudge_experiment, rejudge_run
from cts.eval.report.frame import AnalysisExtraMissing, records_table
from cts.eval.report.report import load_run
from cts.eval.report.summary import Summary, read_summary
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.run_dir import RunDir
from cts.eval.run.runner import RunControl
from cts.eval.run.traces import inside, read_trace_file
from cts.foundation.yaml_config import Override

if TYPE_CHECKING:
    import pandas


class TraceUnavailable(LookupError):
    """A record's trace that cannot be read: none recorded, outside the run, or unreadable."""


@dataclass(frozen=True)
class Run:
    """A run directory as `cts run` writes it, read lazily (`open_run`)."""

    path: Path
    _dir: RunDir = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_dir", RunDir(self.path))

    @cached_property
    def config(self) -> ResolvedExperiment:
        """The experiment the records were made with (config.yaml)."""
        return self._dir.read_config()

    @property
    def name(self) -> str:
        """How reports name its clarifier system."""
        return self.config.system_name()

    def records(self) -> list[Record]:
        """Every record of the keys config.yaml names, sorted by key (what `cts report` reads;
        records a narrowed resume left outside are not among them)."""
        return sorted(load_run(self.path).records, key=lambda r: r.key)

    def summary(self) -> Summary:
        """Its report's numbers, typed (summary.json; SummaryError naming a bad field)."""
        return read_summary(self._dir.root / "summary.json")

    def frame(self) -> pandas.DataFrame:
        """Its records as a pandas table (the `analysis` extra): one row per record."""
        return runs_frame([self.path])

    def trace(self, record: Record) -> dict[str, Any]:
        """The search trace a record names, parsed (TraceUnavailable with why otherwise)."""
        if not record.trace_id:
            raise TraceUnavailable(f"{record.key}: no trace recorded")
        path = inside(self._dir.root / "traces", record.trace_id)
        if path is None or not path.is_file():
            raise TraceUnavailable(f"{record.key}: no trace file {record.trace_id!r} in the run")
        trace, why = read_trace_file(path)
        if trace is None:
            raise TraceUnavailable(f"{record.key}: {why}")
        return trace


def open_run(path: str | Path) -> Run:
    """The run in `path` (RunDirError when it holds no config.yaml)."""
    run = Run(Path(path))
    run.config  # noqa: B018 - refused now, not at the first use
    return run


def runs_frame(paths: Iterable[str | Path]) -> pandas.DataFrame:
    """The records of several runs as one pandas table, a `run` column naming each run's
    clarifier system and a `run_dir` column its directory: comparing clarifier systems in a
    notebook (pair them on instance_id, condition and seed, as the report does)."""
    try:
        import pandas
    except ImportError as e:
        raise AnalysisExtraMissing(
            "runs_frame needs pandas: pip install 'clarify-then-search[analysis]'"
        ) from e
    rows = []
    for path in paths:
        run = open_run(path)
        rows += [
            {"run": run.name, "run_dir": str(run.path), **row} for row in records_table(run.path)
        ]
    return pandas.DataFrame(rows)


def rejudge(
    source: str | Path,
    out: str | Path,
    overrides: Sequence[str | Override] = (),
    config: str | Path | None = None,
    **control: Unpack[RunControl],
) -> RejudgeResult:
    """`cts rejudge SOURCE --output-dir OUT --set …`: the source run's answers judged again
    with `overrides` (the judge only; anything else is refused) into `out`."""
    resolved = rejudge_experiment(Path(source), Path(out), config, overrides)
    return rejudge_run(resolved, Path(source), Path(out), **control)
