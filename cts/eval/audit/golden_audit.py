"""Auditing golden nuggets (`cts golden audit`): how many each instance has, their weights and
sources, near-duplicates within an instance, and whether the evidence each nugget cites states
it (the grounding check).

A nugget's `source_ids` resolve against the corpus (doc ids, or URLs) and, for a dataset that
golden construction wrote, against the evidence its golden trace showed (search hits and pages
read, as the nugget builder saw them). The grounding verdict (`support` / `partial` / `none`)
comes from the judge role's model with its own prompt (cts/agents/grounding.py), or, with no
model, from a lexical pre-filter: the share of the nugget's content terms found in the cited
text, one level lower when a number of the nugget is missing there. Terms are lowercased
words stemmed (a plural, -ed or -ing ending off, then a final e) and cut to 5 letters, jieba
words for Chinese, and numbers, stop words left out; the same terms give the near-duplicate
similarity (Jaccard), so both work for Chinese text.

A nugget that cites nothing that states it — no citation, citations that resolve to nothing,
or verdict `none` — is what the audit exists to find."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from statistics import mean, median
from typing import Any, Literal

from cts.agents import grounding
from cts.eval.audit.citations import (
    Citations,
    Source,
)
from cts.eval.audit.text_terms import (
    EXCERPT_CHARS,
    excerpt,
    similarity,
    terms,
)
from cts.eval.data.schema import Instance
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.engines import open_engines
from cts.foundation.yaml_config import ConfigError
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.types import Sampling

Verdict = Literal["support", "partial", "none"]

#: Two nuggets of one instance whose term sets overlap this much (Jaccard) are near-duplicates.
DUPLICATE_THRESHOLD = 0.6
#: Lexical pre-filter: share of the nugget's terms found in the cited text for `support`, and
#: for `partial`; a number of the nugget missing from the cited text lowers the verdict a level.
SUPPORT_COVERAGE = 0.7
PARTIAL_COVERAGE = 0.4
#: Instances with fewer nuggets than this are listed (one or two facts make a coarse score).
MIN_NUGGETS = 3
#: How much of the cited evidence the grounding model reads per call.
MODEL_EVIDENCE_CHARS = 4000


# -- per nugget -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lexical:
    verdict: Verdict
    #: Share of the nugget's terms found in the cited text.
    coverage: float
    missing_numbers: tuple[str, ...] = ()


_LEVELS: tuple[Verdict, ...] = ("none", "partial", "support")


def lexical_verdict(nugget: str, evidence: Sequence[str]) -> Lexical:
    """The pre-filter's verdict of `nugget` against the cited texts taken together."""
    wanted = terms(nugget)
    found: set[str] = set()
    for text in evidence:
        found |= terms(text)
    coverage = len(wanted & found) / len(wanted) if wanted else 0.0
    level = 2 if coverage >= SUPPORT_COVERAGE else 1 if coverage >= PARTIAL_COVERAGE else 0
    missing = tuple(sorted(t[1:] for t in wanted - found if t.startswith("#")))
    if missing:  # a wrong figure is the commonest way for close text not to state a fact
        level = max(0, level - 1)
    return Lexical(_LEVELS[level], round(coverage, 3), missing)


@dataclass(frozen=True)
class NuggetCheck:
    instance_id: str
    nugget_id: str
    text: str
    weight: float
    language: str
    source_ids: tuple[str, ...]
    sources: tuple[Source, ...]
    unresolved: tuple[str, ...]
    #: None when no citation resolved (there is nothing to compare with).
    lexical: Lexical | None
    model: grounding.Grounding | None = None
    #: Why the model gave no verdict (an engine error), when it gave none.
    model_error: str | None = None

    @property
    def id(self) -> str:
        return self.nugget_id

    @property
    def key(self) -> tuple[str, str]:
        return (self.instance_id, self.nugget_id)

    @property
    def verdict(self) -> str | None:
        """The model's verdict when one was asked for, else the lexical one; None when no
        citation resolved or the model failed."""
        if self.model is not None:
            return self.model.verdict
        if self.model_error is not None or self.lexical is None:
            return None
        return self.lexical.verdict

    @property
    def problem(self) -> str | None:
        """Why this nugget cites nothing that supports it, or None."""
        if not self.source_ids:
            return "no citation"
        if not self.sources:
            return "cites only sources that resolve to nothing"
        if self.verdict == "none":
            return "verdict none"
        return None

    def excerpt(self, limit: int = EXCERPT_CHARS) -> str:
        """The cited evidence closest to the nugget (from its best-matching source)."""
        if not self.sources:
            return ""
        best = max(self.sources, key=lambda s: len(terms(self.text) & terms(s.text)))
        return excerpt(best.text, [self.text], limit)


def check_nuggets(instances: Iterable[Instance], citations: Citations) -> list[NuggetCheck]:
    """Every golden nugget with its citations resolved and the lexical verdict."""
    checks = []
    for instance in instances:
        for nugget in instance.golden.nuggets if instance.golden else []:
            resolved = [(s, citations.resolve(instance.id, s)) for s in nugget.source_ids]
            sources = tuple(r for _, r in resolved if r is not None)
            checks.append(
                NuggetCheck(
                    instance_id=instance.id,
                    nugget_id=nugget.id,
                    text=nugget.text,
                    weight=nugget.weight,
                    language=instance.language,
                    source_ids=tuple(nugget.source_ids),
                    sources=sources,
                    unresolved=tuple(s for s, r in resolved if r is None),
                    lexical=(
                        lexical_verdict(nugget.text, [s.text for s in sources]) if sources else None
                    ),
                )
            )
    return checks


# -- the model check ------------------------------------------------------------------------------


@dataclass
class ModelGrounding:
    """The model's verdict per (instance id, nugget id), and why it gave none where it failed."""

    model: str
    verdicts: dict[tuple[str, str], grounding.Grounding] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    calls: int = 0


def _model_batches(checks: Sequence[NuggetCheck]) -> list[list[NuggetCheck]]:
    """Nuggets of one instance citing the same sources share a call, at most BATCH each."""
    groups: dict[tuple[str, tuple[str, ...]], list[NuggetCheck]] = defaultdict(list)
    for check in checks:
        if check.sources:
            groups[(check.instance_id, tuple(s.id for s in check.sources))].append(check)
    step = grounding.BATCH
    return [group[i : i + step] for group in groups.values() for i in range(0, len(group), step)]


async def model_grounding(
    engine: ChatModel,
    checks: Sequence[NuggetCheck],
    sampling: Sampling,
    max_evidence_chars: int = MODEL_EVIDENCE_CHARS,
) -> ModelGrounding:
    """The grounding model's verdict for every nugget whose citations resolved; each source
    cut to its share of `max_evidence_chars`, keeping the sentences closest to the nuggets.
    A call that fails (an engine error, an answer outside the schema) leaves its nuggets
    without a verdict, with the error: never a silent pass."""
    result = ModelGrounding(model=getattr(engine, "model", ""))

    async def one(batch: list[NuggetCheck]) -> None:
        sources = batch[0].sources
        share = max(300, max_evidence_chars // len(sources))
        evidence = [(s.id, excerpt(s.text, [c.text for c in batch], share)) for s in sources]
        try:
            verdicts = await grounding.ground(engine, evidence, batch, batch[0].language, sampling)
        except EngineError as e:
            for check in batch:
                result.errors[check.key] = f"{type(e).__name__}: {e}"[:300]
            return
        finally:
            result.calls += 1
        for check in batch:
            result.verdicts[check.key] = verdicts[check.nugget_id]

    await asyncio.gather(*(one(b) for b in _model_batches(checks)))
    return result


def require_grounding_judge(resolved: ResolvedExperiment) -> None:
    """ConfigError, before any call, when the experiment has no judge role or its model answers
    no chat request (the lexical judge labels nuggets by itself: every grounding request would
    fail, each nugget left without a verdict)."""
    roles = resolved.experiment.roles
    if "judge" not in roles:
        raise ConfigError(
            f"{resolved.origins.where('roles')}: no judge role, whose model the grounding "
            "check uses (or audit with --lexical)"
        )
    if resolved.model_for("judge").engine == "lexical":
        raise ConfigError(
            f"{resolved.origins.where('roles', 'judge', 'model')}: roles.judge is "
            f"{roles['judge'].model!r}, the lexical judge (engine 'lexical'), which answers no "
            "chat request; the grounding check needs a language model as roles.judge (e.g. "
            "--set roles.judge.model=qwen3-8b), or audit with --lexical"
        )


async def judged_grounding(
    resolved: ResolvedExperiment, checks: Sequence[NuggetCheck], use_cache: bool = True
) -> ModelGrounding:
    """`model_grounding` with the engine and configured sampling of the experiment's judge
    role (the grounding check's own needs over them: temperature 0, fixed seed, room)."""
    require_grounding_judge(resolved)
    sampling = grounding.SAMPLING.apply(resolved.configured_sampling("judge"))
    async with open_engines(resolved, ["judge"], use_cache=use_cache) as engines:
        found = await model_grounding(engines.roles["judge"], checks, sampling)
    found.model = resolved.experiment.roles["judge"].model
    return found


# -- the audit ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Duplicate:
    instance_id: str
    first: str
    second: str
    similarity: float


def near_duplicates(instance: Instance, threshold: float = DUPLICATE_THRESHOLD) -> list[Duplicate]:
    """Pairs of the instance's nuggets whose terms overlap at least `threshold` (Jaccard)."""
    nuggets = instance.golden.nuggets if instance.golden else []
    found = []
    for i, a in enumerate(nuggets):
        for b in nuggets[i + 1 :]:
            s = similarity(a.text, b.text)
            if s >= threshold:
                found.append(Duplicate(instance.id, a.id, b.id, round(s, 3)))
    return found


@dataclass
class GoldenAudit:
    #: `lexical`, or `model <name>` (the judge role's model).
    method: str
    instances: int
    without_golden: list[str]
    checks: list[NuggetCheck]
    duplicates: list[Duplicate]
    #: Nugget pairs compared for near-duplicates.
    pairs_compared: int
    missing_traces: list[str] = field(default_factory=list)
    threshold: float = DUPLICATE_THRESHOLD

    @property
    def with_golden(self) -> int:
        return self.instances - len(self.without_golden)

    @property
    def flagged(self) -> list[NuggetCheck]:
        """Nuggets that cite nothing that supports them."""
        return [c for c in self.checks if c.problem is not None]

    @property
    def unjudged(self) -> list[NuggetCheck]:
        """Nuggets with resolved citations the model gave no verdict for (it failed)."""
        return [c for c in self.checks if c.model_error is not None]

    def per_instance(self) -> Counter[str]:
        return Counter(c.instance_id for c in self.checks)

    def few_nuggets(self) -> dict[str, int]:
        return {i: n for i, n in self.per_instance().items() if n < MIN_NUGGETS}

    def figures(self) -> dict[str, Any]:
        """Every figure with the n it is over."""
        counts = list(self.per_instance().values())
        nuggets = len(self.checks)
        weights = Counter(c.weight for c in self.checks)
        sources = Counter(len(c.source_ids) for c in self.checks)
        citations = [(c, s) for c in self.checks for s in c.source_ids]
        origins = Counter(s.origin for c in self.checks for s in c.sources)
        verdicts = Counter(c.verdict or "no verdict" for c in self.checks)
        figures: dict[str, Any] = {
            "method": self.method,
            "instances": {
                "n": self.instances,
                "with_golden": self.with_golden,
                "without_golden": len(self.without_golden),
            },
            "nuggets_per_instance": {
                "n_instances": len(counts),
                "distribution": {str(k): v for k, v in sorted(Counter(counts).items())},
                "min": min(counts, default=0),
                "median": median(counts) if counts else 0,
                "mean": round(mean(counts), 2) if counts else 0,
                "max": max(counts, default=0),
            },
            "fewer_than_3": {"n_instances": len(counts), "count": len(self.few_nuggets())},
            "weight_mix": {
                "n_nuggets": nuggets,
                "counts": {f"{w:g}": n for w, n in sorted(weights.items(), reverse=True)},
                "shares": {
                    f"{w:g}": round(n / nuggets, 3)
                    for w, n in sorted(weights.items(), reverse=True)
                },
            },
            "sources_per_nugget": {
                "n_nuggets": nuggets,
                "distribution": {str(k): v for k, v in sorted(sources.items())},
                "mean": round(len(citations) / nuggets, 2) if nuggets else 0,
            },
            "citations": {
                "n": len(citations),
                "resolved_in_corpus": origins.get("corpus", 0),
                "resolved_in_trace": origins.get("trace", 0),
                "unresolved": sum(len(c.unresolved) for c in self.checks),
            },
            "near_duplicates": {
                "n_pairs_compared": self.pairs_compared,
                "threshold": self.threshold,
                "count": len(self.duplicates),
            },
            "grounding": {
                "n_nuggets": nuggets,
                "verdicts": {v: verdicts.get(v, 0) for v in (*grounding.VERDICTS, "no verdict")},
                "flagged": len(self.flagged),
                "model_errors": len(self.unjudged),
            },
        }
        if self.method != "lexical":
            both = [c for c in self.checks if c.model is not None and c.lexical is not None]
            agree = sum(
                1 for c in both if c.lexical and c.model and c.lexical.verdict == c.model.verdict
            )
            figures["grounding"]["lexical_agreement"] = {
                "n_nuggets": len(both),
                "agree": agree,
                "share": round(agree / len(both), 3) if both else None,
            }
        return figures

    def as_dict(self) -> dict[str, Any]:
        return {
            "figures": self.figures(),
            "without_golden": self.without_golden,
            "fewer_than_3": self.few_nuggets(),
            "near_duplicates": [vars(d) for d in self.duplicates],
            "missing_traces": self.missing_traces,
            "nuggets": [_check_dict(c) for c in self.checks],
        }


def _check_dict(check: NuggetCheck) -> dict[str, Any]:
    return {
        "instance_id": check.instance_id,
        "nugget_id": check.nugget_id,
        "text": check.text,
        "weight": check.weight,
        "source_ids": list(check.source_ids),
        "resolved": {s.id: s.origin for s in check.sources},
        "unresolved": list(check.unresolved),
        "verdict": check.verdict,
        "lexical": None if check.lexical is None else vars(check.lexical),
        "model": None if check.model is None else vars(check.model),
        "model_error": check.model_error,
        "problem": check.problem,
    }


def golden_audit(
    instances: Sequence[Instance],
    checks: Sequence[NuggetCheck],
    model: ModelGrounding | None = None,
    missing_traces: Sequence[str] = (),
    threshold: float = DUPLICATE_THRESHOLD,
) -> GoldenAudit:
    """The audit of `instances` from their nugget checks, with the model's verdicts when the
    grounding check used a model (then its verdict is the verdict)."""
    if model is not None:
        checks = [
            replace(c, model=model.verdicts.get(c.key), model_error=model.errors.get(c.key))
            for c in checks
        ]
    with_golden = [i for i in instances if i.golden]
    duplicates = [d for i in with_golden for d in near_duplicates(i, threshold)]
    pairs = sum(
        len(i.golden.nuggets) * (len(i.golden.nuggets) - 1) // 2 for i in with_golden if i.golden
    )
    return GoldenAudit(
        method="lexical" if model is None else f"model {model.model}",
        instances=len(instances),
        without_golden=[i.id for i in instances if not i.golden],
        checks=list(checks),
        duplicates=duplicates,
        pairs_compared=pairs,
        missing_traces=list(missing_traces),
        threshold=threshold,
    )


# -- the sample for people ------------------------------------------------------------------------


def sample_checks(checks: Sequence[NuggetCheck], n: int, seed: int = 0) -> list[NuggetCheck]:
    """`n` nuggets drawn at random with `seed` (all of them when fewer), in dataset order."""
    if n >= len(checks):
        return list(checks)
    chosen = set(random.Random(seed).sample(range(len(checks)), n))
    return [c for i, c in enumerate(checks) if i in chosen]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _verdict_cell(check: NuggetCheck) -> str:
    """The verdict, what it rests on (the model's quote; the lexical coverage, which beside a
    model's verdict is a second opinion) and the problem, if any."""
    notes = []
    if check.model is not None:
        notes.append(f"model: “{check.model.quote}”")
    elif check.model_error is not None:
        notes.append(f"model error: {check.model_error}")
    if check.lexical is not None:
        lexical = f"coverage {check.lexical.coverage:.2f}"
        if check.lexical.missing_numbers:
            lexical += f", missing {', '.join(check.lexical.missing_numbers)}"
        if check.model is not None or check.model_error is not None:
            lexical = f"lexical {check.lexical.verdict}, {lexical}"
        notes.append(lexical)
    cell = (check.verdict or "—") + (f" ({'; '.join(notes)})" if notes else "")
    return cell + (f"; **{check.problem}**" if check.problem else "")


def sample_markdown(audit: GoldenAudit, sample: Sequence[NuggetCheck], seed: int) -> str:
    """The review sheet: each sampled nugget, the cited evidence closest to it, the verdict,
    and an empty column for the reviewer's."""
    lines = [
        "# Golden nugget audit: a sample for review",
        "",
        f"{len(sample)} of {len(audit.checks)} nuggets, drawn at random (seed {seed}); "
        f"grounding by {audit.method}. Write your own verdict (support / partial / none) in "
        "the last column; the excerpt is the cited text closest to the nugget, not all of it.",
        "",
        "| instance | nugget | weight | nugget text | cited | evidence excerpt | verdict | yours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in sample:
        cited = ", ".join(s if s not in c.unresolved else f"{s} (unresolved)" for s in c.source_ids)
        lines.append(
            f"| {_cell(c.instance_id)} | {_cell(c.nugget_id)} | {c.weight:g} | {_cell(c.text)} "
            f"| {_cell(cited) or '(none)'} | {_cell(c.excerpt()) or '(nothing)'} "
            f"| {_cell(_verdict_cell(c))} | |"
        )
    return "\n".join(lines) + "\n"
