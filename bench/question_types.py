"""Question-type classifiers against the hand-labelled tests/data/question_types.tsv.

Prints per-type precision, recall, F1 and support (per language and overall), micro-F1 and
exact-set accuracy of the keyword rules (`cts.agents.question_type.classify`); with `--model` also
of `classify_with_model` on that model (a config name under cts/configs/models/, e.g.
`smollm2-135m-instruct`, or a path to a model YAML). Not a test: prints figures.
`python bench/question_types.py [--model NAME_OR_YAML] [--errors]`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cts.agents.question_type import QUESTION_TYPES, classify, classify_with_model, normalise

TABLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "question_types.tsv"
LANGUAGES = ("en", "zh")


@dataclass(frozen=True)
class Labelled:
    question: str
    language: str
    types: tuple[str, ...]


def load_table(path: Path = TABLE) -> list[Labelled]:
    """The table's rows; every label must be a known type, written in canonical order."""
    rows = []
    for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        question, language, types = line.split("\t")
        labels = tuple(types.split(","))
        if list(labels) != normalise(labels):
            raise ValueError(f"{path}:{n}: labels {types!r} are not in canonical form")
        rows.append(Labelled(question, language, labels))
    return rows


@dataclass(frozen=True)
class Score:
    tp: int
    fp: int
    fn: int

    @property
    def support(self) -> int:
        return self.tp + self.fn

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, Score]:
    """Multi-label counts per type, and their sum under "micro" (micro-averaged P/R/F1)."""
    counts = {t: [0, 0, 0] for t in QUESTION_TYPES}
    for g, p in zip(gold, predicted, strict=True):
        for t in QUESTION_TYPES:
            counts[t][0] += t in g and t in p
            counts[t][1] += t not in g and t in p
            counts[t][2] += t in g and t not in p
    result = {t: Score(*c) for t, c in counts.items()}
    result["micro"] = Score(*(sum(c[i] for c in counts.values()) for i in range(3)))
    return result


def exact_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    pairs = list(zip(gold, predicted, strict=True))
    return sum(set(g) == set(p) for g, p in pairs) / len(pairs) if pairs else 0.0


def report(title: str, rows: list[Labelled], predicted: list[list[str]]) -> str:
    groups = [(lang, [i for i, r in enumerate(rows) if r.language == lang]) for lang in LANGUAGES]
    groups.append(("all", list(range(len(rows)))))
    table = {
        name: scores([rows[i].types for i in idx], [predicted[i] for i in idx])
        for name, idx in groups
    }
    head = " | ".join(f"{name} P | {name} R | {name} F1 | {name} n" for name, _ in groups)
    lines = [f"### {title}", "", f"| type | {head} |", "|---" * (1 + 4 * len(groups)) + "|"]
    for t in (*QUESTION_TYPES, "micro"):
        cells = " | ".join(
            f"{s.precision:.2f} | {s.recall:.2f} | {s.f1:.2f} | {s.support}"
            for s in (table[name][t] for name, _ in groups)
        )
        lines.append(f"| {t} | {cells} |")
    exact = " | ".join(
        f"{exact_accuracy([rows[i].types for i in idx], [predicted[i] for i in idx]):.2f} "
        f"| | | {len(idx)}"
        for _, idx in groups
    )
    lines.append(f"| exact set | {exact} |")
    return "\n".join(lines)


def errors(rows: list[Labelled], predicted: list[list[str]]) -> str:
    return "\n".join(
        f"- {r.question}  gold={','.join(r.types)}  got={','.join(p) or '(failed)'}"
        for r, p in zip(rows, predicted, strict=True)
        if set(r.types) != set(p)
    )


async def with_model(ref: str, rows: list[Labelled], max_tokens: int) -> list[list[str]]:
    """`classify_with_model` on every row; a failed request (e.g. an answer outside the
    schema) predicts no type and is counted."""
    from cts.configs import CONFIG_DIR
    from cts.serving.model_config import build_engine, load_model_config
    from cts.serving.types import Sampling

    path = Path(ref) if ref.endswith((".yaml", ".yml")) else CONFIG_DIR / "models" / f"{ref}.yaml"
    engine = build_engine(load_model_config(path))
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
    try:
        results = await asyncio.gather(
            *(classify_with_model(engine, r.question, r.language, sampling) for r in rows),
            return_exceptions=True,
        )
    finally:
        await engine.aclose()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        print(f"{len(failed)} of {len(rows)} requests failed; first: {failed[0]!r}")
    return [[] if isinstance(r, BaseException) else list(r) for r in results]


def main(args: argparse.Namespace) -> None:
    rows = load_table(args.table)
    counts = ", ".join(f"{lang} {sum(r.language == lang for r in rows)}" for lang in LANGUAGES)
    print(f"{len(rows)} labelled questions ({counts})\n")
    keyword: list[list[str]] = [list(classify(r.question)) for r in rows]
    print(report("keyword rules (classify)", rows, keyword))
    if args.errors:
        print("\n" + errors(rows, keyword))
    if args.model:
        predicted = asyncio.run(with_model(args.model, rows, args.max_tokens))
        print("\n" + report(f"model {args.model} (classify_with_model)", rows, predicted))
        if args.errors:
            print("\n" + errors(rows, predicted))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", help="model config name under cts/configs/models/ or a YAML path"
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--errors", action="store_true", help="list the misclassified questions")
    main(parser.parse_args())
