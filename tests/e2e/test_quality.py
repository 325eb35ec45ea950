"""End-to-end, the scores see quality.

- A `cts run` of the sample benchmark whose searcher answers the fused query with the
  instance's facts and the blurred one with nothing gets the hand-computed restore scores from
  the quickstart's own judge (the lexical judge): 100 for oracle, 0 for blurred. The searcher
  replays answers (cts/serving/scripted.py) so that what it says is known; the dataset, the
  pipeline, the runner, the judge and the scoring are the real ones.
- On the quickstart's real models, the fused query reaches no role but the User Answerer.
- On the quickstart's real models (the User Answerer, Rewriter and searcher adapters), a
  clarification that names the removed constraint raises clarify@1 above blurred, and the same
  run with a Rewriter that lost the answers does not.

A pipeline that lost the answer on its way to the judge, a judge that lost the nuggets, a
scoring that ignored the labels, a leak of the fused query or a Rewriter that dropped the
user's answers would each fail here."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cts.eval.experiment
from cts.cli import app
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.experiment import run_experiment
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.serving.engine import ChatModel, Wrapped
from cts.serving.types import ChatRequest, ChatResponse
from tests.builders import scripted_experiment

NOTHING = "I could not find reliable information about this."


def answer(text: str) -> str:
    return f"<think>\nfound it\n</think>\n<answer>\n{text}\n</answer>"


def test_an_answer_stating_the_nuggets_scores_100_and_one_stating_none_scores_0(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=2))
    replay = tmp_path / "searcher.jsonl"
    lines = [
        {"text": answer(" ".join(n.text for n in i.golden.nuggets)), "contains": i.fused_query}
        for i in instances
    ]
    lines.append({"text": answer(NOTHING)})  # any other request: the blurred queries
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
    searcher = {"name": "replay", "path": "none", "engine": "scripted", "replay": str(replay)}
    config = scripted_experiment(
        tmp_path / "experiment.yaml",
        "quality",
        ("clarifier", "user_answerer", "rewriter", "summarizer"),
        {"replay": searcher},
        {"searcher": "replay", "judge": "lexical-judge"},
        conditions=["blurred", "oracle"],
        seeds=[0],
    )
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-c", str(config), "--output-dir", str(run_dir)])
    assert result.exit_code == 0, result.output

    records = RecordStore(run_dir).completed()
    assert len(records) == 4 and all(r.error is None for r in records.values())
    for instance in instances:
        oracle = records[(instance.id, "oracle", 0)]
        blurred = records[(instance.id, "blurred", 0)]
        # Every nugget stated verbatim: all full, 100 by any weighting; none stated: 0.
        assert {v["label"] for v in oracle.labels.values()} == {"full"}
        assert oracle.scores == {"restore_score_100": 100.0, "strict": 100.0, "unweighted": 100.0}
        assert {v["label"] for v in blurred.labels.values()} == {"none"}
        assert blurred.scores["restore_score_100"] == 0.0
        nugget = instance.golden.nuggets[0]
        assert oracle.labels[nugget.id]["evidence"] == nugget.text[:120]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps(summary["systems"], indent=1)[:1500])


# -- the fused query's sentinel, on the real tiny models -------------------------------------------

SENTINEL = "SENTINEL-9b2d"


class Recorder(Wrapped):
    """A role's engine that keeps the text of every request it is sent."""

    def __init__(self, inner: ChatModel, seen: list[str]) -> None:
        super().__init__(inner)
        self.seen = seen

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.seen.append("\n".join(m.content for m in request.messages))
        return await self.inner.chat(request)


@pytest.mark.slow
def test_the_fused_query_reaches_no_role_but_the_user_answerer_on_the_real_models(
    tiny_path: str, tmp_path: Path, monkeypatch
) -> None:
    """The quickstart's real models (the tiny model, its answerer adapter, the lexical judge)
    on one sample instance whose fused query ends in a sentinel: every prompt of every role is
    recorded, and the sentinel is in the User Answerer's alone — elsewhere only where one of
    its answers carried it on."""
    (instance,) = load_instances(DatasetSource(path="sample", split="dev", limit=1))
    planted = instance.model_copy(update={"fused_query": f"{instance.fused_query} {SENTINEL}"})
    dataset = tmp_path / "planted.jsonl"
    dataset.write_text(planted.model_dump_json() + "\n")
    seen: dict[str, list[str]] = defaultdict(list)
    real = cts.eval.experiment.open_engines

    @asynccontextmanager
    async def recording(resolved, roles=None, use_cache=True):  # type: ignore[no-untyped-def]
        async with real(resolved, roles, use_cache) as engines:
            for role, engine in list(engines.roles.items()):
                engines.roles[role] = Recorder(engine, seen[role])
            yield engines

    monkeypatch.setattr(cts.eval.experiment, "open_engines", recording)
    resolved = load_experiment(
        None,
        [
            f"dataset.path={dataset}",
            "dataset.split=null",
            "conditions=[blurred,clarify@2]",
            # Where the sentinel may go is decided before the search's budget is: the least.
            "budgets.max_llm_calls=1",
            "search.max_page_tokens=300",
            "models.smollm2-135m-instruct.sampling.max_tokens=128",
            f"cache.path={tmp_path}/responses.sqlite",
            f"search.tool_cache={tmp_path}/tools.sqlite",
        ],
    )
    result = run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert not result.outcome.interrupted
    records = RecordStore(tmp_path / "run").completed()
    assert len(records) == 2
    assert seen["user_answerer"] and any(SENTINEL in p for p in seen["user_answerer"])
    # The tiny User Answerer may copy the sentinel into an answer (it ends the fused query):
    # another role may then see it, but only inside such an answer, never on its own.
    carriers = [a for r in records.values() for a in r.answers if SENTINEL in a]
    print({role: len(prompts) for role, prompts in seen.items()}, "carried by:", carriers)
    for role in ("clarifier", "question_classifier", "rewriter", "judge"):
        for prompt in seen[role]:
            for answer in carriers:
                prompt = prompt.replace(answer, "")
            assert SENTINEL not in prompt, (role, prompt)
    # The blurred search sees no answer: nothing can carry the sentinel into it.
    blurred = records[(instance.id, "blurred", 0)]
    assert blurred.error is None and SENTINEL not in (blurred.answer or "")


# -- clarification restores on the real models; a Rewriter that drops the answers does not --------

#: An answer line of the Rewriter's prompt (cts/agents/types.py history_text): `A1: 2023`, `答1: …`.
ANSWER_LINE = re.compile(r"^((?:A|答)\d+: ).*$", re.MULTILINE)


class DropsTheAnswers(Wrapped):
    """The defect: a Rewriter whose prompt lost the user's answers (every one reads
    `unknown`), as a pipeline that passed the questions on without them would."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        messages = tuple(
            m.model_copy(update={"content": ANSWER_LINE.sub(r"\1unknown", m.content)})
            for m in request.messages
        )
        return await self.inner.chat(request.model_copy(update={"messages": messages}))


def _mean_scores(run_dir: Path) -> dict[str, float]:
    by_condition: dict[str, list[float]] = defaultdict(list)
    for (_, condition, _), record in RecordStore(run_dir).completed().items():
        assert record.error is None, record.error
        by_condition[condition].append(record.scores["restore_score_100"])
    return {c: sum(s) / len(s) for c, s in by_condition.items()}


#: Dev instances whose removed constraint one plain question recovers (a region, a year): the
#: question the Clarifier asks about each, as a careful clarifier would.
#: Measured once with A-dev-04 and D-dev-03 too: each of the four showed the effect alone.
CLARIFIED = {
    "A-dev-02": "Which country or region are you asking about?",
    "D-dev-01": "Which year are you asking about?",
}


def _replayed_clarifier(tmp_path: Path) -> tuple[Path, dict]:
    """A dataset of the CLARIFIED instances and a Clarifier replaying their questions."""
    instances = {i.id: i for i in load_instances(DatasetSource(path="sample", split="dev"))}
    dataset = tmp_path / "slice.jsonl"
    dataset.write_text("".join(instances[i].model_dump_json() + "\n" for i in CLARIFIED))
    replay = tmp_path / "clarifier.jsonl"
    replay.write_text(
        "".join(
            json.dumps(
                {"text": json.dumps({"question": q}), "contains": instances[i].blurred_query}
            )
            + "\n"
            for i, q in CLARIFIED.items()
        )
    )
    return dataset, {
        "name": "replayed",
        "path": "none",
        "engine": "scripted",
        "replay": str(replay),
    }


@pytest.mark.slow
def test_clarification_restores_on_the_real_models_and_not_when_the_rewriter_drops_the_answers(
    tiny_path: str, tmp_path: Path, monkeypatch
) -> None:
    """The quickstart's User Answerer, Rewriter and searcher (the tiny model's adapters) and
    its lexical judge on two dev instances, the Clarifier replaying one plain question about
    each removed constraint: the oracle's answers state more nugget facts than the blurred
    ones and score above them, and clarify@1 restores part of that gap. The same run with a
    Rewriter that lost the answers scores clarify@1 no higher than blurred. Caches shared:
    only the Rewriter's calls and what follows them run again."""
    dataset, clarifier = _replayed_clarifier(tmp_path)
    overrides = [
        f"dataset.path={dataset}",
        "dataset.split=null",
        "dataset.limit=null",
        "roles.clarifier.model=replayed",
        f"models.replayed={json.dumps(clarifier)}",
        "conditions=[blurred,clarify@1,oracle]",
        f"cache.path={tmp_path}/responses.sqlite",
        f"search.tool_cache={tmp_path}/tools.sqlite",
    ]
    real = run_experiment(load_experiment(None, overrides), tmp_path / "real", show_progress=False)
    assert not real.outcome.interrupted
    scores = _mean_scores(tmp_path / "real")
    records = RecordStore(tmp_path / "real").completed().values()
    print("real:", scores, [(r.answers, r.rewrite) for r in records if r.rewrite])
    assert scores["oracle"] > scores["blurred"]
    assert scores["clarify@1"] > scores["blurred"]

    opened = cts.eval.experiment.open_engines

    @asynccontextmanager
    async def dropping(resolved, roles=None, use_cache=True):  # type: ignore[no-untyped-def]
        async with opened(resolved, roles, use_cache) as engines:
            engines.roles["rewriter"] = DropsTheAnswers(engines.roles["rewriter"])
            yield engines

    monkeypatch.setattr(cts.eval.experiment, "open_engines", dropping)
    broken = run_experiment(
        load_experiment(None, overrides), tmp_path / "broken", show_progress=False
    )
    assert not broken.outcome.interrupted
    dropped = _mean_scores(tmp_path / "broken")
    print("rewriter without the answers:", dropped)
    assert dropped["blurred"] == scores["blurred"] and dropped["oracle"] == scores["oracle"]
    assert dropped["clarify@1"] <= dropped["blurred"]
