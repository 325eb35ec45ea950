"""The oracle is never the golden run: golden construction's requests (response cache and the
visits' summaries in the tool cache) are never served to an evaluation run, whatever the
sampling; and a greedy searcher on golden construction's model is named in the report, because
a fresh greedy run decodes the very trajectory the nuggets came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.schema import Golden, GoldenSearcher, Instance, Nugget
from cts.eval.run.config import load_experiment
from cts.eval.run.oracle import oracle_independence
from cts.serving.scripted import scripted_roles
from cts.serving.types import ChatRequest
from tests.builders import scripted_cli, search_then_visit

runner = CliRunner()

#: Every sampled role greedy, as the real models are often run: `Sampling.with_seed` then keeps
#: the fixed seed, so golden construction (seed 1000) and the oracle (seed 0) send the very
#: same searcher and summarizer requests.
GREEDY = [
    "--set",
    "roles.searcher.sampling.temperature=0",
    "--set",
    "roles.summarizer.sampling.temperature=0",
    "--set",
    "search.date=2026-11-30",
]


def _question(request: ChatRequest) -> str:
    """The start of the question the searcher was asked."""
    return request.messages[1].content.rsplit("User: ", 1)[1][:60]


def _search_then_visit(request: ChatRequest) -> str:
    """Search the question, visit the first hit, then answer."""
    return search_then_visit(request, _question)


def _visiting_roles():  # type: ignore[no-untyped-def]
    roles = scripted_roles()
    roles["searcher"].script = _search_then_visit
    return roles


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real command line, every role on a scripted engine behind the real response cache
    and tool cache (both shared under $CTS_HOME, as by default)."""
    return scripted_cli(tmp_path, monkeypatch, _visiting_roles)


def _records(run_dir: Path, condition: str) -> list[dict]:
    path = run_dir / "records" / condition / "shard-0-of-1.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cached_visits(run_dir: Path, condition: str) -> int:
    return sum(
        1
        for trace in (run_dir / "traces" / condition).glob("*.json")
        for step in json.loads(trace.read_text())["steps"]
        if step.get("kind") == "tool" and step.get("tool") == "visit" and step.get("cached")
    )


def test_a_greedy_oracle_is_never_served_from_golden_constructions_requests(scripted):
    golden, run = scripted / "golden", scripted / "run"
    built = runner.invoke(
        app, ["golden", "build", "--limit", "2", "--output-dir", str(golden), *GREEDY]
    )
    assert built.exit_code == 0, built.output
    assert all(r["usage"]["searcher_calls"] > 0 for r in _records(golden, "golden"))
    args = ["run", "--output-dir", str(run), "--set", "conditions=[oracle]"]
    args += ["--set", f"dataset.path={golden / 'dataset.jsonl'}", "--set", "dataset.split=null"]
    ran = runner.invoke(app, [*args, *GREEDY])
    assert ran.exit_code == 0, ran.output
    oracle = _records(run, "oracle")
    assert len(oracle) == 2 and all(r["error"] is None for r in oracle)
    # Counted: the searcher's and the summarizer's calls of the oracle that the response cache
    # answered (it held only golden construction's entries), and visits replayed from the tool
    # cache. Before the fix every one of them came out of golden construction's entries.
    searched = sum(r["usage"]["searcher_calls"] for r in oracle)
    assert searched > 0
    assert sum(r["usage"].get("searcher_cached_calls", 0) for r in oracle) == 0
    assert sum(r["usage"].get("summarizer_cached_calls", 0) for r in oracle) == 0
    assert sum(r["usage"]["summarizer_calls"] for r in oracle) > 0
    assert _cached_visits(run, "oracle") == 0
    # The same greedy searcher model as golden construction: the report says why the oracle
    # column is no independent upper bound.
    report = (run / "report.md").read_text()
    assert "the oracle repeats golden construction" in report
    summary = json.loads((run / "summary.json").read_text())
    (system,) = summary["systems"].values()
    assert system["oracle_independence"]["repeats_golden"] is True


def _instance(searcher: GoldenSearcher | None, trace_id: str | None = "golden/x.json") -> Instance:
    nugget = Nugget(id="n1", text="A fact.", weight=3)
    golden = Golden(nuggets=[nugget], trace_id=trace_id, seed=1000, searcher=searcher)
    return Instance(id="q1", blurred_query="q", fused_query="q*", golden=golden)


@pytest.mark.parametrize(
    ("temperature", "golden", "expected"),
    [
        # The quickstart's searcher (the tiny model's searcher adapter) is greedy.
        (0.0, GoldenSearcher(model="smollm2-135m-searcher", temperature=0), True),
        (0.6, GoldenSearcher(model="smollm2-135m-searcher", temperature=0), False),
        (0.0, GoldenSearcher(model="smollm2-135m-searcher", temperature=0.6), False),
        (0.0, GoldenSearcher(model="smollm2-135m-instruct", temperature=0), False),
        (0.0, GoldenSearcher(model="webdancer-32b", temperature=0), False),
        (0.0, None, None),  # built before the searcher was recorded: cannot tell
    ],
)
def test_the_oracle_repeats_golden_construction_only_greedy_on_its_model(
    temperature, golden, expected
):
    resolved = load_experiment(None, [f"roles.searcher.sampling.temperature={temperature}"])
    found = oracle_independence(resolved, [_instance(golden)])
    assert found is not None and found["repeats_golden"] is expected, found
    # Nuggets that no search run gave (a hand-made gold table) cannot be repeated.
    hand_made = oracle_independence(resolved, [_instance(golden, trace_id=None)])
    assert hand_made is not None and hand_made["repeats_golden"] is False
    no_oracle = load_experiment(None, ["conditions=[blurred]"])
    assert oracle_independence(no_oracle, [_instance(golden)]) is None
