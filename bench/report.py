"""How long `cts report` takes at the study's size: several synthetic runs (one per clarifier
system) of 518 instances x 5 conditions x 3 seeds, written as run directories and reported
together by `write_report` (what `cts report` calls), plus one call of each statistic: cold
(its resampling plan drawn first, as in a fresh process) and warm (the plan kept from before).

Not a test: prints figures and writes them as JSON. `python bench/report.py [--instances N]
[--seeds S] [--runs R] [--repeats K] [--metrics FILE] [--json PATH] [--keep DIR]`; `--metrics`
times the statistics of another copy of cts/eval/score/metrics.py instead (e.g. the previous
version: `git show HEAD:eval/score/metrics.py > /tmp/old_metrics.py`), for a before/after on the
same data (it imports this checkout's cts/eval/score/resampling.py: for a version from before the
batched statistics, whose resampling differs, run the whole old checkout instead, `PYTHONPATH=OLD
python OLD/bench/report.py`);
`--keep` writes the runs and the report into DIR and keeps them (the runs are the same on every
call), so that two versions' reports can be compared file by file.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import cts.eval.report.diagnostics
import cts.eval.score.metrics
from cts.eval.data.schema import Record
from cts.eval.report.report import write_report
from cts.eval.run.config import load_experiment
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.records import RecordStore, write_jsonl
from cts.eval.run.run_dir import Shard
from cts.eval.score.resampling import cached_plan

CONDITIONS: list[str] = list(ALL_CONDITIONS)
#: The statistics cts/eval/report/diagnostics.py calls, swapped together by --metrics.
STATISTICS = (
    "bootstrap_cis",
    "gain_recovered_ci",
    "holm",
    "mean",
    "paired_differences",
    "paired_tests",
)


def records(instances: int, seeds: int, rng: random.Random, offset: float) -> list[Record]:
    """One system's records: each condition's scores a little higher than blurred's, so that
    gain recovered is defined and the tests have something to find."""
    lift = {"blurred": 0.0, "clarify@1": 4.0, "clarify@2": 6.0, "clarify@3": 7.0, "oracle": 15.0}
    out = []
    for i in range(instances):
        base = rng.uniform(0, 80)
        for condition in CONDITIONS:
            k = int(condition[-1]) if condition.startswith("clarify@") else 0
            for seed in range(seeds):
                value = min(100.0, max(0.0, base + lift[condition] + offset + rng.gauss(0, 10)))
                out.append(
                    Record(
                        instance_id=f"i{i}",
                        condition=condition,
                        seed=seed,
                        scores={"restore_score_100": value, "strict": value, "unweighted": value},
                        questions=["q"] * k,
                        answers=[rng.choice(["unknown", "2024"]) for _ in range(k)],
                        question_types=[["time"]] * k,
                    )
                )
    return out


def write_runs(root: Path, runs: int, instances: int, seeds: int) -> list[Path]:
    rng = random.Random(0)
    resolved = load_experiment(
        None, [f"conditions={json.dumps(CONDITIONS)}", f"seeds={json.dumps(list(range(seeds)))}"]
    )
    dirs = []
    for r in range(runs):
        run_dir = root / f"system{r}"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(resolved.to_yaml())
        store = RecordStore(run_dir)
        made = records(instances, seeds, rng, offset=r * 0.5)
        for condition in CONDITIONS:
            path = store.path(condition, Shard())
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(path, (x for x in made if x.condition == condition))
        dirs.append(run_dir)
    return dirs


def load_metrics(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_metrics", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def timed(call: Callable[[], object], repeats: int, cold: bool) -> list[float]:
    """Seconds per call; `cold` forgets the kept resampling plans first, as a fresh `cts report`
    process starts without them (drawing a plan is part of what it pays)."""
    times = []
    for _ in range(repeats):
        if cold:
            cached_plan.cache_clear()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=518)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5, help="systems reported together")
    parser.add_argument("--repeats", type=int, default=3, help="timed reports (median shown)")
    parser.add_argument("--metrics", type=Path, help="time this copy of cts/eval/score/metrics.py")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/report.json"))
    parser.add_argument("--keep", type=Path, help="write (and keep) the runs and report here")
    args = parser.parse_args()
    if args.keep and args.keep.exists():
        raise SystemExit(f"{args.keep}: exists; --keep needs a new directory")
    metrics: Any = cts.eval.score.metrics
    if args.metrics:
        metrics = load_metrics(args.metrics)
        for name in STATISTICS:
            # A version without its own mean() used statistics.mean.
            setattr(cts.eval.report.diagnostics, name, getattr(metrics, name, statistics.mean))
    load = [os.getloadavg()[0]]
    rng = random.Random(1)
    a = [rng.uniform(0, 100) for _ in range(args.instances)]
    b = [x - 5 + rng.gauss(0, 10) for x in a]
    o = [x + 15 + rng.gauss(0, 10) for x in a]
    calls: dict[str, Callable[[], object]] = {
        "paired_test": lambda: metrics.paired_test(a, b),
        "bootstrap_ci": lambda: metrics.bootstrap_ci(a),
        "gain_recovered_ci": lambda: metrics.gain_recovered_ci(b, a, o),
    }
    functions = {
        f"{name} {kind}": timed(call, args.repeats, cold=kind == "cold")
        for name, call in calls.items()
        for kind in ("cold", "warm")
    }
    place = contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory()
    with place as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        dirs = write_runs(Path(tmp), args.runs, args.instances, args.seeds)
        out = Path(tmp) / "report"
        reports = timed(lambda: write_report(dirs, out), args.repeats, cold=True)
    load.append(os.getloadavg()[0])
    shape = f"{args.runs} runs of {args.instances} instances x {len(CONDITIONS)} conditions x "
    shape += f"{args.seeds} seeds"
    source = str(args.metrics or "cts/eval/score/metrics.py")
    print(f"{shape}, statistics from {source}; load average {load[0]:.1f} → {load[1]:.1f}")
    print(f"  whole report (write_report): median {statistics.median(reports):.2f} s of", end="")
    print(f" {[round(t, 2) for t in reports]}")
    for name, times in functions.items():
        median = statistics.median(times)
        print(f"  one {name} on {args.instances}: median {median:.3f} s of", end="")
        print(f" {[round(t, 3) for t in times]}")
    figures = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": load,
        "python": platform.python_version(),
        "shape": {"runs": args.runs, "instances": args.instances, "seeds": args.seeds},
        "metrics": source,
        "report_s": reports,
        "report_median_s": statistics.median(reports),
        "functions_s": functions,
        "functions_median_s": {k: statistics.median(v) for k, v in functions.items()},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"  written to {args.json}")


if __name__ == "__main__":
    main()
