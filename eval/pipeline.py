"""One instance under one condition and seed, end to end: clarify (k turns) → answer → rewrite →
search → judge → score. The information flow is fixed here: the fused query goes to the user
answerer and, with `judge.show_query`, the judge (and is the search query of the `oracle` upper
bound, and of golden construction's `golden` key, whose trace the nugget builder reads)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, field_validator

from agents import judge, rewriter
from eval.config import GoldenConfig, JudgeConfig
from eval.dialogue import Clarification, failure
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
    #: The instance's language and removed constraint types, for the report's breakdowns.
    language: str = ""
    removed_constraints: list[str] = []
    questions: list[str] = []
    answers: list[str] = []
    #: Per question, every type it asks about.
    question_types: list[list[str]] = []
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

    @field_validator("question_types", mode="before")
    @classmethod
    def _one_type_each_before(cls, value: Any) -> Any:
        # Records written before questions could have several types hold one per question.
        if isinstance(value, list):
            return [[v] if isinstance(v, str) else v for v in value]
        return value

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.instance_id, self.condition, self.seed)

    @property
    def scored(self) -> bool:
        return self.error is None and bool(self.scores)


@dataclass
class PipelineContext:
    roles: dict[str, ChatModel]
    agent: WebDancerAgent
    sampling: dict[str, Sampling]
    #: The clarify@k dialogues (questions, answers, their types).
    clarification: Clarification
    golden: GoldenConfig = field(default_factory=GoldenConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    trace_dir: Path | None = None


async def run_instance(
    instance: Instance, condition: str, seed: int, ctx: PipelineContext
) -> Record:
    """Every sampled request of the key is seeded with `seed`: clarifier, User Answerer,
    rewriter, searcher and summarizer; the judge keeps temperature 0 and its fixed seed."""
    record = Record(
        instance_id=instance.id,
        condition=condition,
        seed=seed,
        language=instance.language,
        removed_constraints=list(instance.removed_constraints),
    )
    started = time.perf_counter()
    stage = ""
    try:
        k = clarify_turns(condition)
        if condition in ("oracle", GOLDEN):
            query = instance.fused_query
        elif k is None:
            query = instance.blurred_query
        else:
            stage = "clarify"
            turns, record.stopped_early, failed = await ctx.clarification.turns(instance, k, seed)
            record.questions = [t.question for t in turns]
            record.answers = [t.answer for t in turns]
            record.question_types = [t.question_types for t in turns]
            record.unsupported_words = [
                t.unsupported_words for t in turns if t.unsupported_words is not None
            ]
            if failed is not None:
                record.error = failed
                return record
            stage = "rewrite"
            query = await rewriter.rewrite(
                ctx.roles["rewriter"],
                instance.blurred_query,
                [t.qa for t in turns],
                instance.language,
                ctx.sampling["rewriter"].with_seed(seed),
            )
            record.rewrite = query
        record.search_query = query
        stage = "search"
        result = await ctx.agent.run(query, seed)
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
                    ctx.sampling["nugget_builder"].with_seed(seed),
                    ctx.golden.max_nuggets,
                    ctx.golden.max_evidence_chars,
                )
            except NoEvidence as e:
                record.error = {"kind": "no_evidence", "stage": stage, "message": str(e)}
        elif instance.golden is not None:
            stage = "judge"
            labels = await judge.judge(
                ctx.roles["judge"],
                result.answer,
                instance.golden.nuggets,
                instance.language,
                ctx.sampling["judge"],
                query=instance.fused_query if ctx.judge.show_query else None,
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
        record.error = failure(e, stage)
    finally:
        record.seconds = round(time.perf_counter() - started, 3)
    return record


def _write_trace(trace_dir: Path, record: Record, trace: dict[str, Any]) -> str:
    name = f"{record.condition.replace('@', '-')}/{record.instance_id}-seed{record.seed}.json"
    path = trace_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(trace, ensure_ascii=False, indent=1))
    partial.replace(path)
    return name
