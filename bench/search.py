"""Local BM25 search latency (bm25s + jieba tokenization) on a synthetic 100k-document corpus,
and WebDancer agent runs per minute with the tiny model on the sample corpus.

Not a test: prints figures. `python bench/search.py [--documents N] [--agent-runs N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

WORDS = (
    "transit pass fare night train station festival museum ticket battery earbuds phone "
    "council budget vote harbour ferry route schedule winter summer spring autumn price "
    "subsidy clinic vaccine school university tuition rent housing league final coach "
    "season record rainfall harvest tea rice solar wind grid tariff market shares profit "
    "report survey policy law permit licence curfew parking bicycle lane bridge tunnel"
).split()
PLACES = [f"Town{i}" for i in range(300)]


def synthetic_corpus(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(60, 160))]
            place, year = rng.choice(PLACES), rng.randint(2015, 2026)
            text = f"{place} {year} " + " ".join(words)
            f.write(
                json.dumps(
                    {
                        "doc_id": f"s{i}",
                        "url": f"https://synthetic.example/{i}",
                        "title": f"{place} {rng.choice(WORDS)} {year}",
                        "text": text,
                    }
                )
                + "\n"
            )


def bench_bm25(n: int, queries: int) -> None:
    from cts.webdancer.backends.local import LocalSearch

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        synthetic_corpus(corpus, n)
        started = time.perf_counter()
        search = LocalSearch(corpus, Path(tmp) / "indexes")
        built = time.perf_counter() - started
        started = time.perf_counter()
        LocalSearch(corpus, Path(tmp) / "indexes")
        reloaded = time.perf_counter() - started
        rng = random.Random(1)
        latencies = []
        for _ in range(queries):
            query = " ".join(
                [rng.choice(PLACES), *rng.sample(WORDS, 3), str(rng.randint(2015, 2026))]
            )
            started = time.perf_counter()
            search.search_sync(query, 10)
            latencies.append((time.perf_counter() - started) * 1000)
        latencies.sort()
        p95 = latencies[int(0.95 * len(latencies)) - 1]
        print(
            f"bm25s over {n} synthetic documents: index built in {built:.1f} s (load + "
            f"tokenize + index + save), reloaded in {reloaded:.1f} s; {queries} queries, "
            f"top-10: p50 {statistics.median(latencies):.1f} ms, p95 {p95:.1f} ms"
        )


def bench_agent(runs: int) -> None:
    from cts.eval.data.dataset import DatasetSource, load_instances
    from cts.eval.run.config import load_experiment
    from cts.eval.run.engines import open_engines
    from cts.eval.run.search_agent import open_agent

    with tempfile.TemporaryDirectory() as tmp:
        resolved = load_experiment(
            None, [f"cache.path={tmp}/r.sqlite", f"search.tool_cache={tmp}/t.sqlite"]
        )
        questions = load_instances(DatasetSource(path="sample", split="dev", limit=runs))

        async def go() -> list:
            async with (
                open_engines(resolved, ["searcher", "summarizer"]) as engines,
                open_agent(resolved, engines) as agent,
            ):
                await agent.run("warm-up: compile the turn grammars")
                started = time.perf_counter()
                results = await asyncio.gather(*(agent.run(q.blurred_query) for q in questions))
                return [time.perf_counter() - started, results]

        seconds, results = asyncio.run(go())
    calls = sum(r.llm_calls for r in results)
    endings = {
        t: sum(r.termination == t for r in results)
        for t in ("answer", "max_calls", "context_limit", "error")
    }
    print(
        f"tiny-model agent (quickstart config, constrained, {runs} concurrent runs): "
        f"{runs / seconds * 60:.1f} runs/minute ({seconds:.0f} s, {calls} model calls, "
        f"endings {endings})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--agent-runs", type=int, default=4)
    args = parser.parse_args()
    bench_bm25(args.documents, args.queries)
    if args.agent_runs:
        bench_agent(args.agent_runs)
