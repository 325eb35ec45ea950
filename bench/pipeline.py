"""Does the pipeline keep the model server busy? Ceiling, pipeline and naive side by side.

Parts (`--parts`, default all), each with the figures it prints and writes to the JSON (`--out`):
- overhead: the quickstart on zero-latency scripted engines (cts/serving/scripted.py) over the local
  BM25 search: seconds of orchestration per model call, and a pyinstrument profile's top entries.
- curve: the pipeline against a latency-simulating OpenAI-compatible server on loopback
  (per-request and per-token delays, unlimited capacity) at concurrency 1…256, against the ideal
  (every slot always holding a request in flight).
- pipeline: the quickstart with every role on the vLLM-CPU server (tiny model) through the
  `openai` engine, as cts/configs/models/smollm2-135m-instruct-vllm.yaml sets it up: generated
  tokens/s, requests running and waiting (the server's /metrics every 0.5 s). Its requests are
  recorded (messages, sampling, constraint, completion length) for the parts below.
- rerun: the finished pipeline run re-run (same directory; a new directory on the same caches):
  model calls (must be 0) and wall time.
- ceiling: the same server saturated by a plain concurrent replay of the pipeline's request mix
  (max_tokens = the recorded completion length, `ignore_eos`) at several concurrencies: in a
  loop counted over a window, or (`--ceiling-mode pass`) the whole mix once.
- naive: the same protocol one key and one call at a time.
- structured: the recorded constrained requests with and without their constraint, on the server
  (xgrammar) and the in-process transformers engine (outlines): per-token latency ratio.
- prefix: per role, the fraction of prompt tokens that are a prefix shared with another request
  of the role, and the server's prefix-cache hit rate during the pipeline.

Not a test: no figure is asserted. `make bench`, or `python bench/pipeline.py --parts pipeline`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository's packages, when run as a script

# The parts' code, by reason to change: the simulated server (bench/sim_server.py), the
# hooks into a run (bench/pipeline_recording.py), the server's metrics (bench/server_metrics.py),
# the runs (bench/pipeline_runs.py, bench/orchestration_cost.py), the replays of the recorded
# mix (bench/replay_mix.py), and what is printed (bench/pipeline_figures.py).
from bench import sim_server  # noqa: E402 - after the path fix, like the modules below
from bench.orchestration_cost import measure_curve, measure_overhead  # noqa: E402
from bench.pipeline_figures import (  # noqa: E402
    CURVE_HEAD,
    best,
    ceiling_line,
    over_ceiling,
    run_line,
    summary,
)
from bench.pipeline_recording import Call, load_calls, save_calls, scripted  # noqa: E402
from bench.pipeline_runs import (  # noqa: E402
    SERVER_START,
    VLLM_MODEL,
    measure_rerun,
    measure_server_run,
    outcome_of,
    overrides,
    quickstart_roles,
    run_quietly,
    scripted_experiment,
    vllm_python,
    vllm_server,
)
from bench.replay_mix import (  # noqa: E402
    replay_pass,
    saturate,
    shared_prefixes,
    structured_in_process,
    structured_on_server,
    structured_sample,
)
from cts.eval.run.config import load_experiment  # noqa: E402

PARTS = ("overhead", "curve", "pipeline", "rerun", "ceiling", "naive", "structured", "prefix")
#: The parts that need the vLLM-CPU server.
SERVER_PARTS = {"pipeline", "ceiling", "naive", "structured"}


# -- the bench -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.results: dict[str, Any] = {
            "machine": machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "parts": list(args.parts),
        }
        self.mix: list[Call] | None = None
        self.pipeline_run: tuple[Path, Path] | None = None

    def save(self) -> None:
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(json.dumps(self.results, indent=1))

    def part(self, name: str, figures: dict[str, Any]) -> None:
        self.results[name] = figures
        self.save()

    def wants(self, name: str) -> bool:
        return name in self.args.parts

    def request_mix(self) -> list[Call]:
        if self.mix is None:
            self.mix = load_calls(self.args.requests)
        return [c for c in self.mix if not c.cached]

    def run(self) -> None:
        args = self.args
        if self.wants("overhead"):
            print("\n## overhead: scripted engines, local search", flush=True)
            self.part(
                "overhead",
                measure_overhead(self.work, args.overhead_instances, args.overhead_seeds, 25),
            )
        if self.wants("curve"):
            print("\n## curve: simulated server", flush=True)
            print(CURVE_HEAD, flush=True)
            self.part("curve", measure_curve(args, self.work))
        if SERVER_PARTS & set(args.parts) or (self.wants("rerun") and self.wants("pipeline")):
            python = vllm_python(args.vllm_python)
            if not python:
                raise SystemExit(
                    "no vllm-cpu interpreter: set CTS_VLLM_PYTHON (scripts/vllm_cpu_venv.sh) "
                    "or give --vllm-python"
                )
            with vllm_server(python, self.work / "logs") as (url, model):
                self.part("server", SERVER_START)
                self.server_parts(url, model.name)
        if self.wants("rerun") and "rerun" not in self.results:
            self.part("rerun", self.scripted_rerun())
        if self.wants("structured") and not args.no_transformers:
            print("\n## structured: transformers engine (outlines)", flush=True)
            sample = structured_sample(self.request_mix(), args.structured_per_role)
            figures = self.results.setdefault("structured", {})
            figures["transformers"] = asyncio.run(structured_in_process(tiny_path(), sample))
            self.save()
        if self.wants("prefix"):
            print("\n## prefix sharing", flush=True)
            figures = shared_prefixes(tiny_path(), self.request_mix())
            pipeline = self.results.get("pipeline", {})
            figures["server_hit_rate_pipeline"] = pipeline.get("prefix_cache_hit_rate")
            self.part("prefix", figures)

    def server_parts(self, url: str, model: str) -> None:
        if self.wants("pipeline"):
            self.server_pipelines(url)
            if self.wants("rerun") and self.pipeline_run is not None:
                print("\n## rerun", flush=True)
                self.part("rerun", self.server_rerun(url))
        if self.wants("ceiling"):
            self.ceiling(url, model)
        if self.wants("naive"):
            print("\n## naive: one key and one call at a time", flush=True)
            figures, _, _, _ = measure_server_run(
                url,
                self.work,
                "naive",
                instances=self.args.naive_instances or self.args.instances,
                concurrency=1,
                max_concurrency=1,
            )
            self.part("naive", figures)
            print(run_line(figures), flush=True)
        if self.wants("structured"):
            print("\n## structured: vLLM-CPU server (xgrammar)", flush=True)
            sample = structured_sample(self.request_mix(), self.args.structured_per_role)
            self.part("structured", {"vllm": asyncio.run(structured_on_server(url, model, sample))})
        self.ratios()

    def server_pipelines(self, url: str) -> None:
        """Each --pipeline setting in each --key-order: the first run's calls are the request
        mix the other parts replay."""
        args = self.args
        runs = itertools.product(args.pipeline, args.key_order)
        for (concurrency, max_concurrency), order in runs:
            label = "pipeline" if not self.results.get("pipeline") else "pipeline_more"
            print(
                f"\n## {label}: concurrency {concurrency}/{max_concurrency}, {order}",
                flush=True,
            )
            figures, calls, run_dir, home = measure_server_run(
                url,
                self.work,
                f"pipeline-{concurrency}-{max_concurrency}-{order}",
                instances=args.instances,
                concurrency=concurrency,
                max_concurrency=max_concurrency,
                key_order=order,
            )
            if label == "pipeline":
                self.mix = calls
                save_calls(args.requests, calls)
                self.pipeline_run = (run_dir, home)
                self.part("pipeline", figures)
            else:
                self.results.setdefault("pipeline_more", []).append(figures)
                self.save()
            print(run_line(figures), flush=True)

    def ceiling(self, url: str, model: str) -> None:
        args = self.args
        print("\n## ceiling: replay of the pipeline's request mix", flush=True)
        rows = []
        for concurrency in args.ceiling:
            mix = self.request_mix()
            row = asyncio.run(
                replay_pass(url, model, mix, concurrency)
                if args.ceiling_mode == "pass"
                else saturate(
                    url, model, mix, concurrency, args.ceiling_warmup_s, args.ceiling_window_s
                )
            )
            rows.append(row)
            print(ceiling_line(row), flush=True)
        self.part("ceiling", {"rows": rows, "best_tokens_per_s": best(rows)})

    def server_rerun(self, url: str) -> dict[str, Any]:
        assert self.pipeline_run is not None
        run_dir, home = self.pipeline_run
        pipeline = self.results["pipeline"]
        concurrency, max_concurrency = pipeline["concurrency"], pipeline["max_concurrency"]

        def resolved_for(target: Path) -> Any:
            return load_experiment(
                "quickstart",
                overrides(
                    VLLM_MODEL,
                    {"endpoint": url, "max_concurrency": max_concurrency},
                    home,
                    target,
                    instances=self.args.instances,
                    concurrency=concurrency,
                    roles=quickstart_roles(),
                ),
            )

        return {"engine": "vllm-cpu server", **measure_rerun(resolved_for, run_dir, self.work, url)}

    def scripted_rerun(self) -> dict[str, Any]:
        home, run_dir = self.work / "rerun-home", self.work / "rerun-run"
        instances = self.args.overhead_instances

        def resolved_for(target: Path) -> Any:
            return scripted_experiment(home, target, instances, 1)

        with scripted():
            first, wall = run_quietly(resolved_for(run_dir), run_dir)
            figures = measure_rerun(resolved_for, run_dir, self.work, None)
        return {
            "engine": "scripted",
            "first_run": {**outcome_of(first), "wall_s": round(wall, 2)},
            **figures,
        }

    def ratios(self) -> None:
        pipeline, ceiling, naive = (self.results.get(k) for k in ("pipeline", "ceiling", "naive"))
        found: dict[str, Any] = {}
        if pipeline and ceiling:
            found.update(over_ceiling(pipeline, ceiling))
        if pipeline and naive:
            found["pipeline_over_naive_tokens_per_s"] = round(
                pipeline["tokens_per_s"] / naive["tokens_per_s"], 2
            )
            found["pipeline_over_naive_keys_per_min"] = round(
                pipeline["keys_per_min"] / naive["keys_per_min"], 2
            )
        if found:
            self.part("ratios", found)


def tiny_path() -> str:
    from cts.serving.tiny_model import prepare_tiny

    return str(prepare_tiny(log=False))


def pairs(text: str) -> list[tuple[int, int]]:
    """`4/8,16/16` → [(4, 8), (16, 16)]: key concurrency / the engine's max_concurrency."""
    found = []
    for item in text.split(","):
        concurrency, _, most = item.partition("/")
        found.append((int(concurrency), int(most or 8)))
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--parts", type=lambda t: t.split(","), default=list(PARTS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench/pipeline.json")
    parser.add_argument(
        "--requests",
        type=Path,
        default=ROOT / "runs/bench/pipeline-requests.jsonl",
        help="the pipeline's recorded request mix (written by `pipeline`, read by the others)",
    )
    parser.add_argument("--work", type=Path, default=None, help="run dirs and caches (temp)")
    parser.add_argument("--instances", type=int, default=2, help="pipeline: sample instances")
    parser.add_argument(
        "--pipeline",
        type=pairs,
        default=pairs("4/8"),
        help="key concurrency/engine max_concurrency per pipeline run; the first is the "
        "quickstart's (4/8), later ones test a lever",
    )
    parser.add_argument(
        "--key-order",
        type=lambda t: t.split(","),
        default=["longest_first"],
        help="pipeline: the key orders to run each --pipeline setting in (longest_first, "
        "dataset), each its own run on the same server; the first run's mix is the ceiling's",
    )
    parser.add_argument("--naive-instances", type=int, default=None, help="default --instances")
    parser.add_argument("--ceiling", type=ints, default=ints("3,8,16,32"))
    parser.add_argument(
        "--ceiling-mode",
        choices=("window", "pass"),
        default="window",
        help="window: the mix replayed shuffled in a loop, counted over a window after a "
        "warm-up (a sample of a long mix); pass: the whole mix once, counted while every worker "
        "had a request to send (slower, but all of it)",
    )
    parser.add_argument("--ceiling-warmup-s", type=float, default=10.0)
    parser.add_argument("--ceiling-window-s", type=float, default=30.0)
    parser.add_argument("--structured-per-role", type=int, default=1)
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--overhead-instances", type=int, default=24)
    parser.add_argument("--overhead-seeds", type=int, default=1)
    parser.add_argument("--curve", type=ints, default=ints("1,2,4,8,16,32,64,128,256"))
    parser.add_argument("--sim-request-s", type=float, default=sim_server.REQUEST_S)
    parser.add_argument("--sim-token-s", type=float, default=sim_server.TOKEN_S)
    parser.add_argument("--sim-tokens", type=int, default=sim_server.TOKENS)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--serve-sim", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {','.join(PARTS)}")
    return args


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args()
    if args.serve_sim is not None:
        sim_server.serve_sim(args.serve_sim, args.sim_request_s, args.sim_token_s, args.sim_tokens)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="cts-bench-pipeline-"))
    started = time.perf_counter()
    bench = Bench(args, work)
    try:
        bench.run()
    finally:
        bench.results["seconds"] = round(time.perf_counter() - started, 1)
        bench.save()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + summary(bench.results))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
