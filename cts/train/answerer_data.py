"""Labelled User Answerer calls for fine-tuning the simulated user, from the train split only.

Each example is one User Answerer call as a dialogue makes it (cts/agents/user_answerer.py, the
default `extractive` mode): the fused query and one clarifying question rendered in the role's
own prompt (cts/agents/prompts/user_answerer.yaml), and as completion exactly what its span
constraint admits — a span of the fused query, or `unknown`. The instances are the sample
benchmark's `train.jsonl`; the held-out labels `cts answerer calibrate --labels sample`
measures on (`cts/eval/sample_data/answerer_labels.jsonl`) are never read.

Per example the question asks either
- about a constraint the blurred query left out (`value`): its type's question, answered with
  the removed span. The span is the dataset's own when it gives one (`removed_spans`), else
  where the fused query differs from the blurred query (a diff of the answerer's units: words,
  or CJK characters one by one), trimmed of function words ("in 2023" → `2023`, "as an
  audiobook" → `audiobook`), a time cut to its time words ("the 2024 edition of" → `2024`), an
  English figure to the figure and its unit ("in a 20 cm tin" → `20 cm`), and a model number
  glued to its name taken with it (`澄穗优218`);
- or about something the fused query does not say (`unknown`): a time, a place, a figure, a
  budget, a language, a format, a purpose, a preferred source, or whom it is for, each only
  where a check on the fused query (and the instance's `meta.has_region`) finds it absent.

The questions are drawn from phrasings per topic and language (Chinese ones for the Chinese
instances), some opened with a clarifier's acknowledgement ("Thanks. ", "好的，"). Everything
is drawn from one `random.Random(seed)`: the same seed gives the same examples, in the same
order.
"""

from __future__ import annotations

import difflib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cts.agents.prompts import prompt_language, render
from cts.agents.types import UNKNOWN
from cts.agents.user_answerer import is_span, unit_spans
from cts.eval.data.dataset import SAMPLE_DIR
from cts.train.sft import RoleCall, chat

#: The sample benchmark's train split: the only input.
TRAIN_FILE = SAMPLE_DIR / "train.jsonl"

#: Share of examples whose question asks about a removed constraint (the rest: `unknown`).
VALUE_SHARE = 0.6
#: Share of examples drawn from the Chinese instances (2 of the 24 train instances).
CHINESE_SHARE = 0.25
#: Share of questions opened with an acknowledgement.
OPENER_SHARE = 0.3

#: Phrasings per removed-constraint type (cts/agents/question_type.py's taxonomy; `other` is what
#: no other type covers: a method, a form, a condition). `{term}`: the term a definition
#: question asks about, where the blurred query quotes one or the removed words qualify one.
VALUE_QUESTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "time": {
        "en": (
            "Which year are you asking about?",
            "What time period do you have in mind?",
            "Are you interested in a particular year or date?",
            "When should the answer be about?",
            "Do you mean a specific year, season or date?",
            "Which time frame are you interested in?",
        ),
        "zh": (
            "你想了解哪一年的情况？",
            "你关心的是哪个时间段？",
            "有具体的年份或日期吗？",
            "请问是指什么时候的？",
        ),
    },
    "region": {
        "en": (
            "Which country or region are you asking about?",
            "Where are you located?",
            "Is there a particular place you have in mind?",
            "Which city or area should the answer cover?",
            "In which country do you need this?",
        ),
        "zh": ("你问的是哪个地区？", "你在哪个城市？", "有特定的地点吗？", "是指哪个省市的情况？"),
    },
    "entity": {
        "en": (
            "Which one exactly do you mean?",
            "Could you name the specific product, model or organisation?",
            "Is there a specific brand, model or version you have in mind?",
            "Do you mean a particular company, version or model?",
            "Who or what exactly are you referring to?",
        ),
        "zh": (
            "你指的是哪一个具体的品种或型号？",
            "具体是哪个产品或机构？",
            "你说的是哪一个？",
            "有具体的名称或型号吗？",
        ),
    },
    "numeric": {
        "en": (
            "Is there a specific number or amount you have in mind?",
            "What size or quantity are we talking about?",
            "Do you have a particular figure in mind, like a weight, distance or age?",
            "How much or how many exactly?",
            "Which size, weight or length do you mean?",
        ),
        "zh": ("有具体的数量或数值吗？", "你说的是多大的规格？", "具体是多少？"),
    },
    "scope": {
        "en": (
            "Which aspect or part of this are you interested in?",
            "What kind specifically do you mean?",
            "Should the answer focus on a particular category or case?",
            "Is there a particular type or group you want to narrow it down to?",
            "What exactly should the answer cover?",
        ),
        "zh": ("你关心的是哪个方面？", "具体是哪一类？", "你想了解的范围是什么？"),
    },
    "definition": {
        "en": (
            "What exactly do you mean by '{term}'?",
            "When you say '{term}', which sense do you mean?",
            "Which sense of the term do you mean?",
            "Could you clarify what you mean by that term?",
        ),
        "zh": (
            "“{term}”具体指什么？",
            "你说的“{term}”是指哪方面？",
            "你指的是哪种含义？",
            "这个说法具体指什么？",
        ),
    },
    "other": {
        "en": (
            "Is there any other condition or detail I should know?",
            "Is there a particular way or case you are asking about?",
            "Could you be more specific about your situation?",
            "Any specific detail that narrows this down?",
            "In which form or by which method do you mean?",
        ),
        "zh": ("还有什么具体条件吗？", "能说得更具体一些吗？", "是哪种情况或方式？"),
    },
}

#: What the fused query may leave unsaid, each asked only where `absent` finds it unsaid.
UNKNOWN_QUESTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "time": VALUE_QUESTIONS["time"],
    "region": VALUE_QUESTIONS["region"],
    "numeric": {
        "en": (
            "Is there a specific number or amount you have in mind?",
            "How many exactly are you asking about?",
            "What size or quantity are we talking about?",
        ),
        "zh": ("有具体的数量或数值吗？", "具体是多少？"),
    },
    "budget": {
        "en": (
            "What is your budget?",
            "Is there a price limit I should keep to?",
            "How much are you willing to spend?",
        ),
        "zh": ("你的预算是多少？", "有价格上限吗？", "你打算花多少钱？"),
    },
    "language": {
        "en": (
            "Which language should the sources be in?",
            "Do you want results in a particular language?",
        ),
        "zh": ("需要什么语言的资料？", "你希望资料用哪种语言？"),
    },
    "format": {
        "en": (
            "Do you want the answer as a list or a table?",
            "How detailed should the answer be?",
            "Would a short summary do, or do you want every detail?",
        ),
        "zh": ("你希望答案以列表还是表格形式给出？", "答案需要多详细？", "简要概括就可以吗？"),
    },
    "purpose": {
        "en": (
            "Why do you need this information?",
            "What will you use this for?",
            "Is this for work, study or personal use?",
        ),
        "zh": ("你为什么需要这个信息？", "你打算用这些信息做什么？", "是工作、学习还是个人用途？"),
    },
    "source": {
        "en": (
            "Do you prefer official sources or news reports?",
            "Which sources do you trust for this?",
        ),
        "zh": ("你更倾向官方来源还是新闻报道？", "你信任哪些信息来源？"),
    },
    "audience": {
        "en": (
            "Is this for yourself or for someone else?",
            "Are you asking on behalf of someone?",
        ),
        "zh": ("这是为你自己问的，还是替别人问的？", "你是替别人咨询的吗？"),
    },
}

#: How often each unknown topic is drawn, relative to the others: a time, place or figure
#: that one fused query leaves out and another states is what the answerer has to tell apart.
UNKNOWN_WEIGHTS = {"time": 3, "region": 3, "numeric": 2}

_OPENERS = {
    "en": ("Thanks. ", "Got it. ", "Thanks for clarifying. ", "Okay. ", "One more thing: "),
    "zh": ("好的，", "谢谢，", "明白了。", "再问一下，"),
}

#: What says a topic in a fused query (a case-insensitive search); the topic is asked as an
#: `unknown` question only where none matches and it was not removed.
_SAYS = {
    "time": re.compile(
        r"\b(?:1[89]|20)\d\d\b|\b(?:january|february|march|april|may|june|july|august|"
        r"september|october|november|december|spring|summer|autumn|fall|winter|easter|"
        r"christmas|today|yesterday|tomorrow|week|month|year|latest|current|recent|now|"
        r"decade|century|season)s?\b|[年月日]|最新|近期|目前|现在|季",
        re.I,
    ),
    "numeric": re.compile(
        r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten)\b|[一二三四五六七八九十百千万两]"
    ),
    "budget": re.compile(r"[$€£¥₹]|budget|cheap|afford|price limit|under \d|预算|便宜|元以"),
    "language": re.compile(r"english|chinese|language|translat|中文|英文|语言|双语"),
    "format": re.compile(
        r"\blist\b|table|summary|brief|detail|step by step|列表|表格|简要|详细|概括"
    ),
    "purpose": re.compile(r"for my|because|so that|in order to|为了|用于|因为"),
    "source": re.compile(r"official|sources?\b|news|website|官方|来源|新闻|官网"),
    "audience": re.compile(r"\bmy\b|\bme\b|\bI\b|\bwe\b|\bour\b|我|家人|替"),
}

#: Words a removed span does not start or end with ("in 2023" → 2023).
_EDGE_WORDS = {
    "en": frozenset(
        "in during at on for the a an of as to with from and or that which this these".split()
    ),
    "zh": frozenset("中在的于这个那是和与"),
}
_ZH_EDGE_PAIRS = ("这个", "那个", "这种", "当中")
#: Words a time span ends and starts with (besides digits and CJK time characters).
_TIME_WORD = re.compile(
    r"(?:\d+|january|february|march|april|may|june|july|august|september|october|november|"
    r"december|spring|summer|autumn|fall|winter|easter|christmas|[年月日季])",
    re.I,
)
_NUMBER = re.compile(r"\d[\d,.]*")
#: Words that belong to a figure: before it (`over 65`) and after it (`23 kg`).
_COMPARATORS = frozenset("over under above below about around least most than up to".split())
_UNIT_WORD = re.compile(r"[a-zA-Z]{1,3}|percent|hours?|minutes?|days?|years?|metres?|meters?")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
#: Most CJK characters of a name taken with a model number glued to it (`澄穗优218`).
_GLUED_NAME = 4


@dataclass(frozen=True)
class Constraint:
    type: str
    #: The removed span, verbatim in the fused query.
    span: str


@dataclass(frozen=True)
class Instance:
    id: str
    language: str
    fused_query: str
    blurred_query: str
    constraints: list[Constraint]
    #: `meta.has_region` of the dataset (None: not given).
    has_region: bool | None


@dataclass(frozen=True)
class AnswererExample(RoleCall):
    """One User Answerer call: its chat messages (system, user) and the completion (a span of
    the fused query or `unknown`); `topic` is the removed constraint's type or what the
    `unknown` question asked about."""

    ABOUT: ClassVar[tuple[str, ...]] = ("instance_id", "label", "topic")

    topic: str
    question: str
    fused_query: str

    @property
    def label(self) -> str:
        return "unknown" if self.completion == UNKNOWN else "value"


# -- the removed spans ------------------------------------------------------------------------


def inserted_ranges(fused: str, blurred: str) -> list[tuple[int, int]]:
    """Where the fused query has units the blurred query lacks: (start, end) character
    ranges of the fused query, in order (a diff of the answerer's units)."""
    fused_units, blurred_units = unit_spans(fused), unit_spans(blurred)
    matcher = difflib.SequenceMatcher(
        None,
        [blurred[s:e] for s, e in blurred_units],
        [fused[s:e] for s, e in fused_units],
        autojunk=False,
    )
    return [
        (fused_units[j1][0], fused_units[j2 - 1][1])
        for op, _, _, j1, j2 in matcher.get_opcodes()
        if op in ("insert", "replace") and j2 > j1
    ]


def _merged(ranges: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """`ranges` joined, the closest neighbours first, until at most `count` are left ("crop
    lodging in cereals" of "crop" and "in cereals" for one definition)."""
    ranges = list(ranges)
    while len(ranges) > count > 0:
        gaps = [ranges[i + 1][0] - ranges[i][1] for i in range(len(ranges) - 1)]
        i = gaps.index(min(gaps))
        ranges[i : i + 2] = [(ranges[i][0], ranges[i + 1][1])]
    return ranges


def _is_edge(word: str, language: str) -> bool:
    if language == "zh" and _CJK.fullmatch(word):
        return word in _EDGE_WORDS["zh"]
    return word.lower() in _EDGE_WORDS["en"]


def _trimmed(fused: str, units: list[tuple[int, int]], language: str) -> list[tuple[int, int]]:
    """`units` without function words at either end (Chinese pairs such as 这个 first)."""

    def text(unit: tuple[int, int]) -> str:
        return fused[unit[0] : unit[1]]

    while len(units) > 1:
        pair = "".join(text(u) for u in units[-2:])
        if pair in _ZH_EDGE_PAIRS and len(units) > 2:
            units = units[:-2]
        elif _is_edge(text(units[-1]), language):
            units = units[:-1]
        elif _is_edge(text(units[0]), language):
            units = units[1:]
        else:
            break
    return units


def _time_cut(fused: str, units: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A time span from its first time word to its last ("2024 edition" → 2024)."""
    timed = [i for i, (s, e) in enumerate(units) if _TIME_WORD.fullmatch(fused[s:e])]
    return units[timed[0] : timed[-1] + 1] if timed else units


def _figure_cut(fused: str, units: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A numeric span cut to its first figure, a comparator before it and a unit after it
    ("in a 20 cm tin" → 20 cm, "over 65" stays)."""
    words = [fused[s:e] for s, e in units]
    figures = [i for i, w in enumerate(words) if _NUMBER.fullmatch(w)]
    if not figures:
        return units
    first = last = figures[0]
    while first > 0 and words[first - 1].lower() in _COMPARATORS:
        first -= 1
    if last + 1 < len(words) and _UNIT_WORD.fullmatch(words[last + 1]):
        last += 1
    return units[first : last + 1]


def _glued_name(fused: str, start: int) -> int:
    """Where a name glued to the span at `start` begins (no separator between them: the
    variety 澄穗优 of 澄穗优218), at most _GLUED_NAME CJK characters back; `start` if none."""
    begin = start
    while (
        begin > 0
        and start - begin < _GLUED_NAME
        and _CJK.fullmatch(fused[begin - 1])
        and fused[begin - 1] not in _EDGE_WORDS["zh"]
        and not _CJK.fullmatch(fused[start])
    ):
        begin -= 1
    return begin


def removed_span(fused: str, start: int, end: int, kind: str, language: str) -> str:
    """The answer a careful user gives for the constraint of type `kind` that the fused query
    states at [start, end): its units there, trimmed and cut as the module says, as written
    in the fused query (with a currency before it or `%` after it)."""
    units = [(s, e) for s, e in unit_spans(fused) if s >= start and e <= end]
    units = _trimmed(fused, units, language)
    if kind == "time":
        units = _time_cut(fused, units)
    elif kind == "numeric" and language == "en":
        units = _figure_cut(fused, units)
    begin, finish = units[0][0], units[-1][1]
    if kind == "entity":
        begin = _glued_name(fused, begin)
    if begin > 0 and fused[begin - 1] in "$€£¥₹" and fused[begin].isdigit():
        begin -= 1
    if finish < len(fused) and fused[finish] in "%‰°":
        finish += 1
    return fused[begin:finish]


def constraints(
    fused: str, blurred: str, types: Sequence[str], spans: Sequence[str], language: str
) -> list[Constraint]:
    """Each removed constraint with its span: the dataset's where it gives one, else the
    fused query's inserted ranges matched to the types in order (the closest joined while
    there are more ranges than types; a type left without a range is left out)."""
    ranges = _merged(inserted_ranges(fused, blurred), len(types))
    found = []
    for i, kind in enumerate(types):
        given = spans[i] if i < len(spans) else ""
        if given and given in fused and is_span(given, fused):
            found.append(Constraint(kind, given))
        elif i < len(ranges):
            found.append(Constraint(kind, removed_span(fused, *ranges[i], kind, language)))
    return found


def read_instances(path: Path = TRAIN_FILE) -> list[Instance]:
    from cts.eval.data.schema import Instance as DataInstance

    instances = []
    for line in path.read_text("utf-8").splitlines():
        data = DataInstance.model_validate(json.loads(line))
        language = prompt_language(data.language)
        has_region = data.meta.get("has_region")
        instances.append(
            Instance(
                id=data.id,
                language=language,
                fused_query=data.fused_query,
                blurred_query=data.blurred_query,
                constraints=constraints(
                    data.fused_query,
                    data.blurred_query,
                    data.removed_constraints,
                    data.removed_spans,
                    language,
                ),
                has_region=has_region if isinstance(has_region, bool) else None,
            )
        )
    return instances


# -- the questions ----------------------------------------------------------------------------


def unknown_topics(instance: Instance) -> list[str]:
    """What the instance's fused query does not say: the topics of UNKNOWN_QUESTIONS none of
    its removed constraints is and its check finds unsaid (a place only where the dataset
    says the query has none)."""
    removed = {c.type for c in instance.constraints}
    topics = []
    for topic in UNKNOWN_QUESTIONS:
        if topic in removed:
            continue
        if topic == "region":
            if instance.has_region is False:
                topics.append(topic)
        elif not _SAYS[topic].search(instance.fused_query):
            topics.append(topic)
    return topics


def definition_term(instance: Instance, span: str) -> str | None:
    """The term a definition question asks about: a quoted term of the blurred query
    (“暖巢计划”), else the fused query's word the removed span qualifies (famine of Iron
    Winter famine: the word before it; lodging of crop lodging in cereals: the word inside
    it that the blurred query has too)."""
    quoted = re.search(r"[“\"'‘「]([^”\"'’」]{2,20})[”\"'’」]", instance.blurred_query)
    if quoted:
        return quoted.group(1)
    blurred = {instance.blurred_query[s:e].lower() for s, e in unit_spans(instance.blurred_query)}
    inside = [w for w in _words(span) if w.lower() in blurred and not _is_edge(w, "en")]
    if inside:
        return inside[0]
    words = _words(instance.fused_query[: instance.fused_query.find(span)])
    if instance.language != "en" or not words or _is_edge(words[-1], "en"):
        return None
    name = len(words) - 1  # a name's words all (Iron Winter of Iron Winter famine)
    while name > 0 and words[name][:1].isupper() and words[name - 1][:1].isupper():
        name -= 1
    return " ".join(words[name:])


def _words(text: str) -> list[str]:
    return [text[s:e] for s, e in unit_spans(text)]


def _question(templates: Sequence[str], language: str, rng: random.Random, term: str | None) -> str:
    usable = [t for t in templates if "{term}" not in t or term]
    question = rng.choice(usable).format(term=term or "")
    if rng.random() < OPENER_SHARE:
        question = rng.choice(_OPENERS[language]) + question
    return question


def answerer_example(instance: Instance, rng: random.Random) -> AnswererExample:
    """One labelled call on `instance`: a question about a removed constraint (VALUE_SHARE of
    them) answered with its span, or about what the fused query does not say, `unknown`."""
    language = instance.language
    topics = unknown_topics(instance)
    if instance.constraints and (rng.random() < VALUE_SHARE or not topics):
        constraint = rng.choice(instance.constraints)
        topic, completion = constraint.type, constraint.span
        term = definition_term(instance, completion) if topic == "definition" else None
        question = _question(VALUE_QUESTIONS[topic][language], language, rng, term)
    else:
        weights = [UNKNOWN_WEIGHTS.get(t, 1) for t in topics]
        topic, completion = rng.choices(topics, weights=weights)[0], UNKNOWN
        question = _question(UNKNOWN_QUESTIONS[topic][language], language, rng, None)
    system, user = render(
        "user_answerer", language, fused_query=instance.fused_query, question=question
    )
    return AnswererExample(
        instance_id=instance.id,
        language=language,
        topic=topic,
        question=question,
        completion=completion,
        fused_query=instance.fused_query,
        messages=chat(system, user),
    )


def generate(count: int, seed: int) -> list[AnswererExample]:
    """`count` labelled User Answerer calls drawn with `seed` from the train split
    (CHINESE_SHARE of them on its Chinese instances)."""
    rng = random.Random(seed)
    instances = read_instances()
    by_language = {
        language: [i for i in instances if i.language == language] for language in ("en", "zh")
    }
    examples = []
    for _ in range(count):
        language = "zh" if rng.random() < CHINESE_SHARE and by_language["zh"] else "en"
        examples.append(answerer_example(rng.choice(by_language[language]), rng))
    return examples


def label_counts(examples: Sequence[AnswererExample]) -> dict[str, int]:
    """How many examples answer with a value and how many `unknown`."""
    return {label: sum(e.label == label for e in examples) for label in ("value", "unknown")}


def topic_counts(examples: Sequence[AnswererExample]) -> dict[str, dict[str, int]]:
    """Per label, how many examples ask about each topic."""
    counts: dict[str, dict[str, int]] = {"value": {}, "unknown": {}}
    for example in examples:
        bucket = counts[example.label]
        bucket[example.topic] = bucket.get(example.topic, 0) + 1
    return {label: dict(sorted(topics.items())) for label, topics in counts.items()}


def check_completion(example: AnswererExample) -> None:
    """Raise if the completion is not what the User Answerer's span constraint admits on the
    example's fused query (`unknown`, or a span of it within the default limits)."""
    if not is_span(example.completion, example.fused_query):
        raise ValueError(
            f"{example.instance_id}: {example.completion!r} is not a span of "
            f"{example.fused_query!r}"
        )
