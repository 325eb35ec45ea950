"""Labelled judge examples for fine-tuning the coverage judge, from the train split only.

Each example is one judge call as a run makes it: an answer and an instance's golden nuggets
rendered in the judge's own prompt (cts/agents/prompts/judge.yaml, `user`), and as completion the
JSON the judge's schema (`cts.agents.judge.judge_schema`) asks for, keyed by the nugget ids sent,
each an evidence quote before its label. The answers are written from the nuggets of the
sample benchmark's `train.jsonl` and its corpus documents; the human labels in
`cts/eval/sample_data/judge_labels.jsonl` (what `cts judge calibrate --labels sample` measures on)
are never read.

Per nugget the answer either
- states it (`full`): the nugget's sentence, as written or after a connective;
- states part of it (`partial`): its first clause only, or its number rounded ("about …");
- states a near miss (`none`): the same sentence with every number changed, or another
  instance's name in place of its own;
- or says nothing of it (`none`).
Sentences from other train instances' documents and hedges pad some answers; some answers
found nothing at all. English and Chinese, as the instances are. Everything is drawn from one
`random.Random(seed)`: the same seed gives the same examples, in the same order.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cts.agents.judge import LABELS, UNRELATED_ANSWERS, judge_schema
from cts.agents.prompts import prompt_language, render
from cts.eval.audit.judge_labels import labels_path
from cts.train.sft import RoleCall, as_json, chat

#: The sample benchmark's train split and corpus: the only inputs.
SAMPLE_DIR = labels_path("sample").parent
TRAIN_FILE = SAMPLE_DIR / "train.jsonl"
CORPUS_FILE = SAMPLE_DIR / "corpus.jsonl"

#: How a nugget appears in an answer, and the label it then has.
KINDS = {
    "stated": "full",
    "part": "partial",
    "rounded": "partial",
    "wrong_number": "none",
    "wrong_entity": "none",
    "omitted": "none",
}
#: Drawn for each nugget (before falling back when a nugget has no clause, number or name).
KIND_WEIGHTS = {
    "stated": 4,
    "part": 3,
    "rounded": 2,
    "wrong_number": 2,
    "wrong_entity": 1,
    "omitted": 2,
}
_SAME_LABEL = {
    "part": "rounded",
    "rounded": "part",
    "wrong_number": "wrong_entity",
    "wrong_entity": "wrong_number",
}
#: Longest evidence quote the completion carries (the schema allows 120 characters).
EVIDENCE_CHARS = 40

_APPROXIMATE = re.compile(r"(?:约|大约|about|around|roughly|approximately|some|up to) ?$", re.I)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NAME = re.compile(r"(?<=[a-z,] )(?:[A-Z][\w'’-]*)(?: [A-Z][\w'’-]*)*")
_CLAUSE = {
    "en": re.compile(r",? (?:and|with|while|so|but|at|which|making|giving) |, |; "),
    "zh": re.compile(r"[，；、]"),
}
_CONNECTIVES = {
    "en": ("", "", "Also, ", "In addition, ", "According to the sources, ", "Notably, "),
    "zh": ("", "", "此外，", "另外，", "据资料显示，"),
}
_HEDGES = {
    "en": (
        "I could not confirm every detail.",
        "Other sources give slightly different figures.",
        "Details may have changed since publication.",
    ),
    "zh": ("部分细节未能核实。", "不同来源的说法略有出入。", "具体情况以官方公布为准。"),
}
_NOTHING = {
    "en": "I could not find reliable information about this.",
    "zh": "没有找到关于这个问题的可靠信息。",
}


@dataclass(frozen=True)
class Instance:
    id: str
    language: str
    nuggets: list[tuple[str, str]]  # (id, text)
    source_ids: list[str]


@dataclass(frozen=True)
class JudgeExample(RoleCall):
    """One judge call: its chat messages (system, user), the completion and each label."""

    ABOUT: ClassVar[tuple[str, ...]] = ("instance_id", "labels", "kinds")

    labels: dict[str, str]
    kinds: dict[str, str]


def read_instances(path: Path = TRAIN_FILE) -> list[Instance]:
    instances = []
    for line in path.read_text("utf-8").splitlines():
        data = json.loads(line)
        nuggets = data["golden"]["nuggets"]
        instances.append(
            Instance(
                id=data["id"],
                language=prompt_language(data["language"]),
                nuggets=[(n["id"], n["text"]) for n in nuggets],
                source_ids=sorted({s for n in nuggets for s in n["source_ids"]}),
            )
        )
    return instances


def corpus_sentences(
    instances: Sequence[Instance], path: Path = CORPUS_FILE
) -> dict[str, list[str]]:
    """instance id → sentences of its source documents (the train instances' only)."""
    wanted = {s: i.id for i in instances for s in i.source_ids}
    found: dict[str, list[str]] = {i.id: [] for i in instances}
    for line in path.read_text("utf-8").splitlines():
        doc = json.loads(line)
        if doc["doc_id"] in wanted:
            parts = re.split(r"(?<=[.!?。！？])\s*", doc["text"])
            found[wanted[doc["doc_id"]]] += [p for p in parts if 15 <= len(p) <= 200]
    return found


def _number_text(value: float, like: str) -> str:
    """`value` written as `like` is: its decimals, and thousands commas if it had them."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    text = f"{value:,.{decimals}f}" if "," in like else f"{value:.{decimals}f}"
    return text


def _parse(number: str) -> float:
    return float(number.replace(",", ""))


def _is_year(number: str) -> bool:
    return number.isdigit() and len(number) == 4 and 1900 <= int(number) <= 2100


def changed_numbers(text: str, rng: random.Random) -> str | None:
    """`text` with every number changed (a year by 1–3, other figures by 20–60% or more);
    None when it has none."""

    def change(match: re.Match[str]) -> str:
        number = match.group()
        if _is_year(number):
            return str(int(number) + rng.choice((-2, -1, 1, 2, 3)))
        value = _parse(number)
        step = max(value * rng.choice((0.2, 0.3, 0.5, -0.25, 0.6)), 1.0)
        new = value + (step if value - step <= 0 else rng.choice((step, -step)))
        if _number_text(new, number) == number:
            new = value + 1
        return _number_text(new, number)

    return _NUMBER.sub(change, text) if _NUMBER.search(text) else None


def rounded_number(text: str, language: str) -> str | None:
    """`text` with its first figure (not a year) rounded and marked approximate ("about €450"
    for "€449", "约650" for "652"); None when it has no such figure or rounding keeps it."""
    for match in _NUMBER.finditer(text):
        number = match.group()
        if _is_year(number) or _parse(number) < 5:
            continue
        value = _parse(number)
        digits = len(str(int(value)))
        for step in (10 ** max(digits - 2, 0), 5 * 10 ** max(digits - 2, 0), 10 ** (digits - 1)):
            new = round(value / step) * step
            if new != value and new > 0:
                start = match.start()
                while start > 0 and text[start - 1] in "€$£¥":
                    start -= 1
                marked = re.search(_APPROXIMATE, text[max(start - 14, 0) : start]) is not None
                mark = "" if marked else "约" if language == "zh" else "about "
                figure = _number_text(new, number.split(".")[0])
                return (
                    text[:start] + mark + text[start : match.start()] + figure + text[match.end() :]
                )
    return None


def first_part(text: str, language: str) -> str | None:
    """The nugget's first clause when it has more than one ("The Sol 5 launched in February
    2023" of "… at a starting price of €449."); None when it cannot be cut."""
    match = _CLAUSE[language].search(text)
    if match is None:
        return None
    head, rest = text[: match.start()], text[match.end() :]
    if language == "zh":
        return head + "。" if len(head) >= 6 and len(rest) >= 4 else None
    return head + "." if len(head.split()) >= 3 and len(rest.split()) >= 2 else None


def other_entity(text: str, names: Sequence[str], rng: random.Random) -> str | None:
    """`text` with its first name (capitalised words after a lower-case word) replaced by a
    name from another instance; None when it names none (Chinese text included)."""
    match = _NAME.search(text)
    choices = [n for n in names if match is not None and n != match.group()]
    if match is None or not choices:
        return None
    return text[: match.start()] + rng.choice(choices) + text[match.end() :]


def instance_names(instances: Sequence[Instance]) -> dict[str, list[str]]:
    """instance id → the names (as `other_entity` finds them) of every *other* instance."""
    own = {
        i.id: sorted({m.group() for _, t in i.nuggets for m in _NAME.finditer(t)})
        for i in instances
    }
    return {i: [n for j, names in own.items() if j != i for n in names] for i in own}


def _with_end(text: str, language: str) -> str:
    end = "。" if language == "zh" else "."
    return text if text.endswith((".", "。", "!", "?", "！", "？")) else text + end


def nugget_sentence(
    text: str, kind: str, language: str, names: Sequence[str], rng: random.Random
) -> str | None:
    """The sentence by which the answer holds the nugget as `kind` says, or None when the
    nugget cannot be written that way (no clause to cut, no number, no name)."""
    if kind == "stated":
        return text
    if kind == "part":
        return first_part(text, language)
    if kind == "rounded":
        return rounded_number(text, language)
    if kind == "wrong_number":
        return changed_numbers(text, rng)
    if kind == "wrong_entity":
        return other_entity(text, names, rng) if language == "en" else None
    return None


def _connected(sentence: str, language: str, rng: random.Random) -> str:
    connective = rng.choice(_CONNECTIVES[language])
    if not connective or language == "zh":
        return connective + sentence
    return (
        connective + sentence[0].lower() + sentence[1:]
        if sentence[1:2].islower()
        else connective + sentence
    )


def evidence(sentence: str, language: str) -> str:
    """The quote the completion gives: the sentence's beginning, at most EVIDENCE_CHARS
    characters, cut at a word in English."""
    sentence = sentence.rstrip(".。")
    if len(sentence) <= EVIDENCE_CHARS:
        return sentence
    cut = sentence[:EVIDENCE_CHARS]
    return cut if language == "zh" else cut.rsplit(" ", 1)[0]


def draw_kind(
    text: str, language: str, names: Sequence[str], rng: random.Random
) -> tuple[str, str | None]:
    """A kind by KIND_WEIGHTS and the nugget's sentence; a kind the nugget cannot take falls
    back to the other way of its label (`part` ↔ `rounded`, `wrong_number` ↔ `wrong_entity`),
    then to `stated` or `omitted` (half each)."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    sentence = nugget_sentence(text, kind, language, names, rng)
    if sentence is None and kind in _SAME_LABEL:
        kind = _SAME_LABEL[kind]
        sentence = nugget_sentence(text, kind, language, names, rng)
    if sentence is None and kind != "omitted":
        kind = rng.choice(("stated", "omitted"))
        sentence = nugget_sentence(text, kind, language, names, rng)
    return kind, sentence


#: Share of answers that found nothing (empty, a "found nothing" line, or unrelated text).
NOTHING_SHARE = 0.1
#: Share of examples drawn from the Chinese instances (2 of the 24 train instances).
CHINESE_SHARE = 0.25


def _nothing_answer(language: str, fillers: Sequence[str], rng: random.Random) -> str:
    joiner = "" if language == "zh" else " "
    choices = ["", _NOTHING[language], UNRELATED_ANSWERS[language]]
    if len(fillers) >= 2:
        choices.append(joiner.join(rng.sample(list(fillers), 2)))
    return rng.choice(choices)


def _answer_sentences(
    instance: Instance, fillers: Sequence[str], names: Sequence[str], rng: random.Random
) -> tuple[list[tuple[str | None, str]], dict[str, str]]:
    """The answer's sentences, each with the nugget id it holds (None: padding), and each
    nugget's kind."""
    language = instance.language
    kinds: dict[str, str] = {}
    sentences: list[tuple[str | None, str]] = []
    for nugget_id, text in instance.nuggets:
        kinds[nugget_id], sentence = draw_kind(text, language, names, rng)
        if sentence is not None:
            sentences.append((nugget_id, _with_end(sentence, language)))
    if rng.random() < 0.3:
        rng.shuffle(sentences)
    for _ in range(rng.choice((0, 0, 1))):
        if fillers:
            sentences.insert(rng.randint(0, len(sentences)), (None, rng.choice(list(fillers))))
    if rng.random() < 0.2 or not sentences:
        sentences.append((None, rng.choice(_HEDGES[language])))
    first, *rest = sentences
    return [first] + [(i, _connected(s, language, rng)) for i, s in rest], kinds


def judge_example(
    instance: Instance, fillers: Sequence[str], names: Sequence[str], rng: random.Random
) -> JudgeExample:
    """One labelled judge call on `instance`'s nuggets (listed as given or shuffled)."""
    language = instance.language
    if rng.random() < NOTHING_SHARE:
        answer = _nothing_answer(language, fillers, rng)
        kinds = {nugget_id: "omitted" for nugget_id, _ in instance.nuggets}
        quotes: dict[str, str] = {}
    else:
        sentences, kinds = _answer_sentences(instance, fillers, names, rng)
        answer = ("" if language == "zh" else " ").join(s for _, s in sentences)
        quotes = {i: evidence(s, language) for i, s in sentences if i is not None}
    listed = list(instance.nuggets)
    if rng.random() < 0.5:
        rng.shuffle(listed)
    system, user = render(
        "judge",
        language,
        "user",
        answer=answer or "(no answer)",
        nuggets="\n".join(f"{i}: {t}" for i, t in listed),
    )
    labels = {i: KINDS[kinds[i]] for i, _ in listed}
    verdicts = {i: {"evidence": quotes.get(i, "none"), "label": labels[i]} for i, _ in listed}
    return JudgeExample(
        instance_id=instance.id,
        language=language,
        messages=chat(system, user),
        completion=as_json(verdicts),
        labels=labels,
        kinds={i: kinds[i] for i, _ in listed},
    )


def generate(count: int, seed: int) -> list[JudgeExample]:
    """`count` labelled judge calls drawn with `seed` from the train split (CHINESE_SHARE of
    them on its Chinese instances)."""
    rng = random.Random(seed)
    instances = read_instances()
    sentences = corpus_sentences(instances)
    names = instance_names(instances)
    by_language = {
        language: [i for i in instances if i.language == language] for language in ("en", "zh")
    }
    examples = []
    for _ in range(count):
        language = "zh" if rng.random() < CHINESE_SHARE and by_language["zh"] else "en"
        instance = rng.choice(by_language[language])
        fillers = [
            s
            for other in by_language[language]
            if other.id != instance.id
            for s in sentences[other.id]
        ]
        examples.append(judge_example(instance, fillers, names[instance.id], rng))
    return examples


def label_counts(examples: Sequence[JudgeExample]) -> dict[str, int]:
    counts = dict.fromkeys(LABELS, 0)
    for example in examples:
        for label in example.labels.values():
            counts[label] += 1
    return counts


def check_schema(example: JudgeExample) -> None:
    """Raise if the completion does not fit the judge's schema for the nuggets it lists."""
    import jsonschema

    jsonschema.validate(json.loads(example.completion), judge_schema(list(example.labels)))
