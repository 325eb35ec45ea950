"""A lone surrogate (a JSON escape such as `\\ud800` in a server's reply or a model's JSON
answer) can be written nowhere: not in a record, a trace, a dialogue or a cache row. It is made
U+FFFD where text enters (an engine's answer, a constrained answer's parsed value, a search
backend's JSON), whatever the cache setting; a record that still cannot be written is its key's
`internal` failure, never a crash of the run and of every resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

import cts.eval.experiment
import tests.scripted_cts
from cts.eval.data.schema import Record
from cts.eval.experiment import run_experiment
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.runner import run_keys
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest, JsonSchemaOutput
from cts.webdancer.backends.web_search import SearxngSearch
from tests.fault_helpers import QuietHandler, loopback_server
from tests.scripted import dev_instances as instances
from tests.scripted_cts import scripted_engines

BAD = "\ud800"  # a high surrogate with no low one after it


def _surrogate_roles() -> dict[str, ScriptedEngine]:
    """The scripted roles, with a lone surrogate in the searcher's raw answer text and, as a
    JSON escape, in the clarifier's question and the judge's evidence (their parsed values)."""
    roles = scripted_roles()
    searcher, clarifier, judge = (roles[r].script for r in ("searcher", "clarifier", "judge"))

    def searching(request: ChatRequest) -> str:
        return searcher(request).replace("an answer", f"an answer {BAD}")

    def asking(request: ChatRequest) -> str:
        asked = json.loads(clarifier(request))
        return json.dumps({k: f"{v} {BAD}" for k, v in asked.items()})  # ensure_ascii: \ud800

    def judging(request: ChatRequest) -> str:
        labels = json.loads(judge(request))
        return json.dumps({i: {**v, "evidence": f"e {BAD}"} for i, v in labels.items()})

    roles["searcher"].script = searching
    roles["clarifier"].script = asking
    roles["judge"].script = judging
    return roles


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_a_lone_surrogate_in_model_text_is_recorded_as_u_fffd(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", _surrogate_roles)
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    resolved = load_experiment(
        "quickstart",
        [
            "dataset.limit=2",
            "conditions=[blurred, clarify@1]",
            f"cache.enabled={str(cache).lower()}",
            f"cache.path={tmp_path / 'responses.sqlite'}",
            f"search.tool_cache={tmp_path / 'tools.sqlite'}",
            "search.date=2026-11-30",
        ],
    )
    result = run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert result.outcome.ran == 4 and not result.outcome.failures, result.outcome
    records = list(RecordStore(tmp_path / "run").completed().values())
    for record in records:
        assert record.answer.endswith("an answer \ufffd")
        assert all(label["evidence"] == "e \ufffd" for label in record.labels.values())
        assert all(q.endswith(" \ufffd") for q in record.questions)
        trace = (tmp_path / "run" / "traces" / str(record.trace_id)).read_text()
        assert "\\ud800" not in trace and BAD not in trace
    assert any(r.questions for r in records)
    again = run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert again.outcome.ran == 0 and again.outcome.skipped == 4


def test_a_constrained_answers_parsed_value_holds_no_lone_surrogate():
    engine = ScriptedEngine(lambda r: '{"a": "x\\udc00", "\\ud83d": ["\\ud800"]}')
    spec = JsonSchemaOutput(json_schema={"type": "object"})
    response = asyncio.run(engine.chat(ChatRequest.of([{"role": "user", "content": "q"}], spec)))
    assert response.parsed == {"a": "x\ufffd", "\ufffd": ["\ufffd"]}


@pytest.fixture
def searxng_with_a_surrogate() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            hit = b'{"title": "T \\ud800", "url": "https://a.example/", "content": ""}'
            self.send_body(200, b'{"results": [' + hit + b"]}")

    with loopback_server(Handler) as url:
        yield url


def test_a_search_backends_lone_surrogate_becomes_u_fffd(searxng_with_a_surrogate):
    (hit,) = asyncio.run(SearxngSearch(searxng_with_a_surrogate).search("q", 3))
    assert hit.title == "T \ufffd"


def test_a_record_that_cannot_be_written_is_its_keys_internal_failure(tmp_path):
    """Whatever let a lone surrogate through, the run goes on and a resume skips the key."""
    good, bad = instances(2)

    async def run_one(instance, condition, seed):  # type: ignore[no-untyped-def]
        answer = BAD if instance.id == bad.id else "fine"
        return Record(instance_id=instance.id, condition=condition, seed=seed, answer=answer)

    store = RecordStore(tmp_path / "run")
    outcome = asyncio.run(run_keys([good, bad], ["blurred"], [0], run_one, store))
    assert outcome.ran == 2 and dict(outcome.failures) == {"internal": 1}
    records = {r.instance_id: r for r in store.completed().values()}
    assert records[good.id].answer == "fine" and records[good.id].error is None
    error = records[bad.id].error
    assert error is not None and (error["kind"], error["stage"]) == ("internal", "record")
    again = asyncio.run(run_keys([good, bad], ["blurred"], [0], run_one, store))
    assert again.ran == 0 and again.skipped == 2
