"""A synthetic benchmark, drawn from a seed: made-up entities, one removed constraint each, and a
corpus in which the blurred query finds pages that compete with the right one.

Why synthetic: a clarifier can only be seen to learn on a benchmark large enough to show a few
points (hundreds of instances) whose facts no model knows beforehand, and whose blurred query
truly leaves the searcher choosing between answers. Each family of
cts/eval/construct/synth_families.yaml (one per removed-constraint type) makes an instance from
one made-up entity and one of its values: the fused query names the value, the blurred query
leaves it out (the value is the removed span), and the corpus holds one page per value of the
entity, each stating other names and numbers. The golden nuggets are the facts of the page for
the instance's value, citing it. Nothing here is true of anything: names and numbers are drawn.

The same seed and sizes give the same files, byte for byte (`cts data synth`)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cts.agents.question_type import QUESTION_TYPES, QuestionType
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import read_yaml

FAMILIES_PATH = Path(__file__).with_name("synth_families.yaml")
Language = Literal["en", "zh"]
LANGUAGES: tuple[Language, ...] = ("en", "zh")
#: A fact's weight by its position on the page (the first is what the question asks first).
WEIGHTS = (3, 2, 2, 1)
_SLOT = re.compile(r"\{(\w+)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Slot(_Strict):
    """Exactly one of: an integer range, a pool to pick from, a kind of made-up name."""

    number: tuple[int, int] | tuple[int, int, int] | None = None
    pick: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Slot:
        if sum(v is not None for v in (self.number, self.pick, self.name)) != 1:
            raise ValueError("a slot is one of number, pick or name")
        return self


class Texts(_Strict):
    fused: str
    blurred: str
    title: str
    facts: list[str] = Field(min_length=1, max_length=len(WEIGHTS))


class Family(_Strict):
    name: str
    type: QuestionType
    #: A pool per language, or {name: KIND}: values made up per entity.
    values: dict[str, Any]
    slots: dict[str, Slot] = {}
    en: Texts
    zh: Texts


class Families(_Strict):
    pools: dict[str, dict[Language, list[str]]]
    families: list[Family]


def load_families(path: Path = FAMILIES_PATH) -> Families:
    """The families file, checked: every type covered, every slot a text names declared."""
    families = Families.model_validate(read_yaml(path)[0])
    missing = set(QUESTION_TYPES) - {f.type for f in families.families}
    if missing:
        raise ValueError(f"{path}: no family for the type(s) {', '.join(sorted(missing))}")
    for family in families.families:
        for language in LANGUAGES:
            texts = getattr(family, language)
            named = {m for t in (texts.fused, texts.title, *texts.facts) for m in _SLOT.findall(t)}
            unknown = named - {"entity", "value", *family.slots}
            if unknown:
                raise ValueError(f"{path}: {family.name}.{language} names undeclared {unknown}")
    return families


# -- made-up names ----------------------------------------------------------------------------

_EN_SYLLABLES = (
    "ka lo mi ne ro sa ti va zo dre gal hol ker lin mor nyv pel quin rask sol tor ul ven wyn "
    "bri cal dor fen ash bel cor dal eth fal gor har isk jor kel lum mar nor orr pry"
).split()
_EN_FIRST = "Ada Bram Cora Dag Elin Finn Greta Hugo Ines Jonas Kaia Lars Mira Nils Oda Per".split()
_EN_PLACE = ("by", "mouth", "ford", "vik", "holm", "stead", "wick", "dale")
_EN_VENUE = ("Table", "House", "Kitchen", "Room", "Hall", "Yard")
_MODEL_SUFFIX = ("Pro", "Lite", "Max", "Air", "Mini", "Plus", "Go", "Ultra")
_ZH_CHARS = "诺维卡德莫拉贝尔塔西欧兰格斯菲汉宁索克瑞芙洛岚霍黎曼桑"
_ZH_SURNAMES = "王李张陈林周吴郑赵孙"
_ZH_GIVEN = "明华静磊芳敏强伟丽军"
_ZH_PLACE = ("市", "镇", "港", "城")
_ZH_VENUE = ("餐厅", "小馆", "食府", "厨房")


class Names:
    """Made-up names, each handed out once per dataset (two entities never share one)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.taken: set[str] = set()

    def _word(self, language: Language) -> str:
        if language == "zh":
            return "".join(self.rng.sample(_ZH_CHARS, self.rng.choice((2, 3))))
        return "".join(self.rng.sample(_EN_SYLLABLES, 2)).capitalize()

    def _draw(self, kind: str, language: Language) -> str:
        rng, word = self.rng, self._word(language)
        if kind == "brand":
            return word
        if kind == "place":
            return word + rng.choice(_ZH_PLACE if language == "zh" else _EN_PLACE)
        if kind == "person":
            if language == "zh":
                return rng.choice(_ZH_SURNAMES) + "".join(rng.sample(_ZH_GIVEN, 2))
            return f"{rng.choice(_EN_FIRST)} {self._word('en')}"
        if kind == "venue":
            if language == "zh":
                return word + rng.choice(_ZH_VENUE)
            return f"{word} {rng.choice(_EN_VENUE)}"
        if kind == "model":  # Latin model names in either language, as shops print them
            return f"{self._word('en')} {rng.choice(_MODEL_SUFFIX)}"
        raise ValueError(f"unknown name kind {kind!r}")

    def new(self, kind: str, language: Language) -> str:
        while True:
            name = self._draw(kind, language)
            if name not in self.taken:
                self.taken.add(name)
                return name


# -- instances and pages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Synthetic:
    """Instances per split (rows as the dataset files hold them) and the corpus's pages."""

    splits: dict[str, list[dict[str, Any]]]
    corpus: list[dict[str, Any]]
    seed: int


def _fill(text: str, slots: dict[str, str]) -> str:
    filled = _SLOT.sub(lambda m: slots[m.group(1)], text)
    return filled[:1].upper() + filled[1:]


def _slots(family: Family, pools: Families, language: Language, names: Names) -> dict[str, str]:
    """One page's slot values; picks from one pool differ on a page (two rooms, two services)."""
    rng, drawn, used = names.rng, {}, set()
    for key, slot in family.slots.items():
        if slot.number is not None:
            low, high, *step = slot.number
            drawn[key] = str(rng.randrange(low, high + 1, step[0] if step else 1))
        elif slot.pick is not None:
            drawn[key] = rng.choice([p for p in pools.pools[slot.pick][language] if p not in used])
            used.add(drawn[key])
        else:
            drawn[key] = names.new(str(slot.name), language)
    return drawn


def _values(family: Family, language: Language, names: Names) -> list[str]:
    if "name" in family.values:
        return [names.new(str(family.values["name"]), language) for _ in range(3)]
    return list(family.values[language])


def _instance(
    family: Family, pools: Families, language: Language, names: Names, ids: tuple[str, int]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One instance of `family` and its entity's pages (one per value, the right one among
    them). `ids`: the instance id and the first free page number."""
    instance_id, first_page = ids
    texts: Texts = getattr(family, language)
    entity = names.new("brand", language)
    values = _values(family, language, names)
    value = names.rng.choice(values)
    pages, facts, cited = [], [], ""
    for j, each in enumerate(values):
        slots = {"entity": entity, "value": each, **_slots(family, pools, language, names)}
        page_facts = [_fill(f, slots) for f in texts.facts]
        doc_id = f"SY-{first_page + j:05d}"
        pages.append(
            {
                "doc_id": doc_id,
                "url": f"https://{family.name}.synth.example/{first_page}/{j}",
                "title": _fill(texts.title, slots),
                "text": ("" if language == "zh" else " ").join(page_facts),
                "language": language,
            }
        )
        if each == value:
            facts, cited = page_facts, doc_id
    given = {"entity": entity, "value": value}
    row = {
        "id": instance_id,
        "language": language,
        "blurred_query": _fill(texts.blurred, given),
        "fused_query": _fill(texts.fused, given),
        "removed_constraints": [{"type": family.type, "span": value}],
        "golden": {
            "nuggets": [
                {"id": f"n{k + 1}", "text": fact, "weight": WEIGHTS[k], "source_ids": [cited]}
                for k, fact in enumerate(facts)
            ]
        },
        "meta": {"synthetic": True, "family": family.name, "competing_pages": len(values) - 1},
    }
    return row, pages


def synthesize(
    sizes: dict[str, int], seed: int = 0, zh_share: float = 0.25, path: Path = FAMILIES_PATH
) -> Synthetic:
    """`sizes` instances per split (e.g. {"train": 200, "heldout": 100}), families in turn, a
    `zh_share` of them Chinese; no entity is in two instances, so no two splits share a page."""
    if not 0 <= zh_share <= 1:
        raise ValueError(f"zh_share must be between 0 and 1, got {zh_share}")
    families = load_families(path)
    names = Names(random.Random(seed))
    splits: dict[str, list[dict[str, Any]]] = {}
    corpus: list[dict[str, Any]] = []
    for split, n in sizes.items():
        rows = splits.setdefault(split, [])
        for i in range(n):
            family = families.families[i % len(families.families)]
            language: Language = "zh" if names.rng.random() < zh_share else "en"
            row, pages = _instance(
                family, families, language, names, (f"SY-{split}-{i + 1:03d}", len(corpus) + 1)
            )
            rows.append(row)
            corpus += pages
    return Synthetic(splits, corpus, seed)


def counts(synthetic: Synthetic) -> dict[str, Any]:
    """Per split: its instances, by language and by removed-constraint type; the pages."""
    out: dict[str, Any] = {}
    for split, rows in synthetic.splits.items():
        languages = Counter(r["language"] for r in rows)
        types = Counter(c["type"] for r in rows for c in r["removed_constraints"])
        out[split] = {
            "instances": len(rows),
            "languages": {k: languages[k] for k in LANGUAGES if languages[k]},
            "types": {k: types[k] for k in QUESTION_TYPES if types[k]},
        }
    out["corpus"] = {"pages": len(synthetic.corpus)}
    return out


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_synthetic(synthetic: Synthetic, out: Path, command: str) -> list[Path]:
    """SPLIT.jsonl per split, corpus.jsonl and README.md (what it is, the command that made it,
    its counts) under `out`, each written whole or not at all; the paths written."""
    figures = json.dumps(counts(synthetic), indent=1, ensure_ascii=False)
    readme = (
        "# A synthetic Clarify-Then-Search benchmark\n\n"
        "Made-up entities and facts drawn from a seed (cts/eval/construct/synth.py): nothing\n"
        "in these files is true of anything. Each instance removes one constraint; the corpus\n"
        "holds one page per value of the instance's entity, so the blurred query finds\n"
        "competing pages.\n\n"
        f"Made by: `{command}` (seed {synthetic.seed}; the same command writes the same bytes).\n\n"
        f"Counts:\n\n```json\n{figures}\n```\n"
    )
    files = {f"{split}.jsonl": _jsonl(rows) for split, rows in synthetic.splits.items()}
    files |= {"corpus.jsonl": _jsonl(synthetic.corpus), "README.md": readme}
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_whole(out / name, text)
    return [out / name for name in files]
