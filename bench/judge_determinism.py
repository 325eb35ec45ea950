"""What `judge.deterministic` costs, and what batching moves, on the tiny model (in-process
transformers engine).

Judges N records (sample dev instances, half English and half Chinese; each answer states the
first k of its nuggets, k cycling 0..3, so labels need not all be alike) with the experiment's
judge prompt, sampling and `judge.batch_size`, as a rejudge does: every record's judge calls in
flight at once, up to `--concurrency` records, on one engine of `max_batch_size` 8. Passes on
one engine, after a warm-up pass that loads the model and compiles every output constraint
(untimed in the comparison: the first pass would otherwise pay for it):

- batched: the requests share generate() calls (what a run does by default);
- unbatched: each request alone (`judge.deterministic: true`);
- batched again, unbatched again: the same, to see the spread of the timings and whether a
  pass repeats itself.

Prints seconds per judged record of each pass and, between passes, how many nugget labels and
evidence quotes differ. Timings on a shared machine move with its load: compare passes of one
run. Not a test: prints figures.
`python bench/judge_determinism.py [--records 6] [--concurrency 6]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Sequence

from cts.agents import judge
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance
from cts.eval.run.config import load_experiment
from cts.serving.batching import Unbatched
from cts.serving.engine import ChatModel
from cts.serving.tiny_model import prepare_tiny
from cts.serving.transformers_engine import TransformersEngine
from cts.serving.types import Sampling

#: instance → nugget → (label, evidence quote).
Judged = dict[str, dict[str, tuple[str, str]]]


def answers(instances: Sequence[Instance]) -> list[str]:
    """Record i's answer: the first i % 4 of its nuggets, as sentences."""
    out = []
    for i, instance in enumerate(instances):
        assert instance.golden is not None
        out.append(" ".join(n.text for n in instance.golden.nuggets[: i % 4]))
    return out


async def judge_all(
    engine: ChatModel,
    instances: Sequence[Instance],
    texts: Sequence[str],
    sampling: Sampling,
    batch_size: int,
    concurrency: int,
) -> tuple[Judged, float]:
    """Every record judged, `concurrency` records at a time; labels and wall seconds."""
    gate = asyncio.Semaphore(concurrency)

    async def one(instance: Instance, answer: str) -> tuple[str, dict[str, tuple[str, str]]]:
        assert instance.golden is not None
        async with gate:
            found = await judge.judge(
                engine,
                answer,
                instance.golden.nuggets,
                instance.language,
                sampling,
                batch_size=batch_size,
            )
        return instance.id, {n: (v.label, v.evidence) for n, v in found.items()}

    started = time.perf_counter()
    done = await asyncio.gather(*(one(i, a) for i, a in zip(instances, texts, strict=True)))
    return dict(done), time.perf_counter() - started


def differing(a: Judged, b: Judged) -> tuple[int, int]:
    """Nugget labels, and evidence quotes, that differ between two passes."""
    labels = sum(a[i][n][0] != b[i][n][0] for i in a for n in a[i])
    return labels, sum(a[i][n][1] != b[i][n][1] for i in a for n in a[i])


def pick(records: int) -> list[Instance]:
    """`records` sample dev instances, alternating English and Chinese while both last."""
    every = load_instances(DatasetSource(path="sample", split="dev"))
    english = [i for i in every if i.language == "en"]
    chinese = [i for i in every if i.language != "en"]
    mixed = [i for pair in zip(english, chinese, strict=False) for i in pair]
    rest = [i for i in every if i not in mixed]
    return (mixed + rest)[:records]


async def main(records: int, concurrency: int) -> None:
    resolved = load_experiment(None)
    sampling = resolved.sampling_for("judge")
    batch_size = resolved.experiment.judge.batch_size
    instances = pick(records)
    texts = answers(instances)
    engine = TransformersEngine(
        "smollm2-135m-instruct", str(prepare_tiny()), dtype="auto", max_batch_size=8
    )
    engine.load()
    labels = sum(len(i.golden.nuggets) for i in instances if i.golden)
    languages = ", ".join(sorted({i.language for i in instances}))
    print(
        f"{len(instances)} records ({languages}), {labels} nugget labels, judge.batch_size "
        f"{batch_size}, concurrency {concurrency}, engine max_batch_size 8"
    )
    passes: dict[str, tuple[Judged, float]] = {}
    for name, view in (
        ("warm-up (unbatched)", Unbatched(engine)),
        ("batched", engine),
        ("unbatched", Unbatched(engine)),
        ("batched again", engine),
        ("unbatched again", Unbatched(engine)),
    ):
        calls = engine.batches
        passes[name] = await judge_all(view, instances, texts, sampling, batch_size, concurrency)
        seconds = passes[name][1]
        print(
            f"| {name} | {seconds:.1f} s | {seconds / len(instances):.1f} s per record | "
            f"{engine.batches - calls} generate calls |"
        )
    rates = Counter(v[0] for r in passes["unbatched"][0].values() for v in r.values())
    print(f"labels (unbatched): {dict(rates)}")
    for a, b in (
        ("batched", "unbatched"),
        ("batched", "batched again"),
        ("unbatched", "unbatched again"),
        ("warm-up (unbatched)", "unbatched"),
    ):
        label, evidence = differing(passes[a][0], passes[b][0])
        print(f"{a} vs {b}: {label} of {labels} labels, {evidence} evidence quotes differ")
    await engine.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(main(args.records, args.concurrency))
