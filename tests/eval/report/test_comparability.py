"""Runs are compared as clarifier systems only when nothing but the clarifier differs: a run and
its rejudged copy are refused (naming the judge), shown only with --allow-unlike and a warning
on every row; two runs that differ only by clarifier compare as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cts.eval.experiment as experiment_module
import cts.eval.rejudge as rejudge_module
from cts.cli import app
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.report.comparability import differences, parts, setup_of
from cts.eval.run.config import load_experiment
from cts.eval.run.fingerprint import fingerprint
from tests.scripted_cts import scripted_engines

runner = CliRunner()

RUN = [
    "--limit",
    "2",
    "--set",
    "conditions=[blurred,clarify@1,oracle]",
    "--set",
    "search.date=2026-11-30",
]


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real command line, every role on a scripted engine behind the real caches."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    monkeypatch.setattr(rejudge_module, "open_engines", scripted_engines)
    return tmp_path


def cts(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def _comparison_rows(report: Path) -> list[str]:
    text = report.read_text()
    section = text.split("## Systems compared", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and " − " in line]
    return [row for row in rows if not row.startswith("| first − second")]


def test_a_run_and_its_rejudged_copy_are_not_compared_as_clarifier_systems(scripted):
    source, rejudged, out = scripted / "a", scripted / "a-judge2", scripted / "report"
    assert cts("run", "--output-dir", source, *RUN).exit_code == 0
    judged = cts("rejudge", source, "--output-dir", rejudged, "--set", "roles.judge.model=qwen3-8b")
    assert judged.exit_code == 0, judged.output

    refused = cts("report", source, rejudged, "--out", out)
    assert refused.exit_code == 2, refused.output
    assert "differ beyond the clarifier" in refused.output
    assert 'judge.model.name: "lexical-judge" → "Qwen/Qwen3-8B"' in refused.output
    assert f"cts judge agreement {source} {rejudged}" in refused.output
    assert "--allow-unlike" in refused.output
    assert not out.exists()  # refused before anything is written

    shown = cts("report", source, rejudged, "--out", out, "--allow-unlike")
    assert shown.exit_code == 0, shown.output
    rows = _comparison_rows(out / "report.md")
    assert len(rows) == 3  # blurred, clarify@1, oracle
    # One clarifier's answers twice, and another judge.
    assert all("WARNING: differs in answers, judge" in row for row in rows), rows
    summary = json.loads((out / "summary.json").read_text())
    (pair,) = summary["report"]["unlike"]
    assert any(d.startswith("judge.model.name") for d in pair["differences"])
    assert all(row["unlike"] for row in summary["comparisons"])


def test_a_same_judge_rejudge_beside_its_source_is_not_a_second_system(scripted):
    """The same answers judged again by the same judge gave p and Holm rows as if a second
    clarifier; they are one clarifier's answers judged twice (a noise floor: judge agreement)."""
    source, again, out = scripted / "a", scripted / "a-again", scripted / "report"
    assert cts("run", "--output-dir", source, *RUN).exit_code == 0
    judged = cts("rejudge", source, "--output-dir", again)
    assert judged.exit_code == 0, judged.output
    refused = cts("report", source, again, "--out", out)
    assert refused.exit_code == 2, refused.output
    assert "the same final answers" in refused.output
    assert f"cts judge agreement {source} {again}" in refused.output
    # A rejudge of the rejudge holds the source's answers too.
    twice = scripted / "a-twice"
    assert cts("rejudge", again, "--output-dir", twice).exit_code == 0
    assert cts("report", source, twice, "--out", out).exit_code == 2


def test_runs_that_differ_only_by_clarifier_compare_as_before(scripted):
    first, second, out = scripted / "a", scripted / "b", scripted / "report"
    assert cts("run", "--output-dir", first, *RUN).exit_code == 0
    other_clarifier = ["--set", "roles.clarifier.model=qwen3-8b"]
    other_clarifier += ["--set", "roles.clarifier.sampling.temperature=0.7"]
    ran = cts("run", "--output-dir", second, *RUN, *other_clarifier)
    assert ran.exit_code == 0, ran.output
    compared = cts("report", first, second, "--out", out)
    assert compared.exit_code == 0, compared.output
    rows = _comparison_rows(out / "report.md")
    assert len(rows) == 3 and not any("WARNING" in row for row in rows)
    assert "not like for like" not in (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["report"]["unlike"] == []
    assert len(summary["comparisons"]) == 3


@pytest.fixture(scope="module")
def dataset():  # type: ignore[no-untyped-def]
    return load_instances(DatasetSource(path="sample", split="dev"))


def _setup(dataset, overrides=(), prints=None):  # type: ignore[no-untyped-def]
    resolved = load_experiment(None, list(overrides))
    return setup_of(resolved, prints or fingerprint(dataset), dataset)


@pytest.mark.parametrize(
    ("override", "part"),
    [
        ("roles.user_answerer.model=qwen3-8b", "user_answerer"),
        ("clarification.answerer=abstractive", "user_answerer"),
        ("clarification.answer_span.max_words=4", "user_answerer"),
        ("roles.rewriter.sampling.temperature=0.5", "rewriter"),
        ("roles.searcher.model=webdancer-32b", "searcher"),
        ("roles.summarizer.sampling.temperature=0.5", "summarizer"),
        ("judge.show_query=true", "judge"),
        ("search.top_k=5", "search"),
        ("search.corpus=other.jsonl", "search"),
        ("budgets.max_llm_calls=2", "budgets"),
        # A model several roles share: its change is each of theirs.
        ("models.smollm2-135m-instruct.dtype=float32", "summarizer"),
        ("models.smollm2-135m-searcher.dtype=float32", "searcher"),
        ("roles.judge.model=smollm2-135m-instruct", "judge"),
    ],
)
def test_what_is_not_the_clarifiers_is_named(dataset, override, part):
    differ = differences(_setup(dataset), _setup(dataset, [override]))
    assert differ and part in parts(differ), differ


@pytest.mark.parametrize(
    "override",
    [
        "roles.clarifier.model=qwen3-8b",
        "roles.clarifier.sampling.temperature=0.9",
        "clarification.mode=all_at_once",
        "clarification.allow_stop=true",
        "seeds=[1,2]",
        "conditions=[blurred,oracle]",
        "dataset.limit=5",
        "search.tool_cache=/elsewhere/tools.sqlite",
        "cache.path=/elsewhere/responses.sqlite",
        "concurrency=16",
        "golden.max_nuggets=3",
        # The canary is a diagnostic beside the labels.
        "judge.canary.share=0.5",
        "judge.canary.answer=[empty]",
    ],
)
def test_the_clarifier_and_what_selects_keys_may_differ(dataset, override):
    assert differences(_setup(dataset), _setup(dataset, [override])) == []


def test_nuggets_queries_and_prompts_are_compared_by_content(dataset):
    base = _setup(dataset)
    renugget = [i.model_copy(deep=True) for i in dataset]
    assert renugget[0].golden is not None
    renugget[0].golden.nuggets[0].text = "Another fact."
    assert parts(differences(base, _setup(renugget))) == ["golden nuggets"]
    requery = [
        i.model_copy(update={"fused_query": "x"}) if n == 3 else i for n, i in enumerate(dataset)
    ]
    assert parts(differences(base, _setup(requery))) == ["dataset (queries)"]
    # The same queries under another path (a copy): no difference.
    assert differences(base, _setup(list(dataset))) == []
    prints = fingerprint(dataset)
    judge_prompt = {**prints, "prompt:agents/judge.yaml": "edited"}
    clarifier_prompt = {**prints, "prompt:agents/clarifier.yaml": "edited"}
    llm = ["roles.judge.model=smollm2-135m-instruct"]
    assert parts(differences(_setup(dataset, llm), _setup(dataset, llm, judge_prompt))) == [
        "prompt:agents/judge.yaml"
    ]
    assert differences(base, _setup(dataset, prints=clarifier_prompt)) == []


def test_a_prompt_no_record_of_the_run_was_made_with_is_not_compared(dataset):
    """The lexical judge sends no prompt, and a run without clarify@k sends no User Answerer's
    or Rewriter's: an edit to those prompts between the runs is no difference."""
    prints = fingerprint(dataset)
    judge_prompt = {**prints, "prompt:agents/judge.yaml": "edited"}
    assert differences(_setup(dataset), _setup(dataset, prints=judge_prompt)) == []
    rewriter_prompt = {**prints, "prompt:agents/rewriter.yaml": "edited"}
    searched = ["conditions=[blurred,oracle]"]
    assert differences(_setup(dataset, searched), _setup(dataset, searched, rewriter_prompt)) == []
    assert parts(differences(_setup(dataset), _setup(dataset, prints=rewriter_prompt))) == [
        "prompt:agents/rewriter.yaml"
    ]


def test_the_code_that_makes_records_is_compared(dataset):
    """A change to the lexical judge's rules between two runs made clarify@1 -6.1, p = 0.005,
    "significant": all of it the judge's code. Each part of the code that makes a record is
    compared; the judge's, as a difference of judge; a run written before code digests is
    compared on the rest."""
    from cts.eval.report.comparability import Unlike

    prints = fingerprint(dataset)
    assert {"code:agents", "code:judge", "code:eval/run", "code:version"} <= set(prints)
    rules = {**prints, "code:judge": "other rules", "code:agents": "edited"}
    differ = differences(_setup(dataset), _setup(dataset, prints=rules))
    assert parts(differ) == ["code:agents", "code:judge"]
    assert Unlike("a", "b", differ).judge_differs
    older = {k: v for k, v in prints.items() if not k.startswith("code:")}
    assert differences(_setup(dataset), _setup(dataset, prints=older)) == []


@pytest.mark.parametrize(
    ("override", "line"),
    [
        # A key only one run's model config has: its searcher without the LoRA adapter.
        (
            "models.smollm2-135m-searcher.adapter=null",
            'searcher.model.adapter: "models/adapters/smollm2-135m-searcher" → "(unset)"',
        ),
        # Chat-template kwargs where the other run has none (`{}`, one key where these are others).
        (
            "models.smollm2-135m-rewriter.chat_template_kwargs={enable_thinking: true}",
            'rewriter.model.chat_template_kwargs.enable_thinking: "(unset)" → true',
        ),
    ],
)
def test_a_model_key_only_one_run_has_is_a_difference(dataset, override, line):
    assert differences(_setup(dataset), _setup(dataset, [override])) == [line]
    # Either way round.
    before, after = line.split(": ", 1)[1].split(" → ")
    swapped = f"{line.split(': ', 1)[0]}: {after} → {before}"
    assert differences(_setup(dataset, [override]), _setup(dataset)) == [swapped]


def test_a_model_trained_again_in_place_is_another_setup(dataset):
    resolved = load_experiment(None, [])
    ref = resolved.experiment.roles["judge"].model
    prints = fingerprint(dataset)
    before = setup_of(resolved, {**prints, f"model:{ref}:adapter": "a1"}, dataset)
    after = setup_of(resolved, {**prints, f"model:{ref}:adapter": "a2"}, dataset)
    assert differences(before, after) == ['judge model content (adapter): "a1" → "a2"']
    # A run written before these digests is compared on the rest.
    assert differences(before, setup_of(resolved, prints, dataset)) == []


def test_a_role_only_one_run_has_is_not_compared(dataset):
    base = _setup(dataset)
    without = {k: v for k, v in base.items() if not k.startswith("summarizer.")}
    assert differences(base, without) == []
