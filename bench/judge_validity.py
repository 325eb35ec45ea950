"""Can the lexical judge's restore score be earned without the facts? Scores the sample's 72
instances (train, dev and test) under answers that state no fact of any nugget, beside answers
that state them all:

- `blurred` / `fused`: the blurred or the fused query itself as the answer (a searcher that
  answers with its question). A judge that credits restatement gives `fused` more than
  `blurred`, an "oracle gain" with no search at all;
- `salad (words)` / `salad (chars)`: every word of the instance's nuggets (for Chinese, every
  jieba word; `chars`: every character), shuffled with a fixed seed into one text;
  `salad (per nugget)`: each nugget's words (characters) shuffled among themselves;
- `unrelated`: the nuggets of another instance of the same language;
- `nuggets`: the instance's own nuggets, one sentence each (what a perfect answer states);
- `nuggets reordered`: the same sentences in reverse order.

Prints the mean restore_score_100 per language and overall, with n; and how many nugget labels
the fused query earns beyond the blurred one. Not a test: prints figures.
`python bench/judge_validity.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from statistics import mean

from cts.agents import lexical_judge
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance
from cts.eval.score.metrics import restore_score

SPLITS = ("train", "dev", "test")
Answer = Callable[[Instance, list[Instance]], str]


def _words(instance: Instance, characters: bool) -> list[str]:
    texts = [n.text for n in instance.golden.nuggets]
    if instance.language != "zh":
        return [w for t in texts for w in t.split()]
    if characters:
        return [c for t in texts for c in t]
    import jieba

    return [w for t in texts for w in jieba.lcut(t)]


def salad(characters: bool) -> Answer:
    def answer(instance: Instance, _: list[Instance]) -> str:
        words = _words(instance, characters)
        random.Random(instance.id).shuffle(words)
        return ("" if instance.language == "zh" else " ").join(words)

    return answer


def salad_per_nugget(instance: Instance, _: list[Instance]) -> str:
    assert instance.golden is not None
    rng, shuffled = random.Random(instance.id), []
    for n in instance.golden.nuggets:
        words = list(n.text) if instance.language == "zh" else n.text.split()
        rng.shuffle(words)
        shuffled.append(("" if instance.language == "zh" else " ").join(words))
    return " ".join(shuffled)


def unrelated(instance: Instance, every: list[Instance]) -> str:
    same = [i for i in every if i.language == instance.language and i.id != instance.id]
    other = same[sum(map(ord, instance.id)) % len(same)]
    return " ".join(n.text for n in other.golden.nuggets)


ANSWERS: dict[str, Answer] = {
    "blurred": lambda i, _: i.blurred_query,
    "fused": lambda i, _: i.fused_query,
    "salad (words)": salad(characters=False),
    "salad (chars)": salad(characters=True),
    "salad (per nugget)": salad_per_nugget,
    "unrelated": unrelated,
    "nuggets": lambda i, _: " ".join(n.text for n in i.golden.nuggets),
    "nuggets reordered": lambda i, _: " ".join(n.text for n in reversed(i.golden.nuggets)),
}


def labels(instance: Instance, answer: str) -> dict[str, str]:
    assert instance.golden is not None
    return {
        n.id: lexical_judge.label(answer, n.text, instance.fused_query)[0]
        for n in instance.golden.nuggets
    }


def score(instance: Instance, answer: str) -> float:
    weights = {n.id: n.weight for n in instance.golden.nuggets}
    return restore_score(labels(instance, answer), weights)  # type: ignore[arg-type]


def main() -> None:
    every = [i for s in SPLITS for i in load_instances(DatasetSource(path="sample", split=s))]
    languages = sorted({i.language for i in every})
    print(f"{len(every)} instances ({', '.join(SPLITS)})")
    print(
        f"{'answer':<20}"
        + "".join(
            f"{lang + ' (n=' + str(sum(i.language == lang for i in every)) + ')':>14}"
            for lang in languages
        )
        + f"{'all':>10}"
    )
    for name, make in ANSWERS.items():
        scores = {i.id: score(i, make(i, every)) for i in every}
        row = [mean(scores[i.id] for i in every if i.language == lang) for lang in languages]
        print(
            f"{name:<20}" + "".join(f"{v:>14.1f}" for v in row) + f"{mean(scores.values()):>10.1f}"
        )
    moved = total = 0
    for i in every:
        blurred, fused = labels(i, i.blurred_query), labels(i, i.fused_query)
        total += len(fused)
        moved += sum(fused[k] != blurred[k] for k in fused)
    print(f"nugget labels the fused query moves from the blurred one's: {moved} of {total}")


if __name__ == "__main__":
    main()
