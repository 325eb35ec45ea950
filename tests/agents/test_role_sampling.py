"""Every role's final sampling, pinned end to end.

Response-cache keys hash the exact Sampling a role sends, and a dialogue's fingerprint hashes
the dialogue roles' sampling: a changed value would silently orphan every cached answer and
every saved dialogue. The expected values were taken from the code before each role declared
its own sampling and must not move when that code is refactored. The quickstart's dialogue
fingerprints moved once on purpose, with its User Answerer's served model name
(smollm2-135m-instruct → smollm2-135m-answerer, 2026-12-03); their sampling did not. The
quickstart's searcher sampling moved once on purpose: its searcher adapter runs without the
protocol's grammar, whose longest turn needed 448 tokens (max_tokens 448 → its config's 256)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import cts.eval.experiment
from cts.eval.experiment import build_golden, run_experiment
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest, Sampling
from tests.builders import search_then_visit


def _search_then_visit(request: ChatRequest) -> str:
    """Search "battery life", visit the first hit (so that the summarizer is asked too), then
    answer."""
    return search_then_visit(request, lambda _: "battery life")


def _capture(monkeypatch: pytest.MonkeyPatch) -> dict[str, ScriptedEngine]:
    """Scripted engines in place of the real ones, one per role, carrying the role's real
    served model name (the dialogue fingerprint hashes it)."""
    scripted = scripted_roles()
    scripted["searcher"].script = _search_then_visit

    @asynccontextmanager
    async def engines(
        resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        by_role = {}
        for role in roles or list(resolved.experiment.roles):
            scripted[role].model = resolved.model_for(role).name
            by_role[role] = scripted[role]
        yield Engines(dict(by_role), by_role, None)  # type: ignore[arg-type]

    monkeypatch.setattr(cts.eval.experiment, "open_engines", engines)
    return scripted


#: WebDancer-32B's max_tokens (the release's), and the least room a search turn gets before the
#: forced answer (cts/webdancer/agent.py AgentBudget.min_turn_tokens).
WEBDANCER_MAX_TOKENS, MIN_TURN_TOKENS = 32768, 4096


def _sent(scripted: dict[str, ScriptedEngine]) -> dict[str, list[str]]:
    """Per role, every distinct Sampling it sent, as the JSON the cache key hashes. A searcher
    turn of WebDancer's 32768 max_tokens is clamped to the room its prompt leaves in the
    window, which varies with the prompt: shown as the configured value once checked."""

    def shown(role: str, sampling: Sampling) -> str:
        clamped = MIN_TURN_TOKENS <= sampling.max_tokens < WEBDANCER_MAX_TOKENS
        if role == "searcher" and sampling.top_k == -1 and clamped:
            sampling = sampling.model_copy(update={"max_tokens": WEBDANCER_MAX_TOKENS})
        return sampling.model_dump_json()

    return {
        role: sorted({shown(role, r.sampling) for r in engine.requests})
        for role, engine in scripted.items()
        if engine.requests
    }


def _errors(run_dir: Path) -> list[object]:
    return [
        json.loads(line)["error"]
        for path in (run_dir / "records").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if json.loads(line)["error"]
    ]


def _fingerprints(run_dir: Path) -> set[str]:
    lines = [
        json.loads(line)
        for path in (run_dir / "dialogues").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    return {d["fingerprint"] for d in lines}


def S(**values: object) -> str:
    """A Sampling as the JSON the cache key hashes (reads like the Sampling it stands for)."""
    return Sampling(**values).model_dump_json()  # type: ignore[arg-type]


LOCAL = ["dataset.path=sample", "dataset.split=dev", "dataset.limit=1"]
HARD518_LOCAL = [*LOCAL, "search.backend=local", "search.visit=local", "seeds=[3]"]

CASES = {
    "quickstart": (None, []),
    "quickstart-llm-types": (
        None,
        [
            'roles.question_classifier={"model": "smollm2-135m-instruct"}',
            "clarification.question_types=llm",
        ],
    ),
    # What the user may and may not change: a role's own needs win over its overrides.
    "quickstart-overrides": (
        None,
        [
            "roles.clarifier.sampling.max_tokens=50",
            "roles.judge.sampling.temperature=0.5",
            "roles.searcher.sampling.max_tokens=1000",
            "roles.summarizer.sampling.max_tokens=2000",
            "roles.rewriter.sampling.top_p=0.5",
        ],
    ),
    "hard518": ("hard518", HARD518_LOCAL),
    "hard518-constrained": (
        "hard518",
        [*HARD518_LOCAL, "search.constrained=true", "roles.searcher.sampling.max_tokens=100"],
    ),
    "hard518-all-at-once": ("hard518", [*HARD518_LOCAL, "clarification.mode=all_at_once"]),
}

#: The searcher's stop strings (the WebDancer protocol's, added by the agent).
STOP = ("\n<tool_response>", "<tool_response>")


def _clarifier(max_tokens: int) -> str:
    return S(temperature=0.7, top_p=0.8, max_tokens=max_tokens, seed=3)


def _hard518(
    clarifier: list[str], searcher_max_tokens: int, fingerprints: set[str]
) -> tuple[dict[str, list[str]], set[str]]:
    """What hard518 sends under seed 3, pinned: the study's sampling per role and WebDancer's
    release sampling for the searcher; the searcher and the summarizer send two seeds (1000 and
    the run's 3)."""
    searcher = [
        S(temperature=0.6, top_p=0.95, max_tokens=searcher_max_tokens, top_k=-1, seed=seed,
          repetition_penalty=1.1, stop=STOP)
        for seed in (1000, 3)
    ]  # fmt: skip
    return (
        {
            "clarifier": clarifier,
            "user_answerer": [S(top_p=0.8, max_tokens=64)],
            "rewriter": [S(temperature=0.7, top_p=0.8, max_tokens=192, seed=3)],
            "searcher": searcher,
            "judge": [S(top_p=0.8, max_tokens=1024)],
            "summarizer": [
                S(temperature=0.7, top_p=0.8, max_tokens=4564, seed=seed) for seed in (1000, 3)
            ],
            "nugget_builder": [S(top_p=0.8, max_tokens=1344)],
        },
        fingerprints,
    )


def _quickstart(fingerprint: str, **changed: list[str]) -> tuple[dict[str, list[str]], set[str]]:
    """What the quickstart sends: each role's sampling, the `changed` roles' instead where
    given, and the one dialogue fingerprint."""
    sent = {
        "clarifier": [S(max_tokens=96)],
        "user_answerer": [S(max_tokens=64)],
        "rewriter": [S(max_tokens=192)],
        "searcher": [S(max_tokens=256, stop=STOP)],
        "judge": [S(max_tokens=1024)],
        "summarizer": [S(max_tokens=4564)],  # room for the longest notes PageNotes allows
        "nugget_builder": [S(max_tokens=864)],
    }
    return {**sent, **changed}, {fingerprint}


EXPECTED: dict[str, tuple[dict[str, list[str]], set[str]]] = {
    "quickstart": _quickstart("661b9f29a5d03f4a"),
    "quickstart-llm-types": _quickstart("db90fadebe6161bf", question_classifier=[S(max_tokens=48)]),
    "quickstart-overrides": _quickstart(
        "661b9f29a5d03f4a",
        rewriter=[S(top_p=0.5, max_tokens=192)],
        searcher=[S(max_tokens=1000, stop=STOP)],
    ),
    "hard518": _hard518([_clarifier(96)], 32768, {"c001df01551f8cd0"}),
    "hard518-constrained": _hard518([_clarifier(96)], 448, {"c001df01551f8cd0"}),
    "hard518-all-at-once": _hard518(
        [_clarifier(192), _clarifier(288), _clarifier(96)], 32768, set()
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_role_sends_the_sampling_it_always_sent(case, tmp_path, monkeypatch):
    config, overrides = CASES[case]
    resolved = load_experiment(
        config,
        [
            *overrides,
            f"cache.path={tmp_path}/responses.sqlite",
            f"search.tool_cache={tmp_path}/tools.sqlite",
        ],
    )
    scripted = _capture(monkeypatch)
    result = run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert not result.outcome.interrupted
    golden = build_golden(resolved, tmp_path / "golden", show_progress=False)
    assert not golden.outcome.interrupted
    assert _errors(tmp_path / "run") == _errors(tmp_path / "golden") == []
    assert "summarizer" in _sent(scripted)
    sent, fingerprints = _sent(scripted), _fingerprints(tmp_path / "run")
    expected_sent, expected_fingerprints = EXPECTED[case]
    assert sent == {role: sorted(values) for role, values in expected_sent.items()}
    assert fingerprints == expected_fingerprints
