"""The sections of an experiment config (cts/eval/run/config.py), each a strict pydantic model
that refuses an unknown key: the roles and conditions, role sampling overrides, search,
budgets, clarification, golden construction, the judge and its canary, the report, and the
response cache."""

from __future__ import annotations

import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

from cts.agents import (
    judge,
)
from cts.foundation.files import cts_home
from cts.webdancer.ssrf import allow_entry

Role = Literal[
    "clarifier",
    "user_answerer",
    "rewriter",
    "searcher",
    "summarizer",
    "judge",
    "nugget_builder",
    "question_classifier",
    "fuser",
    "blurrer",
]
Condition = Literal["blurred", "clarify@1", "clarify@2", "clarify@3", "oracle"]
#: In the order of the study's main table.
ALL_CONDITIONS: list[Condition] = list(get_args(Condition))


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingOverrides(StrictModel):
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, gt=0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    top_k: int | None = Field(None, ge=-1)


class RoleConfig(StrictModel):
    #: A model config: a name under cts/configs/models/ or a path to a YAML file.
    model: str
    sampling: SamplingOverrides = SamplingOverrides()


class SearchConfig(StrictModel):
    """The WebDancer agent's tools (docs/search-agent.md)."""

    backend: Literal["local", "serper", "searxng", "retrieval-server"] = "local"
    #: Corpus JSONL for the local search and visit backends (`sample` = the shipped corpus).
    corpus: str = "sample"
    top_k: int = Field(10, ge=1)
    #: Most queries one search call runs (the release's MAX_MULTIQUERY_NUM).
    max_queries: int = Field(3, ge=1)
    #: Base URL of the serper / searxng / retrieval-server backend.
    endpoint: str | None = None
    #: Name of the environment variable with the API key (serper: SERPER_API_KEY).
    api_key_env: str | None = None
    #: Where `visit` reads pages: the local corpus, or the web over HTTP (SSRF-guarded).
    visit: Literal["local", "http"] = "local"
    #: Hosts the HTTP visit may reach even if they resolve to private addresses, as "host:port"
    #: ("[v6]:port"); a bare "host" allows only the scheme's default port (80/443).
    allow_hosts: list[str] = []

    @field_validator("allow_hosts")
    @classmethod
    def _allow_entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            allow_entry(entry)  # ValueError naming the entry: a config error at its line
        return entries

    #: Pages are cut to about this many tokens before the summarizer reads them.
    max_page_tokens: int = Field(3000, ge=100)
    #: Grammar-constrained turns for models not trained on the protocol. None = on exactly
    #: when the searcher's model config says it is not (`webdancer_trained`: the tiny model).
    constrained: bool | None = None
    #: The `Current date:` of the system prompt; None = today. Fix it to replay runs exactly.
    date: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    #: Every tool call and its result; `$CTS_HOME` expands.
    tool_cache: str = "$CTS_HOME/cache/tools.sqlite"
    #: Replay tool calls from the tool cache only; a miss is an error (`--tools-offline`).
    offline: bool = False
    #: USD per search API call (one per query a search runs) and per page a visit fetches,
    #: for `cts estimate`'s cost of a sweep; None: no price, no cost is shown.
    price_per_call: float | None = Field(None, ge=0)
    price_per_visit: float | None = Field(None, ge=0)


class Budgets(StrictModel):
    #: WebDancer: LLM calls per search run before the forced final answer.
    max_llm_calls: int = Field(8, ge=1)
    max_context_tokens: int = Field(8192, ge=256)


class AnswerSpan(StrictModel):
    max_words: int = Field(16, ge=1)
    max_cjk_chars: int = Field(32, ge=1)
    #: Opt-in: the largest share of the fused query's units one answer may hold (e.g. 0.5,
    #: so that no answer hands over most of the full intent); None, the study's protocol,
    #: caps by the two lengths only.
    max_share: float | None = Field(None, gt=0, le=1)


class ClarificationConfig(StrictModel):
    """How the clarify@k conditions ask, answer and classify."""

    #: sequential: one question per turn, each seeing the earlier answers (the study's
    #: protocol); all_at_once: the k questions in one call, then answered one by one.
    mode: Literal["sequential", "all_at_once"] = "sequential"
    #: Let the clarifier stop before k questions (recorded, so "knowing when not to ask" is
    #: measurable). Off by default: the study's budget is exactly k questions.
    allow_stop: bool = False
    #: extractive: an answer is `unknown` or a span of the fused query, enforced by the output
    #: constraint; abstractive: free wording, post-checked for content words the fused query
    #: does not contain (counted in the diagnostics).
    answerer: Literal["extractive", "abstractive"] = "extractive"
    #: Question-type diagnostics: keyword rules (no model call) or the `question_classifier`
    #: role.
    question_types: Literal["keywords", "llm"] = "keywords"
    #: Longest extractive answer: Latin/digit words and CJK characters a span may hold
    #: (both apply to a mixed span). Room for real values: a school and major in Chinese
    #: ("北京大学人工智能专业" is 10 characters), a product name with its specification.
    answer_span: AnswerSpan = Field(default_factory=lambda: AnswerSpan())


class GoldenConfig(StrictModel):
    """Golden construction (`cts golden build`): the nugget builder's limits."""

    #: Most nuggets per instance (the shipped benchmark has 5–6).
    max_nuggets: int = Field(8, ge=1, le=20)
    #: The trace's observations are cut to share about this many characters in the nugget
    #: builder's prompt; keep it well inside the builder model's context window.
    max_evidence_chars: int = Field(12000, ge=1000)
    #: The golden search run's seed. It must not be an evaluation seed: the `oracle`
    #: condition searches the same fused query, and with a shared seed (and cache) it would
    #: replay the very run its nuggets were extracted from instead of being an independent run.
    seed: int = Field(1000, ge=0)


CanaryAnswer = Literal["empty", "unrelated", "other", "restated"]


def _default_canary() -> list[CanaryAnswer]:
    return ["other", "restated"]


class JudgeCanary(StrictModel):
    """The answer-independence canary: for a sample of records the judge also labels the
    record's nuggets against an answer that states none of them. A judge that reads the answer
    labels (nearly) every one `none`; the report counts `full` and `partial` per answer and
    warns from `warn_rate` on. Its request is the same for every condition and seed of an
    instance, so with the response cache it costs at most one judge call per instance and
    answer (per judge batch of nuggets); without the cache, one per sampled record."""

    enabled: bool = True
    #: Share of the records that reach the judge that get the canary, drawn by a hash of the
    #: record's key (instance, condition, seed): the same records in every run, shard and
    #: resume.
    share: float = Field(0.25, gt=0.0, le=1.0)
    #: The answers, one per drawn record (by the same hash): `other`, another instance's
    #: nuggets as written (facts, only not these: a judge that credits them does not read
    #: the content); `restated`, the instance's fused query (what the user asked, no fact:
    #: credit here is a judge's restatement bias); `unrelated`, a fixed cooking instruction;
    #: `empty`, "(no answer)" (which catches only a judge that credits nothing said).
    answer: list[CanaryAnswer] = Field(default_factory=_default_canary, min_length=1)
    #: The share of an answer's nugget labels that are `full` or `partial` from which the
    #: report warns: a reading judge may credit a few by chance (the lexical judge gave 3
    #: partial labels of 270 against the unrelated text under its first rules).
    warn_rate: float = Field(0.1, gt=0.0, le=1.0)

    @field_validator("answer", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """`answer: empty` (one answer, as configs before the list read) is `[empty]`."""
        return [value] if isinstance(value, str) else value


class JudgeConfig(StrictModel):
    """What the coverage judge is shown."""

    #: The study's judge compares the search output with the nuggets only; true also shows it
    #: the fused query (the user's full intent).
    show_query: bool = False
    #: Show each answer's nuggets in an order fixed by the record key (instance, condition,
    #: seed) instead of the gold's order, so that a judge's position bias does not always
    #: favour the same nuggets; each label records the position its nugget was shown at.
    shuffle: bool = False
    #: Nuggets per judge call: fewer than the judge's own limit (cts/agents/judge.py BATCH, 10)
    #: if a small judge loses track of long listings, never more.
    batch_size: int = Field(judge.BATCH, ge=1, le=judge.BATCH)
    #: The answer-independence canary (a diagnostic: it changes no label nor score).
    canary: JudgeCanary = Field(default_factory=lambda: JudgeCanary())
    #: Run each judge request alone (engine `transformers` only): batching moves greedy
    #: decoding, so that the same judge re-reading the same answers may give other labels; alone,
    #: a label depends on its request only. Slower where the judge's requests would have shared
    #: a batch (docs/calibration-and-rejudging.md, "Calibrating the judge", has the measured cost).
    deterministic: bool = False


class ReportConfig(StrictModel):
    """How the report treats failures and guards its ratios."""

    #: exclude: compare conditions on the instances scored under every one of them (paired;
    #: the excluded instances are listed); zero: a failed record scores 0 and the table says so.
    failures: Literal["exclude", "zero"] = "exclude"
    #: Gain recovered, (score − blurred) / (oracle − blurred), is reported only when the
    #: oracle beats blurred by at least this many points; a smaller gap only amplifies noise.
    min_gap: float = Field(1.0, gt=0.0)


def expand_path(path: str) -> Path:
    """`$CTS_HOME` (default ~/.cache/cts), other variables and `~` expanded."""
    return Path(os.path.expandvars(path.replace("$CTS_HOME", str(cts_home())))).expanduser()


class CacheConfig(StrictModel):
    enabled: bool = True
    #: Shared by runs, so re-runs and clarifier comparisons reuse answers. `$CTS_HOME` expands.
    path: str = "$CTS_HOME/cache/responses.sqlite"

    def resolved_path(self) -> Path:
        return expand_path(self.path)


def check_template(template: str, fields: Sequence[str]) -> str:
    """`template` if it is text with only plain `{field}`s of `fields` (and `{{`/`}}`). It is
    filled with str.format, which would also evaluate attribute and index access
    (`{name.__class__}`), so anything more than a plain field name is refused here, at load
    time, instead of failing (or leaking) when a run directory is made."""
    allowed = ", ".join(f"{{{f}}}" for f in fields)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"{template!r}: {e} (write {{{{ or }}}} for a literal brace)") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in fields or spec or conversion:
            shown = "{" + field + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ValueError(
                f"{template!r}: {shown} is not a template field; use only {allowed} (no attribute, "
                "index, conversion or format spec)"
            )
    return template


#: The orders keys can start in (`ExperimentConfig.key_order`).
KeyOrder = Literal["longest_first", "dataset"]
