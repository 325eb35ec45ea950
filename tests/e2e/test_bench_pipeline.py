"""The logic bench/pipeline.py's figures rest on (no figure, no time is asserted): the requests it
records, the roles its simulated server tells apart, the protocol its simulated searcher speaks,
the replay it sends, and the metrics it reads (bench/pipeline_recording.py, sim_server.py,
replay_mix.py, server_metrics.py, pipeline_runs.py); and the experiment bench/gpu_check.py
generates."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from bench.pipeline_recording import admissions, recording, scripted, tokens_by_role
from bench.pipeline_runs import queued_phase, run_quietly, scripted_experiment
from bench.replay_mix import fresh_grammar, replay_body
from bench.server_metrics import counter, parse_metrics
from bench.sim_server import sim_role, sim_searcher
from cts.serving.openai_engine import OpenAIEngine
from cts.webdancer.agent import FINAL_REGEX, TURN_REGEX
from cts.webdancer.protocol import FinalAnswer, ToolCall, parse_turn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Every request of a scripted quickstart run on two instances, as the bench records it."""
    work = tmp_path_factory.mktemp("bench")
    calls: list = []
    with scripted(), recording(calls):
        result, _ = run_quietly(
            scripted_experiment(work / "home", work / "run", 2, 1), work / "run"
        )
    assert result.outcome.ran == 10 and not result.outcome.failures
    return calls


def test_every_role_s_requests_are_recorded_with_their_answers(recorded):
    roles = {c.role for c in recorded}
    assert roles == {"clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge"}
    assert all(c.completion_tokens > 0 and c.ended >= c.started for c in recorded)
    by_role = tokens_by_role(recorded, "completion_tokens")
    assert set(by_role) == roles
    assert sum(by_role.values()) == sum(c.completion_tokens for c in recorded)


def test_the_simulated_server_tells_each_role_by_its_request(recorded):
    engine = OpenAIEngine("sim", "http://unused/v1")
    for call in recorded:
        assert sim_role(engine.body(call.request)) == call.role


@pytest.mark.parametrize("question", ["Which rail pass is cheapest?", "哪种通勤月票最便宜？"])
def test_the_simulated_searcher_searches_visits_and_answers_in_the_grammar(question):
    from cts.serving.types import ChatRequest, RegexOutput
    from cts.webdancer.protocol import initial_messages, observation

    messages = initial_messages(question, "2026-11-30")
    turn = sim_searcher(ChatRequest.of(messages, output=RegexOutput(pattern=TURN_REGEX)))
    assert re.fullmatch(TURN_REGEX, turn)
    search = parse_turn(turn)
    assert isinstance(search, ToolCall) and search.name == "search"

    hits = observation("1. [Rail passes](https://example.org/passes)\nMonthly pass prices.")
    messages += [{"role": "assistant", "content": turn}, {"role": "user", "content": hits}]
    turn = sim_searcher(ChatRequest.of(messages, output=RegexOutput(pattern=TURN_REGEX)))
    assert re.fullmatch(TURN_REGEX, turn)
    visit = parse_turn(turn)
    assert isinstance(visit, ToolCall) and visit.arguments["url"] == ["https://example.org/passes"]

    final = sim_searcher(ChatRequest.of(messages, output=RegexOutput(pattern=FINAL_REGEX)))
    assert re.fullmatch(FINAL_REGEX, final) and isinstance(parse_turn(final), FinalAnswer)


def test_a_replay_generates_the_recorded_length_under_its_own_prefix(recorded):
    call = next(c for c in recorded if c.request.output is not None)
    body = replay_body(call, "m", "replay 3.1")
    assert body["max_tokens"] == call.completion_tokens and body["ignore_eos"] is True
    assert body["messages"][0]["content"] == f"[replay 3.1] {call.request.messages[0].content}"
    assert body["messages"][1:] == [m.model_dump() for m in call.request.messages[1:]]
    assert "structured_outputs" in body


def test_metrics_are_summed_over_label_sets_and_counters_read_with_or_without_total():
    text = (
        "# HELP vllm:num_requests_running Running.\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        'vllm:generation_tokens_total{model_name="m"} 120.0\n'
        "vllm:prefix_cache_hits 7\n"
    )
    metrics = parse_metrics(text)
    assert metrics["vllm:num_requests_running"] == 5.0
    assert counter(metrics, "vllm:generation_tokens") == 120.0
    assert counter(metrics, "vllm:prefix_cache_hits") == 7.0
    assert counter(metrics, "vllm:request_success") == 0.0


def test_a_fresh_grammar_is_new_text_for_the_same_answers():
    regex = fresh_grammar({"regex": "[a-z]{1,8}"}, 2)["regex"]
    assert regex != "[a-z]{1,8}" and re.fullmatch(regex, "word")
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fresh = fresh_grammar({"json": schema}, 0)["json"]
    assert fresh != schema and {k: v for k, v in fresh.items() if k != "$comment"} == schema


def test_the_queued_phase_is_the_server_s_count_from_first_request_to_last_key_admitted(recorded):
    from dataclasses import replace

    # The server's generated-token counter sampled each second from t = 100 (monotonic).
    samples = [(0.0, 0, 0, 0.0), (1.0, 2, 0, 10.0), (2.0, 2, 0, 30.0), (3.0, 1, 0, 60.0)]
    made = [
        replace(recorded[0], started=100.5, ended=101.0),
        replace(recorded[1], started=101.0, ended=103.5),
    ]
    # Keys admitted at 100.5 and 102.5: the counter reads 5 at 0.5 s and 45 at 2.5 s (linear
    # between samples), so 40 tokens in 2 s; the last answer comes 1 s after the last key.
    phase = queued_phase(samples, 100.0, made, [100.5, 102.5])
    assert phase == {"queued_s": 2.0, "tokens_per_s_queued": 20.0, "tail_s": 1.0}
    # Every key admitted at once (a pilot smaller than its concurrency): no queued phase.
    assert queued_phase(samples, 100.0, made, [100.5, 100.5])["tokens_per_s_queued"] is None


def test_each_key_s_admission_is_recorded_once(tmp_path):
    with scripted(), admissions() as admitted:
        result, _ = run_quietly(
            scripted_experiment(tmp_path / "home", tmp_path / "run", 2, 1), tmp_path / "run"
        )
    # 2 instances x 5 conditions; clarify@k keys that waited on their dialogue and took a slot
    # again are not counted twice.
    assert result.outcome.ran == 10 and len(admitted) == 10


def test_the_simulated_server_runs_as_its_own_process_and_counts_what_it_served(recorded):
    import httpx

    from bench.sim_server import sim_server

    call = next(c for c in recorded if c.role == "judge")
    body = OpenAIEngine("sim", "http://unused/v1").body(call.request)
    with sim_server(0.0, 0.0, 3) as (base, process):
        assert process.poll() is None
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).json()
        stats = httpx.get(f"{base}/stats", timeout=30).json()
    assert reply["usage"]["completion_tokens"] == 3
    assert json.loads(reply["choices"][0]["message"]["content"])
    assert stats["requests"] == 1 and stats["in_flight"] == 0 and stats["peak"] == 1


def test_the_bench_script_loads_its_parts_after_its_path_fix():
    """bench/pipeline.py is run as a script: its parts' modules are imported as `bench.*`."""
    spec = importlib.util.spec_from_file_location("bench_pipeline", ROOT / "bench" / "pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_pipeline"] = module
    spec.loader.exec_module(module)
    args = module.parse_args([])
    assert args.parts == list(module.PARTS) and args.pipeline == [(4, 8)]
    assert (args.sim_request_s, args.sim_token_s, args.sim_tokens) == (0.05, 0.004, 64)


@pytest.fixture(scope="module")
def gpu_check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "bench_gpu_check", ROOT / "bench" / "gpu_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cpu", [False, True])
def test_the_gpu_check_experiment_has_the_key_concurrency_and_the_server_s_dev_mode(
    gpu_check, tmp_path, cpu
):
    import yaml

    from cts.eval.run.config import load_experiment

    settings = {"instances": 2, "concurrency": 16, "max_concurrency": 32, "memory": 0.5}
    generated = gpu_check.experiment("tiny:smollm2-135m-instruct", tmp_path, **settings, cpu=cpu)
    (tmp_path / "gpu-check.yaml").write_text(yaml.safe_dump(generated))
    resolved = load_experiment(tmp_path / "gpu-check.yaml")
    assert resolved.experiment.concurrency == 16
    model = resolved.model_for("searcher")
    assert model.max_concurrency == 32
    # /reset_prefix_cache before each ceiling replay needs the server's dev endpoints.
    assert model.vllm.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert ("VLLM_CPU_KVCACHE_SPACE" in model.vllm.env) is cpu
    assert "VLLM_SERVER_DEV_MODE" not in gpu_check.CPU_MODEL["vllm"]["env"]


@pytest.mark.parametrize("cpu", [False, True])
def test_the_gpu_check_serves_compact_json_on_gpu_as_on_cpu(gpu_check, tmp_path, cpu):
    """The rendered server command carries the same structured-output settings on the GPU as
    on the CPU build: without `disable_any_whitespace` a model pads its JSON answers with
    newlines to the token limit, and the check measured padding (it was CPU-only)."""
    import yaml

    from cts.eval.run.config import load_experiment
    from cts.serving.server_group import plan_servers

    settings = {"instances": 2, "concurrency": 16, "max_concurrency": 32, "memory": 0.5}
    generated = gpu_check.experiment("/ckpt/model", tmp_path, **settings, cpu=cpu)
    (tmp_path / "gpu-check.yaml").write_text(yaml.safe_dump(generated))
    models = load_experiment(tmp_path / "gpu-check.yaml").model_configs
    (server,) = plan_servers(models, tmp_path, gpus=["0"], cpu=cpu, python="/venv/bin/python")
    command = server.server.command()
    config = command[command.index("--structured-outputs-config") + 1]
    assert json.loads(config) == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert ("--gpu-memory-utilization" in command) is not cpu  # the GPU command, or the CPU one


def test_the_gpu_check_defaults_fill_its_concurrency_with_keys(gpu_check):
    args = gpu_check.parse_args([])
    assert (args.concurrency, args.max_concurrency) == (64, 64)
    assert args.ceiling == [16, 64, 128, 256]
    assert args.instances * 5 >= args.concurrency  # 5 conditions per instance
    assert gpu_check.parse_args(["--ceiling", "4,8"]).ceiling == [4, 8]


def test_the_gpu_check_table_reads_every_figure_its_stages_write(gpu_check):
    """The table comes last in a GPU session that may not be had again: a missing key there
    would lose the session's figures (they are in the JSON, but unread)."""
    pipeline = {
        "in_flight": {"running_mean": 3.0, "running_max": 5, "waiting_mean": 0.1, "waiting_max": 2},
        "failures": {"engine_timeout": 1},
        "keys_run": 5,
        "wall_s": 10.0,
        "tokens_per_s": 5.0,
        "tokens_per_s_active": 6.0,
        "answered_tokens_per_s": 4.5,
        "tokens_per_s_queued": None,
        "prefix_cache_hit_rate": 0.5,
        "completion_tokens_by_role": {"judge": 100, "searcher": 300},
        "prompt_tokens_by_role": {"judge": 600, "searcher": 400},
    }
    ceiling = {"rows": [{"concurrency": 16, "tokens_per_s": 6.0, "in_flight": {}}]}
    ceiling["best_tokens_per_s"] = 6.0
    stats = {"calls": 30, "constrained": 30, "completion_tokens": 900, "errors": {}}
    results = {
        "server": {"ready_s": 61.0, "first_requests_s": {"free": 0.5}},
        "settings": {"concurrency": 64, "max_concurrency": 64},
        "pipeline": pipeline,
        "engine_stats": {**stats, "retried": {"timeout": 2}},
        "ceiling": ceiling,
        "ratios": gpu_check.over_ceiling(pipeline, ceiling),
        "shared_judge": gpu_check.shared_judge(pipeline, ceiling),
        "burst": {"requests": 6, "completion_tokens": 60, "seconds": 2.0, "valid": 6, "errors": {}},
    }
    rows = gpu_check.table_rows(results)
    assert rows["pipeline ÷ best ceiling (active span; while keys queued)"] == "0.833 (1.0; None)"
    assert rows["pipeline's answered tokens ÷ best ceiling"] == "0.75"
    assert rows["pipeline requests sent again"] == '{"timeout": 2}'
    assert rows["burst constrained validity"] == "6/6"
    # The judge makes 100 of 400 generated tokens: 0.25 × 5 tok/s = 1.25 tok/s per shard, and a
    # server's best 6 tok/s keeps up with 6 / 1.25 = 4.8 shards.
    assert rows["judge's share of generated / prompt tokens"] == "0.25 / 0.6"
    assert rows["shards one shared judge server keeps up with (generated tokens)"] == "4.8"
