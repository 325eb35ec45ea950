"""Pairing two judgements of the same answers: one run directory's records (`Judgement`), and the
labels and scores paired on (instance, condition, seed, nugget id) only where both judged the
same answer against the same nuggets. Every other key is counted by why it is left out or
listed as a mismatch, never silently joined."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cts.eval.data.schema import Record
from cts.eval.run.fingerprint import judge_setup
from cts.eval.run.records import Key, RecordStore
from cts.eval.run.run_dir import RunDir, RunDirError
from cts.eval.score.metrics import SCORE
from cts.foundation.yaml_config import read_yaml
from cts.serving.model_config import model_label

# -- runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """One run directory's records: its answers and the labels its judge gave them."""

    name: str
    path: Path
    #: The clarifier system, as reports name it.
    system: str
    #: The judge's model label.
    judge: str
    #: The run a rejudge re-scored (its rejudge.json), else None.
    source: Path | None
    records: dict[Key, Record] = field(repr=False)
    #: What its labels depend on besides the answers (cts.eval.run.fingerprint.judge_setup): equal
    #: in two judgements by the same judge; None when unknown.
    setup: str | None = None


def read_judgement(path: Path, name: str | None = None) -> Judgement:
    """A run directory as a judgement (RunDirError without config.yaml)."""
    run = RunDir(path)
    resolved = run.read_config()
    ref = resolved.experiment.roles["judge"].model if "judge" in resolved.experiment.roles else ""
    judge = model_label(ref, resolved.model_for("judge").name) if ref else "?"
    source = None
    if run.provenance.is_file():
        try:
            source = Path(json.loads(run.provenance.read_text("utf-8"))["source"]["path"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise RunDirError(
                f"{run.provenance}: unreadable ({type(e).__name__}: {e}); cannot tell which "
                "run it rejudged: restore it from a copy, or move the rejudge aside"
            ) from e
    document, _ = read_yaml(run.config)
    return Judgement(
        name or path.name,
        path,
        resolved.system_name(),
        judge,
        source,
        RecordStore(path).completed(),
        judge_setup(document),
    )


def replayed(record: Record) -> bool:
    """The record's judge answers all came from the response cache: its labels are what an
    earlier run's judge answered to the same requests, not a reading of this run's."""
    usage = record.usage
    return usage.get("judge_calls") == 0 and usage.get("judge_cached_calls", 0) > 0


def reached_judge(record: Record) -> bool:
    """The record has an answer the judge saw or should have seen."""
    return record.error is None or record.error.get("stage") == "judge"


# -- one pair of judgements ---------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    key: Key
    why: str


@dataclass(frozen=True)
class KeyAccount:
    """What became of every key either run recorded."""

    #: Judged in both, on the same answer and nuggets: their labels are compared.
    paired: int
    only_first: int
    only_second: int
    #: Failed in both runs (before the judge, as a rejudge copies it, or at both judges).
    failed_both: int
    #: One judge failed where the other labelled.
    judge_failed_first: int
    judge_failed_second: int
    #: Labelled by neither (an instance without golden nuggets).
    unscored: int
    #: Different answers or nuggets, or failed before the judge in one run only: listed.
    mismatched: int


@dataclass(frozen=True)
class LabelPair:
    key: Key
    nugget: str
    first: str
    second: str
    language: str
    removed_constraints: tuple[str, ...]


@dataclass
class Pairing:
    """Two judgements' records joined key by key."""

    labels: list[LabelPair]
    #: condition → instance → seed → (first's restore score, second's).
    scores: dict[str, dict[str, dict[int, tuple[float, float]]]]
    account: KeyAccount
    mismatches: list[Mismatch]


def pair(first: Judgement, second: Judgement) -> Pairing:
    a, b = first.records, second.records
    labels: list[LabelPair] = []
    scores: dict[str, dict[str, dict[int, tuple[float, float]]]] = {}
    mismatches: list[Mismatch] = []
    counts: Counter[str] = Counter()
    for key in sorted(set(a) | set(b)):
        ra, rb = a.get(key), b.get(key)
        if ra is None or rb is None:
            counts["only_first" if rb is None else "only_second"] += 1
            continue
        reached = reached_judge(ra), reached_judge(rb)
        if not any(reached):
            counts["failed_both"] += 1
            continue
        if not all(reached):
            failed, run = (ra, first.name) if not reached[0] else (rb, second.name)
            error = failed.error or {}
            why = (
                f"failed before the judge in {run} only ({error.get('stage')}: {error.get('kind')})"
            )
            mismatches.append(Mismatch(key, why))
            continue
        if ra.answer != rb.answer:
            mismatches.append(Mismatch(key, "the answers differ"))
            continue
        if ra.error is not None or rb.error is not None:
            counts[
                "failed_both"
                if ra.error and rb.error
                else "judge_failed_first"
                if ra.error
                else "judge_failed_second"
            ] += 1
            continue
        if not ra.labels and not rb.labels:
            counts["unscored"] += 1
            continue
        if set(ra.labels) != set(rb.labels):
            only_a, only_b = (
                sorted(set(ra.labels) - set(rb.labels)),
                sorted(set(rb.labels) - set(ra.labels)),
            )
            mismatches.append(
                Mismatch(
                    key,
                    f"the nuggets differ: only in {first.name} {only_a}, "
                    f"only in {second.name} {only_b}",
                )
            )
            continue
        counts["paired"] += 1
        for nugget in sorted(ra.labels):
            labels.append(
                LabelPair(
                    key,
                    nugget,
                    ra.labels[nugget]["label"],
                    rb.labels[nugget]["label"],
                    ra.language or "?",
                    tuple(ra.removed_constraints) or ("none",),
                )
            )
        if SCORE in ra.scores and SCORE in rb.scores:
            scores.setdefault(key[1], {}).setdefault(key[0], {})[key[2]] = (
                ra.scores[SCORE],
                rb.scores[SCORE],
            )
    account = KeyAccount(
        paired=counts["paired"],
        only_first=counts["only_first"],
        only_second=counts["only_second"],
        failed_both=counts["failed_both"],
        judge_failed_first=counts["judge_failed_first"],
        judge_failed_second=counts["judge_failed_second"],
        unscored=counts["unscored"],
        mismatched=len(mismatches),
    )
    return Pairing(labels, scores, account, mismatches)
