"""Replicas of a served model: each key's requests stay on one, a dead one's keys move to the
others, and a run whose replica dies mid-run still records every key."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.run.records import RecordStore
from cts.serving.errors import ServerUnreachable
from cts.serving.model_config import ModelConfig, build_engine
from cts.serving.openai_engine import OpenAIEngine
from cts.serving.replicas import Replicas, conversation
from cts.serving.scripted import scripted_engine
from cts.serving.types import ChatRequest
from cts.serving.vllm_server import free_port
from tests.builders import scripted_experiment
from tests.fault_helpers import QuietHandler

# -- where a request goes --------------------------------------------------------------------


def test_a_conversation_stays_on_its_replica_and_a_new_one_goes_to_the_least_loaded():
    replicas = Replicas(["http://a/v1", "http://b/v1/"])
    assert replicas.urls == ["http://a/v1", "http://b/v1"]
    with conversation("k1"):
        assert replicas.pick() == 0
        with conversation("k2"):  # k1 is bound to 0, so k2 goes to 1
            assert replicas.pick() == 1
            with conversation("k3"):  # one each: the lower index
                assert replicas.pick() == 0
                assert replicas.pick() == 0
            replicas.in_flight[1] = 5  # k3 ended; its binding with it
            gc.collect()
            assert replicas.load(0) == (1, 0) and replicas.load(1) == (1, 5)
            assert replicas.pick() == 1  # busy, but k2's: it stays
        assert replicas.pick() == 0
    assert replicas.pick() == 0  # no conversation: the least loaded, not bound


def test_round_robin_spreads_every_request():
    replicas = Replicas(["http://a", "http://b", "http://c"], routing="round_robin")
    with conversation("k"):
        assert [replicas.pick() for _ in range(4)] == [0, 1, 2, 0]


def test_a_replica_found_down_loses_its_conversations_but_the_last_live_one_is_kept():
    replicas = Replicas(["http://a", "http://b"])
    with conversation("k"):
        assert replicas.pick() == 0
        assert replicas.mark_down(0) is True
        assert replicas.pick() == 1 and replicas.moved == 1
        assert replicas.mark_down(1) is False  # no other replica to move to
    assert replicas.found_down() == "replica(s) found down: http://a (1 keys moved to the others)"
    assert Replicas(["http://a"]).mark_down(0) is False


# -- the openai engine against two loopback replicas ------------------------------------------


@dataclass
class Replica:
    """A loopback OpenAI-compatible server answering as a scripted role; it keeps the key
    marker of each request it served and closes its port once it has served `die_after`."""

    name: str
    role: str = "judge"
    die_after: int | None = None
    served: list[str] = field(default_factory=list)
    url: str = ""


def answer(engine_reply: str, body: dict) -> dict:
    return {
        "choices": [{"message": {"role": "assistant", "content": engine_reply}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "model": body["model"],
    }


@contextmanager
def replicas(*specs: Replica) -> Iterator[list[Replica]]:
    servers = []
    for spec in specs:
        script = scripted_engine(spec.name, script=spec.role)

        class Handler(QuietHandler):
            replica, engine, lock = spec, script, threading.Lock()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = ChatRequest.of(body["messages"])
                if "structured_outputs" in body:  # the scripted role reads the constraint
                    request = request.model_copy(update={"output": _output(body)})
                text = asyncio.run(self.engine.chat(request)).text
                self.send_json(200, answer(text, body))
                with self.lock:
                    self.replica.served.append(body["messages"][-1]["content"][:40])
                    dying = len(self.replica.served) == self.replica.die_after
                if dying:  # the port closes: later connections are refused
                    threading.Thread(target=_close, args=(self.server,)).start()

        from http.server import ThreadingHTTPServer

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        spec.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        servers.append(httpd)
    try:
        yield list(specs)
    finally:
        for httpd in servers:
            _close(httpd)


def _close(httpd) -> None:
    httpd.shutdown()
    httpd.server_close()


def _output(body: dict):
    from cts.serving.types import ChoiceOutput, JsonSchemaOutput, RegexOutput

    spec = body["structured_outputs"]
    if "json" in spec:
        return JsonSchemaOutput(name="out", json_schema=spec["json"])
    if "choice" in spec:
        return ChoiceOutput(choices=tuple(spec["choice"]))
    return RegexOutput(pattern=spec["regex"])


def echo_request(marker: str) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": marker}])


def test_each_key_s_requests_reach_one_replica_and_keys_are_spread_evenly():
    with replicas(Replica("a", role="summarizer"), Replica("b", role="summarizer")) as (a, b):
        engine = OpenAIEngine("m", [a.url, b.url])

        async def key(name: str) -> None:
            with conversation(name):
                for turn in range(3):
                    await engine.chat(echo_request(f"{name} turn {turn}"))

        async def run() -> None:
            await asyncio.gather(*(key(f"key{i}") for i in range(6)))
            await engine.aclose()

        asyncio.run(run())
    by_key = {s.split()[0]: {r.name for r in (a, b) if s in r.served} for s in a.served + b.served}
    assert all(len(where) == 1 for where in by_key.values()), by_key
    assert len(a.served) == len(b.served) == 9  # 3 keys of 3 turns each
    assert engine.stats.replicas is engine.replicas and engine.replicas.sent == [9, 9]


def test_a_replica_that_is_down_sends_its_keys_to_the_other_without_a_failure():
    with replicas(Replica("b", role="summarizer")) as (b,):
        dead = f"http://127.0.0.1:{free_port()}/v1"
        engine = OpenAIEngine("m", [dead, b.url], backoff_s=0.01)

        async def run() -> None:
            for i in range(3):
                with conversation(f"key{i}"):
                    await engine.chat(echo_request(f"key{i}"))
            await engine.aclose()

        asyncio.run(run())
    assert len(b.served) == 3 and engine.replicas.down == {0}
    assert engine.stats.retried == {"replica down": 1} and not engine.stats.errors
    # Both down: a dead server, as with one endpoint (it stops the run).
    lone = OpenAIEngine("m", [dead, f"http://127.0.0.1:{free_port()}/v1"], max_retries=1)
    lone.backoff_s = 0.01
    with pytest.raises(ServerUnreachable):
        asyncio.run(lone.chat(echo_request("x")))


def test_a_model_config_lists_its_replicas_and_their_routing():
    config = ModelConfig(
        name="m", path="p", engine="openai", endpoint=["http://a/v1", "http://b/v1"]
    )
    engine = build_engine(config)
    assert isinstance(engine, OpenAIEngine) and engine.replicas.urls == config.endpoint
    spread = build_engine(config.model_copy(update={"routing": "round_robin"}))
    assert isinstance(spread, OpenAIEngine) and spread.replicas.routing == "round_robin"
    with pytest.raises(ValueError, match="empty list"):
        ModelConfig(name="m", path="p", engine="openai", endpoint=[])


# -- a whole run whose replica dies in the middle ----------------------------------------------


def test_a_run_whose_replica_dies_mid_run_records_every_key(tmp_path: Path, monkeypatch):
    """The searcher on two replicas; one closes its port after its 4th answer (a point of
    progress, not a time). Every key is recorded without an error, the keys on the dead
    replica finish on the other, and the run's output names the replica found down."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    with replicas(Replica("a", "searcher", die_after=4), Replica("b", "searcher")) as (a, b):
        config = _experiment(tmp_path, [a.url, b.url])
        result = CliRunner().invoke(
            app, ["run", "-c", str(config), "--output-dir", str(tmp_path / "run")]
        )
    assert result.exit_code == 0, result.output
    records = RecordStore(tmp_path / "run").completed()
    assert len(records) == 2 * 3 and all(r.error is None for r in records.values())
    assert len(a.served) >= 4 and b.served
    assert f"replica(s) found down: {a.url}" in " ".join(result.output.split())


def _experiment(tmp_path: Path, urls: list[str]) -> Path:
    searcher = {
        "name": "searcher",
        "path": "none",
        "engine": "openai",
        "endpoint": urls,
        "max_retries": 2,
        "vllm": {"serve": False},
    }
    return scripted_experiment(
        tmp_path / "experiment.yaml",
        "replicas",
        ("clarifier", "user_answerer", "rewriter", "summarizer", "judge"),
        {"searcher": searcher},
        {"searcher": "searcher"},
        conditions=["blurred", "oracle", "clarify@1"],
        seeds=[0],
        cache={"enabled": False},
    )
