"""A run's records as a table, the way an analyst reads numbers in a notebook.

`records_frame(run_dir)` gives one row per record of the keys the run's config.yaml names (the
same records `cts report` stands on, cts/eval/report/report.py `load_run`): the key, the instance's
language, the dialogue's size, the outcome (`error_kind`, `error_stage`, or none), each score
as a column (`restore_score_100`, …) and each usage counter as `usage.<name>`. pandas is an
optional extra (`pip install 'clarify-then-search[analysis]'`); `records_table` gives the same
rows as plain dicts without it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cts.agents.types import UNKNOWN
from cts.eval.data.schema import Record
from cts.eval.report.report import load_run

if TYPE_CHECKING:
    import pandas

#: The key columns, first in every row and in the frame's sort order.
KEY_COLUMNS = ("instance_id", "condition", "seed")


class AnalysisExtraMissing(ImportError):
    """pandas is not installed: the frame needs the `analysis` extra."""


def record_row(record: Record) -> dict[str, Any]:
    """One record as a flat row: scores and usage spread into columns, lists counted."""
    error = record.error or {}
    row: dict[str, Any] = {
        "instance_id": record.instance_id,
        "condition": record.condition,
        "seed": record.seed,
        "language": record.language,
        "removed_constraints": ",".join(record.removed_constraints),
        "questions": len(record.questions),
        "answers_not_unknown": sum(a != UNKNOWN for a in record.answers),
        "stopped_early": record.stopped_early,
        "termination": record.termination,
        "error_kind": error.get("kind"),
        "error_stage": error.get("stage"),
        "seconds": record.seconds,
        "trace_id": record.trace_id,
    }
    row.update(record.scores)
    row.update({f"usage.{name}": value for name, value in record.usage.items()})
    return row


def records_table(run_dir: Path) -> list[dict[str, Any]]:
    """Every record the run's config names, as rows sorted by key (see `record_row`)."""
    records = load_run(Path(run_dir)).records
    return [record_row(r) for r in sorted(records, key=lambda r: r.key)]


def records_frame(run_dir: Path) -> pandas.DataFrame:
    """`records_table` as a pandas DataFrame (AnalysisExtraMissing without pandas). A score a
    failed record lacks is NaN, so `frame.groupby("condition").restore_score_100.mean()`
    leaves failures out, as `--failures exclude` does."""
    try:
        import pandas
    except ImportError as e:
        raise AnalysisExtraMissing(
            "records_frame needs pandas: pip install 'clarify-then-search[analysis]' "
            "(or use cts.eval.report.frame.records_table for plain rows)"
        ) from e
    return pandas.DataFrame(records_table(run_dir))
