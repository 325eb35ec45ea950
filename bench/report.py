"""How long the report's statistics take at the study's size: 518 instances x 5 conditions x
3 seeds of synthetic scores, one system's summary (bootstrap CIs, sign-flip tests, gain
recovered's paired bootstrap) and one pairwise comparison of two systems.

Not a test: prints figures. `python bench/report.py [--instances N] [--seeds S]`.
"""

from __future__ import annotations

import argparse
import random
import time

from eval.config import ALL_CONDITIONS
from eval.diagnostics import compare_systems, paired_instances, score_records, summarize
from eval.schema import Record

CONDITIONS: list[str] = list(ALL_CONDITIONS)


def records(instances: int, seeds: int, rng: random.Random) -> list[Record]:
    out = []
    for i in range(instances):
        for condition in CONDITIONS:
            k = int(condition[-1]) if condition.startswith("clarify@") else 0
            for seed in range(seeds):
                value = rng.uniform(0, 100)
                out.append(
                    Record(
                        instance_id=f"i{i}",
                        condition=condition,
                        seed=seed,
                        scores=dict.fromkeys(("restore_score_100", "strict", "unweighted"), value),
                        questions=["q"] * k,
                        answers=[rng.choice(["unknown", "2024"]) for _ in range(k)],
                        question_types=[["time"]] * k,
                    )
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=518)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    seeds = list(range(args.seeds))
    a, b = records(args.instances, args.seeds, rng), records(args.instances, args.seeds, rng)
    started = time.perf_counter()
    scored_a = score_records(a, CONDITIONS, seeds, "exclude")
    scored_b = score_records(b, CONDITIONS, seeds, "exclude")
    ids = paired_instances([(scored_a, CONDITIONS), (scored_b, CONDITIONS)])
    summarize(a, CONDITIONS, seeds, ids, scored_a)
    summarized = time.perf_counter()
    compare_systems([("a", scored_a), ("b", scored_b)], CONDITIONS)
    compared = time.perf_counter()
    print(
        f"{args.instances} instances x {len(CONDITIONS)} conditions x {args.seeds} seeds: "
        f"one system's summary {summarized - started:.1f} s, "
        f"one pair of systems compared {compared - summarized:.1f} s"
    )


if __name__ == "__main__":
    main()
