"""One instance under one condition and seed, end to end: clarify (k turns) → answer → rewrite →
search → judge → score. The information flow is fixed here: the fused query goes to the user
answerer and, with `judge.show_query`, the judge (and is the search query of the `oracle` upper
bound, and of golden construction's `golden` key, whose trace the nugget builder reads)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from cts.agents import judge, rewriter
from cts.eval.data.golden import GOLDEN
from cts.eval.data.schema import Canary, Instance, Nugget, Record
from cts.eval.run.config_sections import GoldenConfig, JudgeConfig
from cts.eval.run.dialogue import Clarification, Turn, failure
from cts.eval.run.golden_search import NoEvidence, golden_nuggets
from cts.eval.run.usage import charged_to_key
from cts.eval.score.metrics import Label, restore_score
from cts.eval.score.over_answer import reveal
from cts.foundation.disk import NotAFile, StorageFull, write_whole
from cts.foundation.secrets import redact
from cts.serving.cache import CacheFileError
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError, ServerUnreachable
from cts.serving.types import Sampling
from cts.webdancer.agent import AgentResult, WebDancerAgent
from cts.webdancer.tool_cache import ToolCacheMiss

logger = logging.getLogger(__name__)


def clarify_turns(condition: str) -> int | None:
    """k of `clarify@k`; None for blurred and oracle."""
    if condition.startswith("clarify@"):
        return int(condition.split("@", 1)[1])
    return None


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
    #: Given the partial record of a key the run stopped before its record (its model calls so
    #: far, cts/eval/run/runner.py UnrecordedStore); None: not kept.
    unrecorded: Callable[[Record], None] | None = None
    #: Per instance id, the canary's `other` answer (cts.agents.judge.other_answers); an instance
    #: without one gets the fixed unrelated text.
    canary_others: dict[str, str] = field(default_factory=dict)


class StageFailed(Exception):
    """Ends a key: `error` is what its record keeps, {kind, stage, message}."""

    def __init__(self, error: dict[str, str]) -> None:
        super().__init__(error["message"])
        self.error = error


class SearchFailed(Exception):
    """A search run that ended with termination `error`. The agent returns such a run rather
    than raising, so that its answer, usage and trace are kept; this ends the key after them."""


@contextmanager
def _stage(name: str) -> Iterator[None]:
    """The one place where a failure in a stage becomes the record's error. A cancelled run
    (CancelledError, a BaseException) propagates: its keys stay unrecorded and resume."""
    try:
        yield
    except (EngineError, ToolCacheMiss) as e:
        raise StageFailed(failure(e, name)) from e
    except SearchFailed as e:
        raise StageFailed({"kind": "search_error", "stage": name, "message": str(e)}) from e
    except NoEvidence as e:
        raise StageFailed({"kind": "no_evidence", "stage": name, "message": str(e)}) from e
    except (StageFailed, ServerUnreachable, StorageFull, NotAFile, CacheFileError):
        # A dead server, a full disk, a trace path that is no file or a cache damaged inside
        # (found on a lookup, not at open) is no key's failure: it stops the run (a cache file
        # shared by every shard would otherwise fail every key of every shard, each counted as
        # done), and the key stays unrecorded to run again on resume.
        raise
    except Exception as e:
        # Not a failure the protocol knows (a bug, a corrupt cache row, a parser's recursion
        # limit on a hostile page). One key must not cancel the keys in flight, nor every
        # resume (its cached inputs would replay it): it is recorded, loudly, as `internal`.
        # The log is a Slurm log on a cluster: it gets the redacted traceback, never the raw one.
        trace = redact("".join(traceback.format_exception(e)))
        logger.error("internal error at stage %s\n%s", name, trace)
        raise StageFailed(
            {
                "kind": "internal",
                "stage": name,
                "message": redact(f"{type(e).__name__}: {e}")[:500],
                "traceback": trace[-4000:],
            }
        ) from e


async def run_instance(
    instance: Instance, condition: str, seed: int, ctx: PipelineContext
) -> Record:
    """Every sampled request of the key is seeded with `seed`: clarifier, User Answerer,
    rewriter, searcher and summarizer; the judge keeps temperature 0 and its fixed seed. A
    failed stage ends the key with its error, keeping what the stages before it produced."""
    record = Record.for_key(instance, condition, seed)
    started = time.perf_counter()
    with charged_to_key() as used:
        try:
            await _stages(instance, condition, seed, ctx, record)
        except StageFailed as e:
            record.error = e.error
        except BaseException:
            # The run stops (cancelled, a dead server) and the key stays unrecorded; the calls
            # it made are done, and cached: its rerun finds them answered for no work.
            _keep_unrecorded(record, used.fields(), ctx)
            raise
        finally:
            record.seconds = round(time.perf_counter() - started, 3)
            # Every role's model calls of this key (cts/eval/run/usage.py), for `cts estimate`.
            record.usage.update(used.fields())
    return record


def _keep_unrecorded(record: Record, usage: dict[str, int], ctx: PipelineContext) -> None:
    """Hand the calls of a key the run stopped to `ctx.unrecorded`. Bookkeeping for `cts
    estimate` only: a write that fails (a full disk) must not change why the run stops."""
    if ctx.unrecorded is None or not usage:
        return
    kept = Record(**record.model_dump(include={"instance_id", "condition", "seed"}), usage=usage)
    with suppress(OSError):
        ctx.unrecorded(kept)


async def _stages(
    instance: Instance, condition: str, seed: int, ctx: PipelineContext, record: Record
) -> None:
    """The key's stages in order; each result goes into `record` as soon as it is there, so
    that a later failure keeps it (the questions of a failed rewrite, the answer of a failed
    judge)."""
    k = clarify_turns(condition)
    if k is None:
        fused = condition in ("oracle", GOLDEN)
        query = instance.fused_query if fused else instance.blurred_query
    else:
        with _stage("clarify"):
            asked = await ctx.clarification.turns(instance, k, seed)
        record.stopped_early, record.stop_question = asked.stopped, asked.stop_question
        _keep_turns(record, asked.turns, instance)
        if asked.error is not None:
            # Already the record's error: the dialogue names the turn's own stage (clarify,
            # answer or classify), and a saved dialogue carries it across runs.
            raise StageFailed(asked.error)
        with _stage("rewrite"):
            query = await _rewrite(instance, asked.turns, seed, ctx)
        record.rewrite = query
    record.search_query = query
    with _stage("search"):
        result = await ctx.agent.run(query, seed)
        _keep_search(record, result, ctx.trace_dir)
        if result.termination == "error":
            raise SearchFailed(result.error or "")
    if condition == GOLDEN:
        with _stage("nuggets"):
            record.nuggets = await _nuggets(instance, result, seed, ctx)
    elif instance.golden is not None:
        await judge_record(instance, record, ctx)


async def judge_record(instance: Instance, record: Record, ctx: PipelineContext) -> None:
    """The judge stage of a record whose answer is in: its labels and scores, then, on the
    records `judge.canary` draws, the canary. `cts rejudge` runs this same stage."""
    if instance.golden is None:
        raise ValueError(f"instance {instance.id} has no golden nuggets to judge against")
    with _stage("judge"):
        record.labels, record.scores = await _judge(
            instance, instance.golden.nuggets, record.answer, ctx, record.key
        )
    record.canary = await _canary(instance, ctx, record.key)


def _keep_turns(record: Record, turns: list[Turn], instance: Instance) -> None:
    record.questions = [t.question for t in turns]
    record.answers = [t.answer for t in turns]
    record.answer_reveals = [reveal(instance, t.answer).as_dict() for t in turns]
    record.question_types = [t.question_types for t in turns]
    record.unsupported_words = [
        t.unsupported_words for t in turns if t.unsupported_words is not None
    ]


def _keep_search(record: Record, result: AgentResult, trace_dir: Path | None) -> None:
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
        # A failed query or visit is an observation the agent reads, not a failed key: it is
        # counted here so that a flaky backend shows in the summary, not only in the traces.
        "search_tool_errors": sum(
            len(step["errors"]) for step in result.steps if step["kind"] == "tool"
        ),
    }
    if trace_dir is not None:
        record.trace_id = _write_trace(trace_dir, record, result.as_dict())


async def _rewrite(instance: Instance, turns: list[Turn], seed: int, ctx: PipelineContext) -> str:
    return await rewriter.rewrite(
        ctx.roles["rewriter"],
        instance.blurred_query,
        [t.qa for t in turns],
        instance.language,
        ctx.sampling["rewriter"].with_seed(seed),
    )


async def _nuggets(
    instance: Instance, result: AgentResult, seed: int, ctx: PipelineContext
) -> list[Nugget]:
    return await golden_nuggets(
        ctx.roles["nugget_builder"],
        instance,
        result.answer,
        result.steps,
        ctx.sampling["nugget_builder"].with_seed(seed),
        ctx.golden.max_nuggets,
        ctx.golden.max_evidence_chars,
    )


def judge_order(nuggets: list[Nugget], key: tuple[str, str, int]) -> list[Nugget]:
    """The order `judge.shuffle` shows a record's nuggets in: fixed by its key (instance,
    condition, seed), so a rerun, another shard or a rejudge shows the same order."""
    instance_id, condition, seed = key
    return judge.shuffled(nuggets, f"{instance_id}\x1f{condition}\x1f{seed}")


async def _labels(
    instance: Instance, shown: list[Nugget], answer: str, ctx: PipelineContext
) -> dict[str, judge.NuggetLabel]:
    """The judge's call on `answer` against the nuggets in the order `shown`, as the run's
    `judge:` options set it (a record's labels and its canary's are asked alike)."""
    return await judge.judge(
        ctx.roles["judge"],
        answer,
        shown,
        instance.language,
        ctx.sampling["judge"],
        query=instance.fused_query if ctx.judge.show_query else None,
        batch_size=ctx.judge.batch_size,
        asked=instance.fused_query,
    )


async def _judge(
    instance: Instance,
    nuggets: list[Nugget],
    answer: str,
    ctx: PipelineContext,
    key: tuple[str, str, int] | None = None,
) -> tuple[dict[str, dict[str, str]], dict[str, float]]:
    """The judge's label and evidence per nugget, and the scores the labels give. With
    `judge.shuffle` the nuggets are shown in `judge_order` of the record's `key`, and each
    label keeps the 1-based position its nugget was shown at (batches are consecutive runs of
    `judge.batch_size` positions)."""
    shown = nuggets
    if ctx.judge.shuffle:
        if key is None:
            raise ValueError("judge.shuffle needs the record's key to order the nuggets")
        shown = judge_order(nuggets, key)
    labels = await _labels(instance, shown, answer, ctx)
    # The judge's output schema admits only the three labels.
    chosen = cast(dict[str, Label], {i: v.label for i, v in labels.items()})
    weights = {n.id: n.weight for n in nuggets}
    scores = {
        "restore_score_100": restore_score(chosen, weights),
        "strict": restore_score(chosen, weights, strict=True),
        "unweighted": restore_score(chosen, weights, weighted=False),
    }
    judged = {i: {"label": v.label, "evidence": v.evidence} for i, v in labels.items()}
    if ctx.judge.shuffle:
        for position, nugget in enumerate(shown, 1):
            judged[nugget.id]["position"] = str(position)
    return judged, scores


def _draw(key: tuple[str, str, int]) -> float:
    """SHA-256 of the key, read as a number in [0, 1): the same in every process and shard."""
    text = "canary\x1f" + "\x1f".join(map(str, key))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def canary_drawn(key: tuple[str, str, int], share: float) -> bool:
    """Whether the canary runs on the record of `key`: its draw below `share`. The same
    records in every process, shard, resume and rejudge."""
    return _draw(key) < share


def canary_kind(key: tuple[str, str, int], share: float, kinds: Sequence[str]) -> str:
    """Which of `kinds` a drawn record's canary answers with: the draw, spread over them."""
    return kinds[min(len(kinds) - 1, int(_draw(key) / share * len(kinds)))]


async def _canary(
    instance: Instance, ctx: PipelineContext, key: tuple[str, str, int]
) -> Canary | None:
    """The judge's labels of the instance's nuggets against an answer that states none of them
    (`judge.canary`), on a drawn record; None elsewhere. Its request depends on the instance
    and the answer kind only (one nugget order per instance under `judge.shuffle`), so the
    response cache answers it once per instance and kind. A failed canary call is kept as the
    canary's error: it says nothing of the record's own labels, which stand."""
    options = ctx.judge.canary
    if not options.enabled or instance.golden is None or not canary_drawn(key, options.share):
        return None
    kind = canary_kind(key, options.share, options.answer)
    nuggets = instance.golden.nuggets
    if ctx.judge.shuffle:
        nuggets = judge_order(nuggets, (instance.id, "canary", 0))
    answer = judge.canary_answer(
        kind, instance.language, instance.fused_query, ctx.canary_others.get(instance.id, "")
    )
    try:
        with _stage("judge"):
            labels = await _labels(instance, nuggets, answer, ctx)
    except StageFailed as e:
        return Canary(answer=kind, error=e.error["message"])
    return Canary(answer=kind, labels={i: v.label for i, v in labels.items()})


def trace_name(record: Record) -> str:
    """The trace's file name under traces/: readable where the id is plain, and unique by a
    hash of the id, so that no id can leave the directory or collide with another on a
    case-insensitive file system (`Q1` and `q1`), whatever validation let through."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", record.instance_id)[:60].lstrip(".") or "_"
    digest = hashlib.sha256(record.instance_id.encode("utf-8", "surrogatepass")).hexdigest()
    condition = record.condition.replace("@", "-")
    return f"{condition}/{readable}-{digest[:12]}-seed{record.seed}.json"


def _write_trace(trace_dir: Path, record: Record, trace: dict[str, Any]) -> str:
    name = trace_name(record)
    # Tool errors in the trace quote what a backend said, which may hold a key. A full disk
    # raises StorageFull, which stops the run (see _stage). Compact: `cts view` reads it.
    # Not fsync'd for an evaluation key (its fsync was a tenth of the pipeline's per-call
    # cost): the record that names the trace is fsync'd after it, but that does not make the
    # trace durable, so after a power loss (not a kill: the page cache outlives the process) a
    # recorded key's trace may be missing or empty. Its readers take that as no trace: `cts
    # view` says "trace file missing" or "unreadable", `cts estimate` counts it unread; every
    # number of the report comes from the record. A golden key's trace is the evidence its
    # nuggets cite (the golden audit reads it as such), so that one stays fsync'd.
    text = redact(json.dumps(trace, ensure_ascii=False))
    write_whole(trace_dir / name, text, durable=record.condition == GOLDEN)
    return name
