"""One instance under one condition and seed, end to end: clarify (k turns) → answer → rewrite →
search → judge → score. The information flow is fixed here: the fused query goes to the user
answerer and the judge only (and is the search query of the `oracle` upper bound, and of
golden construction's `golden` key, whose trace the nugget builder reads)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agents import clarifier, judge, rewriter, user_answerer
from agents.question_type import classify, classify_with_model
from agents.types import QA
from agents.user_answerer import unsupported_words
from eval.config import ClarificationConfig, GoldenConfig
from eval.golden import GOLDEN, NoEvidence, golden_nuggets
from eval.metrics import restore_score
from eval.schema import Instance, Nugget
from serving.engine import ChatModel
from serving.errors import EngineError
from serving.types import Sampling
from webdancer.agent import WebDancerAgent
from webdancer.tool_cache import ToolCacheMiss


def clarify_turns(condition: str) -> int | None:
    """k of `clarify@k`; None for blurred and oracle."""
    if condition.startswith("clarify@"):
        return int(condition.split("@", 1)[1])
    return None


class Record(BaseModel):
    """One line of records/<condition>/shard-<i>-of-<n>.jsonl."""

    instance_id: str
    condition: str
    seed: int
    questions: list[str] = []
    answers: list[str] = []
    question_types: list[str] = []
    #: Abstractive User Answerer only: per answer, content words not in the fused query.
    unsupported_words: list[list[str]] = []
    stopped_early: bool = False
    rewrite: str | None = None
    search_query: str = ""
    answer: str = ""
    termination: str = ""
    doc_ids: list[str] = []
    trace_id: str | None = None
    #: Golden construction only: the nuggets extracted from this (fused-query) search run.
    nuggets: list[Nugget] = []
    labels: dict[str, dict[str, str]] = {}
    scores: dict[str, float] = {}
    usage: dict[str, int] = {}
    seconds: float = 0.0
    #: {kind, stage, message} when the instance failed; the run goes on.
    error: dict[str, str] | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.instance_id, self.condition, self.seed)


@dataclass
class PipelineContext:
    roles: dict[str, ChatModel]
    agent: WebDancerAgent
    sampling: dict[str, Sampling]
    clarification: ClarificationConfig = field(default_factory=ClarificationConfig)
    golden: GoldenConfig = field(default_factory=GoldenConfig)
    trace_dir: Path | None = None


def _seeded(sampling: Sampling, seed: int) -> Sampling:
    return sampling.model_copy(update={"seed": seed})


async def run_instance(
    instance: Instance, condition: str, seed: int, ctx: PipelineContext
) -> Record:
    record = Record(instance_id=instance.id, condition=condition, seed=seed)
    started = time.perf_counter()
    stage = ""

    def mark(name: str) -> None:
        nonlocal stage
        stage = name

    try:
        k = clarify_turns(condition)
        if condition in ("oracle", GOLDEN):
            query = instance.fused_query
        elif k is None:
            query = instance.blurred_query
        else:
            pairs = await _clarify(instance, k, seed, ctx, record, mark)
            stage = "rewrite"
            query = await rewriter.rewrite(
                ctx.roles["rewriter"],
                instance.blurred_query,
                pairs,
                instance.language,
                _seeded(ctx.sampling["rewriter"], seed),
            )
            record.rewrite = query
        record.search_query = query
        stage = "search"
        result = await ctx.agent.run(query)
        record.answer, record.termination, record.doc_ids = (
            result.answer,
            result.termination,
            result.doc_ids,
        )
        record.usage = {
            "search_llm_calls": result.llm_calls,
            "search_cached_calls": result.cached_llm_calls,
            "search_prompt_tokens": result.prompt_tokens,
            "search_completion_tokens": result.completion_tokens,
        }
        if ctx.trace_dir is not None:
            record.trace_id = _write_trace(ctx.trace_dir, record, result.as_dict())
        if result.termination == "error":
            record.error = {"kind": "search_error", "stage": stage, "message": result.error or ""}
            return record
        if condition == GOLDEN:
            stage = "nuggets"
            try:
                record.nuggets = await golden_nuggets(
                    ctx.roles["nugget_builder"],
                    instance,
                    result.answer,
                    result.steps,
                    _seeded(ctx.sampling["nugget_builder"], seed),
                    ctx.golden.max_nuggets,
                    ctx.golden.max_evidence_chars,
                )
            except NoEvidence as e:
                record.error = {"kind": "no_evidence", "stage": stage, "message": str(e)}
        elif instance.golden is not None:
            stage = "judge"
            labels = await judge.judge(
                ctx.roles["judge"],
                instance.fused_query,
                result.answer,
                instance.golden.nuggets,
                instance.language,
                ctx.sampling["judge"],
            )
            record.labels = {
                i: {"label": v.label, "evidence": v.evidence} for i, v in labels.items()
            }
            weights = {n.id: n.weight for n in instance.golden.nuggets}
            chosen = {i: v.label for i, v in labels.items()}
            record.scores = {
                "restore_score_100": restore_score(chosen, weights),  # type: ignore[arg-type]
                "strict": restore_score(chosen, weights, strict=True),  # type: ignore[arg-type]
                "unweighted": restore_score(chosen, weights, weighted=False),  # type: ignore[arg-type]
            }
    except (EngineError, ToolCacheMiss) as e:
        kind = e.kind if isinstance(e, EngineError) else "tool_cache_miss"
        record.error = {"kind": kind, "stage": stage, "message": str(e)[:2000]}
    finally:
        record.seconds = round(time.perf_counter() - started, 3)
    return record


async def _clarify(
    instance: Instance,
    k: int,
    seed: int,
    ctx: PipelineContext,
    record: Record,
    mark: Callable[[str], None],
) -> list[QA]:
    """k questions (sequential turns, or all at once), each answered by the User Answerer; the
    record gets questions, answers, their types and the abstractive post-check. `mark` names
    the stage in progress for the error record."""
    options = ctx.clarification
    ask_sampling = _seeded(ctx.sampling["clarifier"], seed)
    pairs: list[QA] = []

    async def answer(question: str) -> None:
        mark("answer")
        reply = await user_answerer.answer(
            ctx.roles["user_answerer"],
            instance.fused_query,
            question,
            instance.language,
            _seeded(ctx.sampling["user_answerer"], seed),
            mode=options.answerer,
        )
        pairs.append(QA(question=question, answer=reply))
        record.questions.append(question)
        record.answers.append(reply)
        if options.answerer == "abstractive":
            record.unsupported_words.append(unsupported_words(reply, instance.fused_query))

    if options.mode == "all_at_once":
        mark("clarify")
        questions = await clarifier.ask_all(
            ctx.roles["clarifier"],
            instance.blurred_query,
            k,
            instance.language,
            ask_sampling,
            allow_stop=options.allow_stop,
        )
        record.stopped_early = len(questions) < k
        for question in questions:
            await answer(question)
    else:
        for _ in range(k):
            mark("clarify")
            turn = await clarifier.ask(
                ctx.roles["clarifier"],
                instance.blurred_query,
                pairs,
                instance.language,
                ask_sampling,
                allow_stop=options.allow_stop,
            )
            if turn.stop:
                record.stopped_early = True
                break
            await answer(turn.question)
    mark("classify")
    for question in record.questions:
        if options.question_types == "llm":
            record.question_types.append(
                await classify_with_model(
                    ctx.roles["question_classifier"],
                    question,
                    instance.language,
                    ctx.sampling["question_classifier"],
                )
            )
        else:
            record.question_types.append(classify(question))
    return pairs


def _write_trace(trace_dir: Path, record: Record, trace: dict[str, Any]) -> str:
    name = f"{record.condition.replace('@', '-')}/{record.instance_id}-seed{record.seed}.json"
    path = trace_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(trace, ensure_ascii=False, indent=1))
    partial.replace(path)
    return name
