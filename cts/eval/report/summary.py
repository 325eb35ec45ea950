"""summary.json as a typed object, read and written here only.

`cts report` (cts/eval/report/report.py write_report) writes it; the command line's main table,
the training loop's table and a Python user read it with `read_summary`. The sections a
report computes in depth (scores per condition, gains, the clarification and judge
diagnostics, breakdowns…) stay JSON objects inside their typed place, as written (their fields
are listed in docs/reading-the-report.md); the two that code reads, a score with its CI and a
gain, are read through typed views (`SystemSummary.score`, `.gain`). Dumped as it was built,
the file is byte-for-byte what the dicts gave before this type existed: fields in the order
written, numbers never converted (an int stays an int)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from cts.foundation.disk import write_whole


class SummaryError(ValueError):
    """A summary.json this version cannot read (the message names the file and the field)."""


#: A number as it was computed: an int is not widened to a float (the file stays identical).
Number = int | float


class _Section(BaseModel):
    # Older summaries may carry fields this version no longer writes: read, kept, written back.
    model_config = ConfigDict(extra="allow")


class ReportInfo(_Section):
    """What the report stands on: its runs, failure policy, gain-recovered gap and pairing."""

    runs: list[str]
    failure_policy: str
    min_gap: Number
    paired_instances: int
    #: Pairs shown although they differ beyond the clarifier (`allow_unlike`).
    unlike: list[dict[str, Any]] = []


class Score(_Section):
    """A mean restore score (points, 0–100) with its 95% bootstrap CI over `n` instances; the
    bounds are None where a CI cannot be drawn (one instance)."""

    mean: Number | None
    low: Number | None
    high: Number | None
    n: int


class Recovered(_Section):
    """Gain recovered: the clarified gain as a share of oracle's, with its 95% CI; `undefined`
    (no value) when oracle beats blurred by less than `min_gap` points (`gap`, the mean)."""

    value: Number | None = None
    low: Number | None = None
    high: Number | None = None
    n: int | None = None
    gap: Number | None = None
    undefined: bool = False


class Gain(_Section):
    """A condition's paired gain over blurred (points) with its 95% CI, its p-value and the
    smallest gain the pairing detects with 80% power (`mde`, None when not computed)."""

    gain_over_blurred: Number | None
    low: Number | None
    high: Number | None
    p_value: Number | None
    n: int
    mde: Number | None = None
    gain_recovered: Recovered | None = None


class SystemSummary(_Section):
    """One clarifier system's numbers (cts/eval/report/diagnostics.py summarize)."""

    records: int
    instances: int
    seeds: list[int]
    failure_policy: str
    paired_instances: int
    excluded_instances: dict[str, Any]
    #: condition → {n, failed, <score variant> → {mean, low, high, n}}
    scores: dict[str, Any]
    gains: dict[str, Any]
    clarification: dict[str, Any]
    score_by_answered: dict[str, Any]
    breakdowns: dict[str, Any]
    judge: dict[str, Any]
    reuse: dict[str, Any]
    failures: dict[str, Any]
    oracle_independence: dict[str, Any] | None = None
    ignored_records: dict[str, Any] | None = None
    #: condition → between, within (variances), seed_share, each with `<part>_low`/`_high`
    #: (bootstrap 95% CI over instances), icc, instances, seeds (cts/eval/score/power.py); absent
    #: from summaries written before it, and the between/within CIs from those before them.
    variance: dict[str, Any] | None = None

    def score(self, condition: str, variant: str = "restore_score_100") -> Score | None:
        """`variant`'s mean under `condition` with its 95% CI; None when it was not scored."""
        entry = self.scores.get(condition)
        found = None if entry is None else entry.get(variant)
        return None if found is None else Score.model_validate(found)

    def gain(self, condition: str) -> Gain | None:
        """`condition`'s paired gain over blurred; None for blurred or a condition not run."""
        found = self.gains.get(condition)
        return None if found is None else Gain.model_validate(found)


class Comparison(_Section):
    """A paired comparison of two systems on one condition: `difference` is a − b."""

    a: str
    b: str
    condition: str
    difference: Number | None
    low: Number | None
    high: Number | None
    p_value: Number | None
    #: Holm-adjusted over the clarify@k rows of the same pair; None for the other rows.
    p_holm: Number | None
    n: int
    unlike: list[Any] = []
    #: The smallest true difference the row's test detects with 80% power (α/m on a Holm row).
    mde: Number | None = None


class Summary(_Section):
    """The whole of summary.json: the report's footing, each system, and the comparisons."""

    report: ReportInfo
    systems: dict[str, SystemSummary]
    comparisons: list[Comparison]

    def comparison(self, a: str, b: str, condition: str) -> Comparison | None:
        """The row comparing `a` with `b` (in that order) on `condition`, if the report has it."""
        for row in self.comparisons:
            if (row.a, row.b, row.condition) == (a, b, condition):
                return row
        return None

    def write(self, path: Path) -> None:
        """Whole or absent (a full disk raises StorageFull naming the file)."""
        write_whole(path, json.dumps(self.model_dump(), indent=2, ensure_ascii=False))


def read_summary(path: Path) -> Summary:
    """A report's summary.json, or a SummaryError naming the file and the first bad field."""
    try:
        return Summary.model_validate_json(Path(path).read_bytes())
    except ValidationError as e:
        error = e.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise SummaryError(f"{path}: {where}: {error['msg']}") from None
