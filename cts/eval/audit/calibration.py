"""How far to trust the coverage judge: its labels against people's on a labelled JSONL.

Each row is one (answer, nugget) pair a person labelled `full` / `partial` / `none`; the rows
of one answer (its `group`) are judged together, in one batch, as a run judges a record. The
experiment's judge (its model, sampling and `judge.*` options, the response cache off) labels
every answer three times:

- as listed: agreement with the people — Cohen's κ over the three labels and over strict
  full-vs-rest, the confusion matrix, label rates by the nugget's position in its batch and
  by the answer's length (beside the people's rates at the same places, so a position effect
  of the data is not mistaken for the judge's);
- with the nuggets in another order (a fixed shuffle of each answer's nuggets): the share of
  labels that change (order flip);
- as listed again, the same requests: the share of labels that change (rerun identity).

Every figure carries its n. An answer whose judge call fails is left out of the figures that
need it and listed with why."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cts.agents import judge
from cts.eval.audit.judge_labels import (
    LABELS,
    LabelledAnswer,
    LabelledNugget,
    LabelSet,
)
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import JudgeConfig
from cts.eval.run.engines import open_engines
from cts.eval.run.progress import ShowProgress, progress
from cts.eval.score.kappa import STRICT_LABELS, Rate, cohen_kappa, confusion, strict
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.types import Sampling

# -- agreement --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    n: int
    #: Share of pairs where the judge gave the people's label.
    accuracy: float | None
    kappa: float | None
    #: κ over full vs partial-or-none (the strict score's distinction).
    strict_kappa: float | None
    #: Rows: the people's label, columns: the judge's, both in LABELS order.
    confusion: list[list[int]]
    #: How much more the judge credits than the people, in restore-score points: the mean of
    #: 100 · (s(judge) − s(people)) over the pairs (s: full 1, partial 0.5, none 0). Below 0:
    #: stricter than the people. None without pairs.
    shift: float | None = None


#: A label's credit in the restore score (cts.eval.score.metrics).
_CREDIT = {"full": 1.0, "partial": 0.5, "none": 0.0}


def agreement(people: Sequence[str], judged: Sequence[str]) -> Agreement:
    """The judge's labels against the people's, pair by pair (κ and the confusion matrix as
    `cts judge agreement` computes them between two judges; the shift in score points)."""
    pairs = list(zip(people, judged, strict=True))
    kappa = cohen_kappa(pairs, LABELS)
    shifts = [100 * (_CREDIT[b] - _CREDIT[a]) for a, b in pairs]
    return Agreement(
        n=len(pairs),
        accuracy=kappa.observed,
        kappa=kappa.kappa,
        strict_kappa=cohen_kappa([(strict(a), strict(b)) for a, b in pairs], STRICT_LABELS).kappa,
        confusion=confusion(pairs, LABELS).counts,
        shift=sum(shifts) / len(shifts) if shifts else None,
    )


@dataclass(frozen=True)
class RateRow:
    """Label rates of the pairs in one bucket (a batch position, an answer length)."""

    bucket: str
    n: int
    judge: dict[str, float]
    people: dict[str, float]


def rates(labels: Sequence[str]) -> dict[str, float]:
    counts = Counter(labels)
    return {label: counts[label] / len(labels) if labels else 0.0 for label in LABELS}


def rate_table(rows: Sequence[tuple[str, str, str]], order: Sequence[str]) -> list[RateRow]:
    """(bucket, people's label, judge's label) → one row per bucket of `order` that has pairs."""
    table = []
    for bucket in order:
        inside = [(p, j) for b, p, j in rows if b == bucket]
        if inside:
            table.append(
                RateRow(
                    bucket,
                    len(inside),
                    rates([j for _, j in inside]),
                    rates([p for p, _ in inside]),
                )
            )
    return table


# Units of length: a CJK character, or a run of letters and digits (a word, a number).
_UNIT = re.compile(
    r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+"
)


def length_units(text: str) -> int:
    """Words, with each CJK character one unit, so that Chinese and English answers of the
    same content fall in similar buckets."""
    return len(_UNIT.findall(text))


def length_quartiles(answers: Sequence[LabelledAnswer], parts: int = 4) -> dict[str, str]:
    """Group → its length bucket, "low-high" in units: the answers sorted by length and cut
    into `parts` (nearly) equal parts, so that every bucket has pairs whatever lengths a labels
    file holds; answers of equal length share a bucket."""
    units = sorted(length_units(a.answer) for a in answers)
    part_of: dict[int, int] = {}
    for k, u in enumerate(units):
        part_of.setdefault(u, k * parts // len(units))
    spans: dict[int, list[int]] = {}
    for u, part in part_of.items():
        spans.setdefault(part, []).append(u)
    name = {u: f"{min(spans[part])}-{max(spans[part])}" for u, part in part_of.items()}
    return {a.group: name[length_units(a.answer)] for a in answers}


#: Resamples of `kappa_ci`.
KAPPA_RESAMPLES = 2000


def kappa_ci(
    by_answer: Sequence[Sequence[tuple[str, str]]], resamples: int = KAPPA_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile bootstrap CI of the 3-label κ over (people, judge) pairs, resampling whole
    answers (an answer's nuggets are judged in one call, so its labels are not independent);
    resamples where κ is undefined are left out. None with fewer than 2 answers."""
    if len(by_answer) < 2:
        return None
    rng = random.Random(seed)
    found = []
    for _ in range(resamples):
        drawn = rng.choices(range(len(by_answer)), k=len(by_answer))
        value = cohen_kappa([p for i in drawn for p in by_answer[i]], LABELS).kappa
        if value is not None:
            found.append(value)
    if not found:
        return None
    found.sort()
    low = found[int(0.025 * (len(found) - 1))]
    return low, found[round(0.975 * (len(found) - 1))]


# -- judging ----------------------------------------------------------------------------------


@dataclass
class Calibration:
    labels_file: str
    answers: int
    pairs: int
    batch_size: int
    agreement: Agreement
    by_language: dict[str, Agreement]
    #: None when `--passes agreement` skipped the shuffled pass, or the rerun.
    order_flip: Rate | None
    rerun: Rate | None
    #: Label rates by 1-based position in the judge's batch.
    by_position: list[RateRow]
    #: Label rates by answer length (units: words and CJK characters).
    by_length: list[RateRow]
    #: Per pass (`listed`, `shuffled`, `rerun`), the answers whose judge call failed, and why.
    failed: dict[str, dict[str, str]] = field(default_factory=dict)
    #: 95% bootstrap CI of the 3-label κ, resampling answers (`kappa_ci`); None when undefined.
    kappa_ci: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        # The file counts labels that changed under the name it always had.
        for name, moved in (("order_flip", self.order_flip), ("rerun", self.rerun)):
            doc[name] = None if moved is None else moved.as_dict("changed")
        return doc


#: One judge call per answer: the nuggets' labels by id.
JudgeCall = Callable[[LabelledAnswer, Sequence[LabelledNugget]], Awaitable[dict[str, str]]]


def flipped(answer: LabelledAnswer) -> list[LabelledNugget]:
    """The answer's nuggets in another order: a shuffle fixed by the group, reversed when the
    shuffle happens to leave the order as listed."""
    listed = list(answer.nuggets)
    order = judge.shuffled(listed, f"calibrate\x1f{answer.group}")
    return order if order != listed else listed[::-1]


async def _pass(
    call: JudgeCall,
    answers: Sequence[LabelledAnswer],
    order: Callable[[LabelledAnswer], Sequence[LabelledNugget]],
    concurrency: int,
    done: Callable[[bool], None],
) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(group, nugget id) → the judge's label for every answer, and the failed answers;
    `done(failed)` after each answer.

    A failure of one answer fails that answer only, whatever raised: an engine's error, or an
    unexpected one (a judge that cannot read some answer's text). The unexpected kind is not
    hidden: it is listed against that answer's rows as a likely bug in the judge, and counted,
    where letting it end the calibration would throw away every other answer's labels."""
    limit = asyncio.Semaphore(concurrency)
    labels: dict[tuple[str, str], str] = {}
    failed: dict[str, str] = {}

    async def one(answer: LabelledAnswer) -> None:
        async with limit:
            try:
                got = await call(answer, order(answer))
            except Exception as e:  # listed against its answer: see the docstring
                failed[answer.group] = _failure(answer, e)
                done(True)
                return
        done(False)
        labels.update({(answer.group, i): label for i, label in got.items()})

    await asyncio.gather(*(one(a) for a in answers))
    return labels, failed


def _failure(answer: LabelledAnswer, error: Exception) -> str:
    """Why an answer's judge call failed, naming its rows' lines (an unexpected error as such)."""
    lines = ", ".join(str(n.line) for n in answer.nuggets)
    kind = "" if isinstance(error, EngineError) else "unexpected error (a bug in the judge?) "
    return f"lines {lines}: {kind}{type(error).__name__}: {error}"[:300]


def _changed(
    first: dict[tuple[str, str], str], second: dict[tuple[str, str], str], keys: set[Any]
) -> Rate:
    both = [k for k in keys if k in first and k in second]
    return Rate(len(both), sum(first[k] != second[k] for k in both))


def reorderable(answers: Sequence[LabelledAnswer]) -> list[LabelledAnswer]:
    """The answers the order flip judges again: one nugget has no other order."""
    return [a for a in answers if len(a.nuggets) > 1]


#: `--passes`: all three, or the listed pass alone (κ and the confusion matrix, a third of the
#: time; no order flip, no rerun identity).
PASSES = ("all", "agreement")


def judged_batches(labels: LabelSet, passes: str = "all") -> int:
    """Answers judged by `calibrate` over its passes (what its progress counts)."""
    if passes == "agreement":
        return len(labels.answers)
    return 2 * len(labels.answers) + len(reorderable(labels.answers))


Judged = tuple[dict[tuple[str, str], str], dict[str, str]]


async def _passes(
    call: JudgeCall, answers: Sequence[LabelledAnswer], passes: str, concurrency: int, done: Any
) -> tuple[Judged, Judged | None, Judged | None]:
    """The listed pass and, for `all`, the shuffled one beside it (their requests share the
    engine's batches), then the rerun of the listed requests once those are answered."""
    as_listed: Callable[[LabelledAnswer], Sequence[LabelledNugget]] = lambda a: a.nuggets  # noqa: E731
    if passes == "agreement":
        return await _pass(call, answers, as_listed, concurrency, done), None, None
    listed, shuffled = await asyncio.gather(
        _pass(call, answers, as_listed, concurrency, done),
        _pass(call, reorderable(answers), flipped, concurrency, done),
    )
    again = await _pass(call, answers, as_listed, concurrency, done)
    return listed, shuffled, again


async def calibrate(
    call: JudgeCall,
    labels: LabelSet,
    batch_size: int = judge.BATCH,
    concurrency: int = 4,
    done: Callable[[bool], None] = lambda failed: None,
    passes: str = "all",
) -> Calibration:
    """The passes (listed and shuffled together, then listed again, so that the rerun repeats
    requests already answered; or, for `agreement`, listed alone), and every figure from
    them."""
    answers = labels.answers
    (listed, failed_listed), shuffled, again = await _passes(
        call, answers, passes, concurrency, done
    )
    several = reorderable(answers)
    length_of = length_quartiles(answers)
    people: list[str] = []
    judged: list[str] = []
    by_answer: dict[str, list[tuple[str, str]]] = {}
    languages: dict[str, tuple[list[str], list[str]]] = {}
    positions: list[tuple[str, str, str]] = []
    lengths: list[tuple[str, str, str]] = []
    for answer in answers:
        bucket = length_of[answer.group]
        for k, nugget in enumerate(answer.nuggets):
            got = listed.get((answer.group, nugget.id))
            if got is None:
                continue
            people.append(nugget.label)
            judged.append(got)
            by_answer.setdefault(answer.group, []).append((nugget.label, got))
            mine = languages.setdefault(answer.language, ([], []))
            mine[0].append(nugget.label)
            mine[1].append(got)
            positions.append((str(k % batch_size + 1), nugget.label, got))
            lengths.append((bucket, nugget.label, got))
    every = {(a.group, n.id) for a in answers for n in a.nuggets}
    flippable = {(a.group, n.id) for a in several for n in a.nuggets}
    return Calibration(
        labels_file=labels.path,
        answers=len(answers),
        pairs=labels.pairs,
        batch_size=batch_size,
        agreement=agreement(people, judged),
        by_language={lang: agreement(*pair) for lang, pair in sorted(languages.items())},
        order_flip=None if shuffled is None else _changed(listed, shuffled[0], flippable),
        rerun=None if again is None else _changed(listed, again[0], every),
        by_position=rate_table(positions, [str(p) for p in range(1, batch_size + 1)]),
        by_length=rate_table(
            lengths, sorted(set(length_of.values()), key=lambda b: int(b.split("-")[0]))
        ),
        failed={
            name: found
            for name, found in (
                ("listed", failed_listed),
                ("shuffled", shuffled[1] if shuffled else {}),
                ("rerun", again[1] if again else {}),
            )
            if found
        },
        kappa_ci=kappa_ci(list(by_answer.values())),
    )


def judge_call(engine: ChatModel, sampling: Sampling, options: JudgeConfig) -> JudgeCall:
    """The configured judge on one answer: its prompt, schema and sampling as a run uses them;
    the query is shown only with `judge.show_query` (and when the row has one)."""

    async def call(answer: LabelledAnswer, nuggets: Sequence[LabelledNugget]) -> dict[str, str]:
        got = await judge.judge(
            engine,
            answer.answer,
            nuggets,
            answer.language,
            sampling,
            query=answer.query if options.show_query else None,
            batch_size=options.batch_size,
            asked=answer.query or "",
        )
        return {i: v.label for i, v in got.items()}

    return call


def calibrate_experiment(
    resolved: ResolvedExperiment,
    labels: LabelSet,
    show_progress: ShowProgress = False,
    passes: str = "all",
) -> Calibration:
    """The experiment's judge role on `labels`, with the response cache off: a rerun must
    reach the model, and a cached answer would hide what the judge does today."""

    async def go() -> Calibration:
        async with open_engines(resolved, roles=["judge"], use_cache=False) as engines:
            options = resolved.experiment.judge
            call = judge_call(engines.roles["judge"], resolved.sampling_for("judge"), options)
            total = judged_batches(labels, passes)
            title = "judge calibration (3 passes)" if passes == "all" else "judge calibration"
            async with progress(title, total, 0, show_progress, unit="answers") as done:
                return await calibrate(
                    call,
                    labels,
                    options.batch_size,
                    resolved.experiment.concurrency,
                    done,
                    passes,
                )

    return asyncio.run(go())


# -- the report -------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _points(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


def _rate_lines(title: str, rows: list[RateRow]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| | n | judge full / partial / none | people full / partial / none |",
        "|---|---|---|---|",
    ]
    for row in rows:
        judged = " / ".join(_pct(row.judge[label]) for label in LABELS)
        people = " / ".join(_pct(row.people[label]) for label in LABELS)
        lines.append(f"| {row.bucket} | {row.n} | {judged} | {people} |")
    return [*lines, ""]


def _changes(changed: Rate | None) -> str:
    if changed is None:
        return "not measured (--passes agreement) | 0"
    return f"{_pct(changed.share)} ({changed.count}) | {changed.n}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" (95% CI {ci[0]:.3f} to {ci[1]:.3f}, answers resampled)"


def render(result: Calibration, judge_name: str = "") -> str:
    """The figures as Markdown, each with its n."""
    a = result.agreement
    who = f" ({judge_name})" if judge_name else ""
    lines = [
        f"## Judge calibration{who}",
        "",
        f"{result.labels_file}: {result.pairs} labelled pairs in {result.answers} answers; "
        f"batches of at most {result.batch_size} nuggets.",
        "",
        "| figure | value | n |",
        "|---|---|---|",
        f"| Cohen's κ, full / partial / none | {_num(a.kappa)}{_ci(result.kappa_ci)} | {a.n} |",
        f"| Cohen's κ, strict (full vs rest) | {_num(a.strict_kappa)} | {a.n} |",
        f"| agreement (same label) | {_pct(a.accuracy)} | {a.n} |",
        f"| score shift (judge − people, points; below 0: stricter) | {_points(a.shift)} | {a.n} |",
        f"| order flip (labels changed when the nuggets are shuffled) | "
        f"{_changes(result.order_flip)} |",
        f"| rerun identity (labels changed on the same request, cache off) | "
        f"{_changes(result.rerun)} |",
    ]
    for language, found in result.by_language.items():
        lines.append(
            f"| κ, language {language} (strict κ {_num(found.strict_kappa)}; "
            f"score shift {_points(found.shift)}) | {_num(found.kappa)} | {found.n} |"
        )
    lines += [
        "",
        "### Confusion (rows: people, columns: judge)",
        "",
        "| people \\ judge | " + " | ".join(LABELS) + " |",
        "|---|---|---|---|",
    ]
    for label, row in zip(LABELS, a.confusion, strict=True):
        lines.append(f"| {label} | " + " | ".join(str(c) for c in row) + " |")
    lines.append("")
    lines += _rate_lines("Label rates by position in the batch", result.by_position)
    lines += _rate_lines(
        "Label rates by answer length (words; a CJK character is one)", result.by_length
    )
    for name, failed in result.failed.items():
        lines.append(f"{len(failed)} answer(s) failed in the {name} pass and are left out of it:")
        lines += [f"- {group}: {why}" for group, why in list(failed.items())[:20]]
    return "\n".join(lines).rstrip() + "\n"
