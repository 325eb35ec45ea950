"""`cts estimate`: a pilot through the real pipeline on scripted engines whose every call costs
a fixed, known number of tokens, so that each extrapolated total can be counted by hand; the
`--from-run` path, the shard arithmetic, an unknown throughput, and what the command prints."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.cost import ModelRow, held_servers, search_queries, shards_for, tool_figures
from cts.eval.data.schema import Record
from cts.eval.estimate import estimate
from cts.eval.pilot import default_pilot_dir, pilot_overrides
from cts.eval.run.config import load_experiment
from cts.eval.run.fingerprint import fingerprint
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir
from cts.eval.run.usage import charged_to_key, metered, role_usage
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest, ChatResponse, Usage
from tests.builders import cts, scripted_cli

runner = CliRunner()

#: (prompt, generated) tokens of every call of a role: round numbers to count with.
COST = {
    "clarifier": (10, 1),
    "user_answerer": (20, 2),
    "rewriter": (30, 3),
    "searcher": (40, 4),
    "summarizer": (60, 6),
    "judge": (50, 5),
    "question_classifier": (70, 7),
    "nugget_builder": (80, 8),
}
MODEL = "smollm2-135m-instruct"


class FixedCost(ScriptedEngine):
    """A scripted role whose every answer reports the role's COST."""

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        response = await super()._complete(request)
        prompt, generated = COST[self.model]
        return response.model_copy(
            update={"usage": Usage(prompt_tokens=prompt, completion_tokens=generated)}
        )


def fixed_cost_roles() -> dict[str, ScriptedEngine]:
    return {role: FixedCost(e.script, name=role) for role, e in scripted_roles().items()}


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every role on a FixedCost engine, $CTS_HOME in tmp_path; the folder to work in."""
    monkeypatch.setenv("COLUMNS", "250")
    return scripted_cli(tmp_path, monkeypatch, fixed_cost_roles)


#: The sweep: the whole sample dev split (24 instances) × 5 conditions × seed 0 = 120 keys.
#: The response cache is off, so that every request reaches its engine and is counted.
# The hand count below leaves out the judge's canary (judge.canary: one more judge call on the
# records its hash draws); tests/eval/audit/test_judge_canary.py counts those. The judge is the tiny
# model, as in any sweep with a model judge (the quickstart's lexical judge calls no model),
# and so are the User Answerer, Rewriter and searcher (not their adapters): one model, one
# server row, and the base searcher's three grammar-constrained calls a run.
ONE_MODEL = [
    arg
    for role in ("judge", "user_answerer", "rewriter", "searcher")
    for arg in ("--set", f"roles.{role}.model={MODEL}")
]
SWEEP = [
    *ONE_MODEL,
    "--set",
    "dataset.limit=null",
    "--set",
    "cache.enabled=false",
    "--set",
    "judge.canary.enabled=false",
]
PRICED = [
    "--set",
    "search.price_per_call=0.001",
    "--set",
    f"models.{MODEL}.throughput_tokens_per_s=0.01",
    "--set",
    f"models.{MODEL}.vllm.tensor_parallel_size=2",
]


def pilot(work: Path, *more: str):
    """`cts estimate --pilot 2` of the sweep into work/pilot, the estimate in work/e.json."""
    return cts(
        "estimate",
        "--pilot",
        "2",
        "--pilot-dir",
        str(work / "pilot"),
        "--out",
        str(work / "e.json"),
        *SWEEP,
        *more,
    )


def table_rows(output: str) -> list[list[str]]:
    """The cells of every row of the tables printed."""
    return [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in output.splitlines()
        if line.startswith("│")
    ]


def row(found: dict, role: str) -> dict:
    (match,) = [r for r in found["roles"] if r["role"] == role]
    return match


# Per instance of the pilot (drawn with seed 0: A-dev-03 and C-dev-04, English, 5 nuggets
# each), every condition:
#   clarifier      3 calls   one sequential dialogue of k_max = 3 turns (question types by
#   user_answerer  3 calls   keywords: no call), shared by clarify@1..3
#   rewriter       3 calls   one per clarify@k key
#   searcher      10 calls   2 per key: a search call, then the answer (no visit)
#   judge          5 calls   1 per key: 5 nuggets fit in one batch of 10
#   summarizer     0 calls   the scripted searcher never visits
#   all           24 calls; prompt 3·10 + 3·20 + 3·30 + 10·40 + 5·50 = 830 tokens;
#                 generated 3·1 + 3·2 + 3·3 + 10·4 + 5·5 = 83 tokens
# Both instances cost the same, so the interval is the point. The sweep has 24 instances:
#   calls 24·24 = 576, prompt 830·24 = 19,920, generated 83·24 = 1,992 tokens;
#   per key (5 keys an instance): 4.8 calls, 166 prompt and 16.6 generated tokens.
# Search: 1 query a key → 5·24 = 120 calls, at $0.001 = $0.12; visits 0.
# Hours at 0.01 generated tok/s: 1,992 / 0.01 / 3600 = 55.33 server-hours, × 2 GPUs a server
# = 110.67 GPU-hours; shards for 24 h: ceil(55.33 / 24) = 3.


def test_a_pilot_of_two_instances_gives_the_hand_counted_sweep(scripted):
    result = pilot(scripted, *PRICED)
    assert result.exit_code == 0, result.output
    found = json.loads((scripted / "e.json").read_text())
    assert (found["pilot_instances"], found["pilot_keys"]) == (2, 10)
    assert (found["sweep_instances"], found["sweep_keys"]) == (24, 120)
    expected = {  # role: (calls per instance, prompt, generated per call)
        "clarifier": (3, 10, 1),
        "user_answerer": (3, 20, 2),
        "rewriter": (3, 30, 3),
        "searcher": (10, 40, 4),
        "summarizer": (0, 60, 6),
        "judge": (5, 50, 5),
    }
    assert [r["role"] for r in found["roles"]] == list(expected)
    for role, (calls, prompt, generated) in expected.items():
        got = row(found, role)
        assert got["calls"]["total"] == calls * 24, role
        assert got["calls"]["per_key"] == pytest.approx(calls / 5), role
        assert got["prompt_tokens"]["total"] == calls * prompt * 24, role
        assert got["completion_tokens"]["total"] == calls * generated * 24, role
        assert got["pilot_cached_calls"] == 0
    assert found["calls"] == {"per_key": 4.8, "total": 576, "low": 576, "high": 576}
    assert found["prompt_tokens"]["total"] == 19_920
    assert found["prompt_tokens"]["per_key"] == pytest.approx(166)
    assert found["completion_tokens"]["total"] == 1_992
    search, visit = found["tools"]
    assert (search["tool"], search["calls"]["total"], search["price"]) == ("search", 120, 0.001)
    assert search["cost"]["total"] == pytest.approx(0.12)
    assert (visit["tool"], visit["calls"]["total"], visit["cost"]) == ("visit", 0, None)
    (model,) = found["models"]
    assert model["completion_tokens"]["total"] == 1_992
    assert model["server_hours"]["total"] == pytest.approx(55.333, abs=1e-3)
    assert model["gpu_hours"]["total"] == pytest.approx(110.667, abs=1e-3)
    assert (model["gpus_per_server"], model["shards"], found["shards"]) == (2, 3, 3)
    # Per condition: blurred and oracle are a search (2 calls) and a judge call (1); the
    # clarify@k keys share the dialogue (6 calls) and each rewrites (1), searches (2) and is
    # judged (1): 6 + 3·4 = 18 calls over the three.
    by = {c["condition"]: c for c in found["by_condition"]}
    for condition in ("blurred", "oracle"):
        assert by[condition]["calls"] == 3
        assert by[condition]["prompt_tokens"] == 2 * 40 + 50
        assert by[condition]["completion_tokens"] == 2 * 4 + 5
    assert sum(by[f"clarify@{k}"]["calls"] for k in (1, 2, 3)) == 18
    assert all(c["search_calls"] == 1 and c["sweep_keys"] == 24 for c in by.values())

    # What it printed: the header, the role table's totals, the servers, the suggestion.
    out = result.output
    assert "pilot of quickstart on 2 of the sweep's 24 instances, a sample stratified" in out
    assert "10 records written, 0 already done, 0 failed; 48 model calls" in out
    assert "24 instances × 5 conditions × 1 seed(s) = 120 keys" in out
    assert "a pilot of 2 instance(s) (10 keys)" in out
    rows = {cells[0]: cells for cells in table_rows(out)}
    assert rows["clarifier"][1:] == [MODEL, "0.6", "6.0", "0.6", "72", "720", "72"]
    assert rows["all"][1:] == ["", "4.8", "166.0", "16.6", "576", "19.9k", "1.99k"]
    assert rows[MODEL][1:] == [
        "clarifier, user_answerer, rewriter, searcher, summarizer, judge",
        "1.99k",
        "0.01",
        "55.3",
        "2",
        "1",
        "111",
        "3 (≤ 3)",
    ]
    assert "19.9k" in out and "1.99k" in out
    assert "search calls (one per query): 120; cost $0.12 at $0.001 each" in out
    assert "pages visited: 0; no price (search.price_per_visit)" in out
    assert "suggested: --shards 3 for about 24 h of wall time per shard" in out

    # The records say what the traces say: each key's searcher calls are its trace's model
    # steps; dialogue calls of clarify@k are in the records, never in blurred's.
    run = RunDir(scripted / "pilot")
    for record in RecordStore(run.root).completed().values():
        trace = json.loads((run.traces / str(record.trace_id)).read_text())
        searcher = role_usage(record.usage, "searcher")
        assert searcher is not None
        assert searcher.calls == sum(s["kind"] == "llm" for s in trace["steps"]) == 2
        if record.condition in ("blurred", "oracle"):
            assert role_usage(record.usage, "clarifier") is None


def test_a_second_estimate_resumes_the_pilot_and_calls_no_model(scripted):
    assert pilot(scripted, *PRICED).exit_code == 0
    first = json.loads((scripted / "e.json").read_text())
    again = pilot(scripted, *PRICED)
    assert again.exit_code == 0, again.output
    assert "0 records written, 10 already done, 0 failed; 0 model calls" in again.output
    assert json.loads((scripted / "e.json").read_text()) == first


def test_replicas_divide_the_shards_and_multiply_the_gpus_a_shard_holds(scripted):
    """The pilot above read back with the model at `vllm.replicas: 2`. By hand: 55.33
    server-hours of work (unchanged: 110.67 GPU-hours busy); a shard's 2 servers do 48
    server-hours in 24 h, so ceil(55.33 / 48) = 2 shards (3 with one server each). Each shard
    holds 2 servers × 2 GPUs = 4 GPUs for 24 h: 2 · 24 · 4 = 192 GPU-hours per task (with
    replicas ignored: 2 · 24 · 2 = 96). Shared, one job holds the ceil(55.33 / 24) = 3 servers
    the work needs: 3 · 24 · 2 = 144."""
    assert pilot(scripted).exit_code == 0
    out = scripted / "r2.json"
    replicas = ["--set", f"models.{MODEL}.vllm.replicas=2"]
    result = cts(
        "estimate", "--from-run", str(scripted / "pilot"), *SWEEP, *PRICED, *replicas,
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    (model,) = found["models"]
    assert (model["replicas"], model["gpus_per_server"]) == (2, 2)
    assert model["server_hours"]["total"] == pytest.approx(55.333, abs=1e-3)
    assert model["gpu_hours"]["total"] == pytest.approx(110.667, abs=1e-3)
    assert (model["shards"], model["shards_high"], found["shards"]) == (2, 2, 2)
    assert model["servers"] == 3
    (held,) = found["held"]
    assert (held["per_task_gpu_hours"], held["shared_gpu_hours"]) == (192, 144)
    (server,) = [cells for cells in table_rows(result.output) if cells[0] == MODEL]
    assert server[5:] == ["2", "2", "111", "2 (≤ 2)"]  # GPUs/server, servers/shard
    out_text = " ".join(result.output.split())
    assert "suggested: --shards 2 for about 24 h" in out_text
    assert "each shard running every model on its vllm.replicas servers" in out_text
    assert (
        "GPU-hours held by the servers at --shards 2: 192 with every shard serving every model "
        f"for 24 h (per shard: {MODEL} 2 server(s) × 2 GPU(s)); 144 with --shared-servers"
    ) in out_text
    # `auto` copies as many as the node fits, unknown here: counted as one, and said so.
    auto = cts(
        "estimate", "--from-run", str(scripted / "pilot"), *SWEEP, *PRICED,
        "--set", f"models.{MODEL}.vllm.replicas=auto", "--out", str(out),
    )  # fmt: skip
    assert auto.exit_code == 0, auto.output
    assert json.loads(out.read_text())["shards"] == 3
    assert f"vllm.replicas is auto for {MODEL}: counted as one server" in auto.output


def test_from_run_with_an_unknown_throughput_says_unknown(scripted):
    assert pilot(scripted).exit_code == 0
    # The same pilot read back for a sweep of 12 instances: every total halves; no
    # throughput and no price are configured.
    result = cts(
        "estimate",
        "--from-run",
        str(scripted / "pilot"),
        "--set",
        "dataset.limit=12",
        *ONE_MODEL,
        "--out",
        str(scripted / "half.json"),
    )
    assert result.exit_code == 0, result.output
    found = json.loads((scripted / "half.json").read_text())
    assert found["calls"]["total"] == 24 * 12 and found["completion_tokens"]["total"] == 83 * 12
    (model,) = found["models"]
    assert model["throughput_tokens_per_s"] is None
    assert model["server_hours"] is model["gpu_hours"] is model["shards"] is None
    assert found["shards"] is None
    assert found["tools"][0]["cost"] is None
    out = result.output
    assert "records written" not in out  # nothing ran
    assert "12 instances × 5 conditions × 1 seed(s) = 60 keys" in out
    assert "suggested --shards: unknown (no model has a throughput_tokens_per_s)" in out
    assert f"note: hours unknown for {MODEL}: set throughput_tokens_per_s" in out
    assert "no price (search.price_per_call)" in out
    (server,) = [cells for cells in table_rows(out) if cells[0] == MODEL]
    assert server[3:] == ["unknown", "unknown", "1", "1", "unknown", "unknown"]


def test_from_run_of_records_without_role_usage_knows_the_searcher_only(scripted):
    """Records made before each role's calls were recorded: the searcher's come from the
    traces, every other role is `not recorded`."""
    assert pilot(scripted).exit_code == 0
    old = scripted / "old"
    shutil.copytree(scripted / "pilot", old)
    store = RecordStore(old)
    for path in store.all_files():
        lines = []
        for record in store.read(path):
            record.usage = {k: v for k, v in record.usage.items() if k.startswith("search_")}
            lines.append(record.model_dump_json())
        path.write_text("\n".join(lines) + "\n")
    result = cts("estimate", "--from-run", str(old), *SWEEP, "--out", str(scripted / "o.json"))
    assert result.exit_code == 0, result.output
    found = json.loads((scripted / "o.json").read_text())
    assert row(found, "searcher")["calls"]["total"] == 10 * 24
    assert row(found, "searcher")["completion_tokens"]["total"] == 10 * 4 * 24
    assert row(found, "judge")["calls"] is None and found["calls"] is None
    assert found["tools"][0]["calls"]["total"] == 120
    assert "not recorded" in result.output
    assert "only the searcher's are known" in result.output


def test_from_run_without_the_sweeps_keys_is_refused(scripted):
    assert pilot(scripted).exit_code == 0
    result = runner.invoke(
        app, ["estimate", "--from-run", str(scripted / "pilot"), "--set", "seeds=[0,1]"]
    )
    assert result.exit_code == 2
    assert "no records of seed 1, which the sweep runs" in result.output
    missing = runner.invoke(app, ["estimate", "--from-run", str(scripted / "nothing")])
    assert missing.exit_code == 2 and "not a run directory" in missing.output


def test_bad_options_exit_2(scripted):
    zero = runner.invoke(app, ["estimate", "--target-hours", "0", "--from-run", "x"])
    assert zero.exit_code == 2 and "--target-hours 0.0: expected hours > 0" in zero.output
    both = runner.invoke(app, ["estimate", "--from-run", "x", "--pilot", "3"])
    assert both.exit_code == 2 and "give no --pilot" in both.output
    assert not (scripted / "home").exists()


@pytest.mark.parametrize("hours", ["inf", "nan", "-1"])
def test_a_target_that_is_no_finite_positive_number_exits_2(hours):
    result = runner.invoke(app, ["estimate", "--target-hours", hours, "--from-run", "x"])
    assert result.exit_code == 2 and "expected hours > 0" in result.output, result.output


@pytest.mark.parametrize("hours", ["5e-324", "1e-300"])
def test_a_tiny_target_suggests_one_shard_per_instance_at_most(scripted, hours):
    """5e-324 divided a sweep's hours into inf (OverflowError); 1e-300 suggested 3.6e287
    shards. A shard runs whole instances: the suggestion stops at the sweep's instance count."""
    assert pilot(scripted).exit_code == 0
    out = scripted / f"tiny-{hours}.json"
    result = cts(
        "estimate", "--from-run", str(scripted / "pilot"), "--target-hours", hours,
        "--set", "dataset.limit=12", *ONE_MODEL, *PRICED, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    assert found["sweep_instances"] == 12 and found["shards"] == 12
    assert all(m["shards"] == m["shards_high"] == 12 for m in found["models"])


def test_the_default_pilot_is_inside_the_sweeps_run_directory(tmp_path):
    """Not beside it, where `cts report runs/quickstart*` would read it as a system; its
    caches are its own, so that no earlier run answers its calls."""
    sweep = load_experiment(None)
    assert default_pilot_dir(sweep) == Path("runs/quickstart/estimate-pilot")
    overrides = {o.keys: o.value for o in pilot_overrides(sweep, tmp_path / "p")}
    assert overrides == {
        # The drawn instances (cts/eval/pilot.py), a dataset of the pilot's own.
        ("dataset",): {"path": str(tmp_path / "p" / "pilot.jsonl"), "split": None, "corpus": None},
        ("cache", "path"): str(tmp_path / "p" / "cache" / "responses.sqlite"),
        ("search", "tool_cache"): str(tmp_path / "p" / "cache" / "tools.sqlite"),
    }
    offline = load_experiment(None, ["search.offline=true", "dataset.limit=null"])
    kept = {o.keys: o.value for o in pilot_overrides(offline, tmp_path / "p")}
    assert ("search", "tool_cache") not in kept


# -- the arithmetic, without a run ------------------------------------------------------------


def test_shards_are_the_ceiling_of_server_hours_over_the_target():
    assert shards_for(55.33, 24) == 3  # 2.31 → 3
    assert shards_for(48.0, 24) == 2  # exactly 2: no third shard
    assert shards_for(48.01, 24) == 3
    assert shards_for(0.0, 24) == 1  # at least one shard
    assert shards_for(100, 10) == 10
    with pytest.raises(ValueError):
        shards_for(1.0, 0)
    assert shards_for(1e6, 1, most=40) == 40  # a shard runs whole instances
    assert shards_for(1.0, 5e-324, most=40) == 40  # 1 / 5e-324 is inf
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError):
            shards_for(1.0, bad, most=40)


def test_held_gpu_hours_per_task_and_shared_by_hand():
    """16 shards of 24 h: the searcher (2 GPUs a server) needs all 16; the judge (4 GPUs)
    only 3 servers' worth of work. Per task every shard holds both: 16·24·2 = 768 and
    16·24·4 = 1536 GPU-hours; shared, the judge's job holds 3·24·4 = 288."""

    def row(name: str, gpus: int, shards: int | None) -> ModelRow:
        return ModelRow(name, name, [], None, None, gpus, None, None, shards, shards)

    rows = [row("searcher", 2, 16), row("judge", 4, 3), row("unknown", 1, None)]
    held = {h.model: (h.per_task_gpu_hours, h.shared_gpu_hours) for h in held_servers(rows, 16, 24)}
    assert held == {"searcher": (768, 768), "judge": (1536, 288)}
    # The searcher at 2 replicas: its work needs 16 servers, 8 shards of 2. At 16 shards every
    # shard holds 2 servers × 2 GPUs: 16·24·4 = 1536; shared, the 16 servers: 16·24·2 = 768.
    two = replace(row("searcher", 2, 8), replicas=2, servers=16)
    (searcher,) = held_servers([two], 16, 24)
    assert (searcher.per_task_gpu_hours, searcher.shared_gpu_hours) == (1536, 768)


def test_search_calls_are_distinct_queries_up_to_the_limit():
    assert search_queries({"query": ["a", "b", "a", " "]}, max_queries=3) == 2
    assert search_queries({"query": ["a", "b", "c", "d"]}, max_queries=3) == 3
    assert search_queries({"queries": "one"}, max_queries=3) == 1
    assert search_queries({"q": "malformed"}, max_queries=3) == 0
    trace = {
        "steps": [
            {"kind": "llm", "cached": False},
            {"kind": "tool", "tool": "search", "arguments": {"query": ["a", "b"]}},
            {"kind": "tool", "tool": "search", "arguments": {"query": ["c"]}, "cached": True},
            {"kind": "tool", "tool": "visit", "arguments": {}, "urls": ["u1", "u2"]},
            {"kind": "protocol_error", "message": "?"},
        ]
    }
    assert tool_figures(trace, max_queries=3) == {
        "search:calls": 2,
        "search:replayed": 1,
        "visit:calls": 2,
        "visit:replayed": 0,
    }
    assert tool_figures(None, max_queries=3)["search:calls"] == 0


def _record(instance: str, searcher_calls: int) -> Record:
    return Record(
        instance_id=instance,
        condition="blurred",
        seed=0,
        usage={
            "searcher_calls": searcher_calls,
            "searcher_cached_calls": 0,
            "searcher_prompt_tokens": 100 * searcher_calls,
            "searcher_completion_tokens": 10 * searcher_calls,
        },
    )


def test_the_interval_is_a_bootstrap_over_the_pilots_instances():
    sweep = load_experiment(None, ["conditions=[blurred]"])
    # Two instances of 1 and 3 searcher calls: mean 2, so 20 for 10 instances. A resample of
    # two instances has mean 1, 2 or 3 (probability 1/4, 1/2, 1/4): totals 10, 20, 30, and the
    # 2.5% and 97.5% points are 10 and 30.
    found = estimate([_record("a", 1), _record("b", 3)], {}, sweep, 10, source="pilot")
    (searcher,) = [r for r in found.roles if r.role == "searcher"]
    assert searcher.calls is not None
    assert (searcher.calls.per_key, searcher.calls.total) == (2, 20)
    assert (searcher.calls.low, searcher.calls.high) == (10, 30)
    assert found.completion_tokens is not None and found.completion_tokens.high == 300
    # The same pilot gives the same interval (a fixed seed).
    assert (
        estimate([_record("a", 1), _record("b", 3)], {}, sweep, 10, source="p").calls == found.calls
    )
    # One instance: the point, and a note that there is no interval.
    alone = estimate([_record("a", 3)], {}, sweep, 10, source="pilot")
    assert alone.calls is not None and alone.calls.low == alone.calls.high == 30
    assert any("no interval" in note for note in alone.notes)


def test_a_call_is_charged_to_the_key_and_role_it_was_made_for():
    engine = FixedCost(lambda request: "ok", name="judge")
    judge, rewriter = metered(engine, "judge"), metered(engine, "rewriter")
    assert metered(judge, "judge").inner is engine  # never wrapped twice
    request = ChatRequest.of([{"role": "user", "content": "q"}], seed=0)

    async def key(calls: int) -> dict[str, int]:
        with charged_to_key() as used:
            for _ in range(calls):
                await judge.chat(request)
            await rewriter.chat(request)
            return used.fields()

    async def both() -> list[dict[str, int]]:
        return list(await asyncio.gather(key(2), key(1)))

    two, one = asyncio.run(both())
    assert two["judge_calls"] == 2 and two["judge_prompt_tokens"] == 100
    assert one["judge_calls"] == 1 and one["judge_completion_tokens"] == 5
    assert two["rewriter_calls"] == one["rewriter_calls"] == 1
    assert engine.stats.calls == 5  # the engine's own count is untouched

    class Cached(FixedCost):
        async def chat(self, request: ChatRequest) -> ChatResponse:
            return ChatResponse(text="x", usage=Usage(prompt_tokens=9), cached=True)

    async def cached() -> dict[str, int]:
        with charged_to_key() as used:
            await metered(Cached(lambda r: "x", name="judge"), "judge").chat(request)
            return used.fields()

    # A cached answer is a request but no model work: no tokens.
    assert asyncio.run(cached()) == {
        "judge_calls": 0,
        "judge_cached_calls": 1,
        "judge_prompt_tokens": 0,
        "judge_completion_tokens": 0,
    }
    # Outside a key (a model check) nothing is charged and nothing fails.
    asyncio.run(judge.chat(request))


def test_prices_and_throughput_do_not_stop_a_run_from_resuming(tmp_path):
    """A run directory written before these keys existed resumes, and so does one whose
    price or throughput is changed: they change no record."""
    resolved = load_experiment(None)
    run = RunDir(tmp_path)
    digest = fingerprint([])
    run.write_config(resolved, digest)
    doc = yaml.safe_load(run.config.read_text())
    for key in ("price_per_call", "price_per_visit"):
        del doc["experiment"]["search"][key]  # as an older version wrote it
    run.config.write_text(yaml.safe_dump(doc))
    run.check_resume(resolved, digest)
    changed = load_experiment(
        None,
        ["search.price_per_call=0.002", f"models.{MODEL}.throughput_tokens_per_s=1500"],
    )
    run.check_resume(changed, digest)
