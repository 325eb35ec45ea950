"""WebDancer search runs for fine-tuning the tiny searcher, from the train split only.

The tiny model was never trained on the WebDancer protocol: unconstrained it loops on garbage
tool calls, and under the protocol's grammar it searches for "10" and answers nothing, so no
answer of the quickstart carries a fact and no restore score can move. This module writes the
search run a small agent can learn: one `search` call with the question as its query, then an
answer that copies the first hit's snippet. Copying the first hit is a policy whose answers
depend on the query, which is what the benchmark measures: on the sample dev split, the first
snippet of BM25's top 3 states 23 points of restore score (lexical judge) for the blurred
query and 42 for the fused one.

Each run gives two examples, one per model call, each in exactly the messages the agent sends
(cts/webdancer/agent.py: the system prompt with a `Current date:`, the tools block and the
question; then the first turn and the tool's observation, rendered by the real search tool
over the sample corpus with the quickstart's `top_k`):
- `search`: the first turn, `<think>` and a `search` call whose query is the question;
- `answer`: the second turn, `<think>` and `<answer>` holding the first hit's snippet.

The questions are the sample benchmark's train instances' blurred and fused queries and a
`clarified` one (the blurred query with the removed constraints' spans appended, as the
Rewriter adapter writes it: cts/train/rewriter_data.py); the held-out dev and test splits are
never read. Everything is drawn from one `random.Random(seed)`: the same seed gives the same
examples, in the same order.
"""

from __future__ import annotations

import datetime
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from cts.eval.data.dataset import SAMPLE_DIR
from cts.train.answerer_data import Instance, read_instances
from cts.train.rewriter_data import with_answers
from cts.train.sft import RoleCall
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.protocol import initial_messages, observation
from cts.webdancer.search import SearchHit, render_hits

#: The corpus the sample benchmark searches (the quickstart's `search.corpus: sample`).
CORPUS_FILE = SAMPLE_DIR / "corpus.jsonl"
#: Hits a search shows: the quickstart's `search.top_k`.
TOP_K = 3
#: The kinds of question a run is about, drawn in turn (see the module's docstring).
VARIANTS = ("blurred", "fused", "clarified")

THINK_SEARCH = {
    "en": "I will search the web for this question.",
    "zh": "我先在网上搜索这个问题。",
}
THINK_ANSWER = {
    "en": "The first result answers the question.",
    "zh": "第一条结果回答了这个问题。",
}
NOT_FOUND = {"en": "I could not find an answer.", "zh": "没有找到答案。"}
#: The dates a run's system prompt may name (the agent puts today's there).
_FIRST_DATE = datetime.date(2025, 1, 1)
_DAYS = 3 * 365


@dataclass(frozen=True)
class SearcherExample(RoleCall):
    """One searcher call: the messages the agent sends and the turn it should write."""

    ABOUT: ClassVar[tuple[str, ...]] = ("instance_id", "language", "variant", "kind")

    variant: str
    #: `search` (the first turn) or `answer` (the turn after the observation).
    kind: str

    @property
    def label(self) -> str:
        return self.kind


@cache
def _search() -> LocalSearch:
    return LocalSearch(CORPUS_FILE)


def question(instance: Instance, variant: str) -> str:
    """The question a run is about: the blurred or fused query, or the blurred query with its
    removed spans appended as the Rewriter adapter writes it (`clarified`; the fused query
    where no span was found)."""
    if variant == "blurred":
        return instance.blurred_query
    if variant == "fused" or not instance.constraints:
        return instance.fused_query
    spans = [c.span for c in instance.constraints]
    return with_answers(instance.blurred_query, spans, instance.language)


def search_turn(query: str, language: str) -> str:
    call = json.dumps({"name": "search", "arguments": {"query": [query]}}, ensure_ascii=False)
    return f"<think>\n{THINK_SEARCH[language]}\n</think>\n<tool_call>\n{call}\n</tool_call>"


def answer_turn(hits: Sequence[SearchHit], language: str) -> str:
    """The answer: the first hit's snippet without its cut mark (or that nothing was found)."""
    text = hits[0].snippet.removesuffix(" ...").removesuffix("...") if hits else ""
    text = text or NOT_FOUND[language]
    return f"<think>\n{THINK_ANSWER[language]}\n</think>\n<answer>\n{text}\n</answer>"


def search_run(
    instance: Instance, variant: str, date: str, top_k: int = TOP_K
) -> list[SearcherExample]:
    """The two examples of one search run about `instance`'s `variant` question."""
    query = question(instance, variant)
    messages = initial_messages(query, date)
    first = search_turn(query, instance.language)
    hits = _search().search_sync(query, top_k)
    after = [
        *messages,
        {"role": "assistant", "content": first},
        {"role": "user", "content": observation(render_hits(query, hits))},
    ]
    return [
        SearcherExample(
            instance_id=instance.id,
            language=instance.language,
            messages=messages,
            completion=first,
            variant=variant,
            kind="search",
        ),
        SearcherExample(
            instance_id=instance.id,
            language=instance.language,
            messages=after,
            completion=answer_turn(hits, instance.language),
            variant=variant,
            kind="answer",
        ),
    ]


def generate(count: int, seed: int) -> list[SearcherExample]:
    """`count` examples (two a run) over every train instance and question variant in a
    shuffled order, repeated with fresh dates until there are enough."""
    rng = random.Random(seed)
    runs = [(i, v) for i in read_instances() for v in VARIANTS]
    examples: list[SearcherExample] = []
    while len(examples) < count:
        rng.shuffle(runs)
        for instance, variant in runs:
            date = _FIRST_DATE + datetime.timedelta(days=rng.randrange(_DAYS))
            examples += search_run(instance, variant, date.isoformat())
    return examples[:count]


def label_counts(examples: Sequence[SearcherExample]) -> dict[str, int]:
    """Examples per kind of turn (`search`, `answer`)."""
    return dict(sorted(Counter(e.kind for e in examples).items()))


def variant_counts(examples: Sequence[SearcherExample]) -> dict[str, int]:
    """Examples per kind of question (blurred, fused, clarified)."""
    return dict(sorted(Counter(e.variant for e in examples).items()))
