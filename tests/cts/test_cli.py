"""The `cts` command as a user runs it."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

import cts.eval.experiment as experiment_module
from cts.cli import app
from cts.eval.experiment import run_experiment
from cts.eval.run.config import load_experiment
from cts.serving.scripted import scripted_roles
from tests.builders import cts, scripted_cli

runner = CliRunner()

pytestmark = pytest.mark.usefixtures("wide_terminal")


def test_help_lists_every_command():
    out = cts("--help").output
    for command in ("run", "models", "config"):
        assert command in out
    models = cts("models", "--help").output
    for command in ("prepare-tiny", "list", "check"):
        assert command in models


def test_config_show_prints_the_resolved_config():
    result = cts("config", "show", "--set", "roles.clarifier.sampling.temperature=0.7")
    assert result.exit_code == 0
    doc = yaml.safe_load(result.output)
    sampling = doc["experiment"]["roles"]["clarifier"]["sampling"]
    # Unset overrides print as null: the file reads back as exactly this experiment.
    assert sampling == {
        "temperature": 0.7,
        "top_p": None,
        "max_tokens": None,
        "repetition_penalty": None,
        "top_k": None,
    }
    assert doc["models"]["smollm2-135m-instruct"]["engine"] == "transformers"
    assert doc["sources"]["experiment"].endswith("quickstart.yaml")


def test_config_errors_exit_2_and_name_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroles:\n  clarifier: {model: smollm2-135m-instruct}\nseeds: zero\n")
    result = runner.invoke(app, ["config", "show", "--config", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:4: seeds: Input should be a valid list" in result.output


def test_models_list_shows_shipped_configs():
    out = cts("models", "list").output
    assert "smollm2-135m-instruct" in out and "transformers" in out and "openai" in out


@pytest.mark.slow
def test_models_check_prints_answer_and_speed(tiny_path):
    result = cts("models", "check", "--role", "clarifier", "--structured")
    assert result.exit_code == 0, result.output
    assert "question" in result.output and "tok/s" in result.output
    # The quickstart's judge is no model: it is named, and nothing is asked of it.
    lexical = cts("models", "check", "--role", "judge")
    assert lexical.exit_code == 0, lexical.output
    assert "lexical-judge" in lexical.output and "no model" in " ".join(lexical.output.split())


def test_models_check_unknown_role():
    result = runner.invoke(app, ["models", "check", "--role", "oracle"])
    assert result.exit_code == 2 and "unknown role 'oracle'" in result.output


@pytest.mark.slow
def test_run_end_to_end_on_the_tiny_model_resumes_and_reruns_from_the_cache(tmp_path, tiny_path):
    """`cts run` on the quickstart (two instances, three conditions, two search calls and short
    pages to keep CI short): records, traces, summary and report; a second run skips every key;
    a run with the records removed is answered from the response and tool caches."""
    out = tmp_path / "run"
    args = [
        "run",
        "--output-dir",
        str(out),
        "--limit",
        "2",
        "--set",
        "conditions=[blurred, clarify@2, oracle]",
        "--set",
        "budgets.max_llm_calls=2",
        "--set",
        "search.max_page_tokens=300",
        "--set",
        "models.smollm2-135m-instruct.sampling.max_tokens=128",
        "--set",
        f"cache.path={tmp_path / 'responses.sqlite'}",
        "--set",
        f"search.tool_cache={tmp_path / 'tools.sqlite'}",
        "--set",
        "search.date=2026-11-30",
    ]
    first = cts(*args)
    assert first.exit_code == 0, first.output
    assert "6 records written" in first.output and "restore_score_100" in first.output
    for name in (
        "config.yaml",
        "summary.json",
        "report.md",
        "report.html",
        "figures/score_vs_k.png",
        "figures/question_types.png",
        "figures/unknown_rate_per_type.png",
    ):
        assert (out / name).is_file(), name
    records = [
        json.loads(line)
        for f in sorted((out / "records").glob("*/*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert {(r["instance_id"], r["condition"]) for r in records} == {
        (i, c) for i in ("A-dev-01", "A-dev-02") for c in ("blurred", "clarify@2", "oracle")
    }
    for r in records:
        assert r["trace_id"] is None or (out / "traces" / r["trace_id"]).is_file()
    for clarified in (r for r in records if r["condition"] == "clarify@2"):
        assert len(clarified["questions"]) == 2 or clarified["error"]
    summary = json.loads((out / "summary.json").read_text())
    (system,) = summary["systems"].values()
    assert system["records"] == 6 and set(system["scores"]) == {"blurred", "clarify@2", "oracle"}
    html = (out / "report.html").read_text()
    assert "<table>" in html and "data:image/png;base64," in html

    again = cts(*args)
    assert again.exit_code == 0 and "0 records written, 6 already done" in again.output
    assert "0 model calls" in again.output

    for f in (out / "records").glob("*/*.jsonl"):
        f.unlink()
    cached = cts(*args)
    assert cached.exit_code == 0 and "6 records written" in cached.output
    assert "0 model calls" in cached.output, cached.output
    # The report says the searches were re-used, not recomputed.
    (system,) = json.loads((out / "summary.json").read_text())["systems"].values()
    for condition in ("blurred", "oracle"):
        reuse = system["reuse"][condition]
        assert reuse["search_llm_calls"] > 0 and reuse["cached"] == reuse["search_llm_calls"]
    assert "search-agent model calls from the cache: blurred" in (out / "report.md").read_text()
    assert cts("merge", str(out)).exit_code == 0
    merged = (out / "records" / "clarify@2" / "merged.jsonl").read_text().splitlines()
    assert [json.loads(line)["instance_id"] for line in merged] == ["A-dev-01", "A-dev-02"]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["versions"]["torch"].startswith("2.")


def test_data_validate_lists_every_problem_and_exits_1(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "blurred_query": "x", "fused_query": "x"}\n'
        '{"id": "a", "blurred_query": "x", "fused_query": "x y", "language": "xx"}\n'
        "oops\n"
    )
    result = runner.invoke(app, ["data", "validate", str(bad)])
    assert result.exit_code == 1
    assert result.output.splitlines()[:4] == [
        f"{bad}:1: blurred_query: equal to fused_query",
        f"{bad}:2: id: duplicate id 'a' (first at line 1)",
        f"{bad}:2: language: unknown language 'xx' (expected an ISO 639-1 code)",
        f"{bad}:3: <row>: malformed JSON: Expecting value (column 1)",
    ]


def test_data_validate_a_corpus_and_a_mapped_csv(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d1", "url": "u", "text": "t"}\n')
    assert "OK (1 documents)" in cts("data", "validate", str(corpus)).output
    queries = tmp_path / "q.csv"
    queries.write_text("qid,blurred_query,fused_query\n7,x,x y\n")
    result = cts("data", "validate", str(queries), "--field-map", "id=qid")
    assert result.exit_code == 0 and "OK (1 instances)" in result.output


def test_data_stats_of_the_sample():
    result = cts("data", "stats", "sample", "--split", "dev", "--json")
    stats = json.loads(result.output)["dev"]
    assert stats["instances"] == 24 and stats["with_golden"] == 24
    assert set(stats["languages"]) == {"en", "zh"}
    assert sum(stats["weight_mix"].values()) >= 24 * 3


def test_run_refuses_bad_data_before_calling_a_model(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "blurred_query": "x"}\n')
    result = runner.invoke(
        app,
        [
            "run",
            "--output-dir",
            str(tmp_path / "r"),
            "--set",
            f"dataset.path={bad}",
            "--set",
            "dataset.split=null",
        ],
    )
    assert result.exit_code == 2
    assert f"{bad}:1: fused_query: missing" in result.output
    assert not (tmp_path / "r" / "model_check.jsonl").exists()


@pytest.mark.slow
def test_search_offline_with_an_empty_tool_cache_fails_clearly(tmp_path, tiny_path):
    result = runner.invoke(
        app,
        [
            "search",
            "Korvex Aura Pro battery life?",
            "--tools-offline",
            "--set",
            f"search.tool_cache={tmp_path / 'tools.sqlite'}",
            "--set",
            f"cache.path={tmp_path / 'responses.sqlite'}",
            "--set",
            "budgets.max_llm_calls=2",
        ],
    )
    assert result.exit_code == 1
    assert "tool cache miss: tools are offline and the tool cache" in result.output


# -- dataset input the audit found accepted silently or refused wrongly ---------------------------

SAMPLE_DEV = Path(__file__).resolve().parents[2] / "cts" / "eval" / "sample_data" / "dev.jsonl"


def _sample_rows(n: int) -> list[dict]:
    return [json.loads(line) for line in SAMPLE_DEV.read_text().splitlines()[:n]]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_a_misspelt_field_fails_validate_and_run_naming_the_field_it_means(tmp_path):
    rows = _sample_rows(2)
    rows[1]["langauge"] = rows[1].pop("language")
    data = _jsonl(tmp_path / "typo.jsonl", rows)
    expected = (
        f'{data}:2: langauge: unknown field; did you mean "language"? (rename the column, or '
        "map it: --set dataset.field_map.language=langauge)"
    )
    validated = runner.invoke(app, ["data", "validate", str(data)])
    assert validated.exit_code == 1 and validated.output.splitlines()[0] == expected
    args = ["run", "--output-dir", str(tmp_path / "r"), "--set", f"dataset.path={data}"]
    ran = runner.invoke(app, [*args, "--set", "dataset.split=null"])
    assert ran.exit_code == 2 and expected in ran.output.splitlines()
    assert not (tmp_path / "r" / "records").exists()


def _partly_golden(tmp_path: Path) -> Path:
    """Four sample instances, the second and the fourth without golden nuggets."""
    rows = _sample_rows(4)
    for row in rows[1::2]:
        del row["golden"]
    return _jsonl(tmp_path / "partly.jsonl", rows)


def _unscored_note(data: Path) -> str:
    ids = [json.loads(line)["id"] for line in data.read_text().splitlines()]
    return (
        f"note: 2 of 4 instance(s) have no golden nuggets ({ids[1]}, {ids[3]}): "
        "they run but are not scored"
    )


def test_data_validate_notes_instances_without_golden_nuggets(tmp_path):
    data = _partly_golden(tmp_path)
    result = runner.invoke(app, ["data", "validate", str(data)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [_unscored_note(data), f"{data}: OK (4 instances)"]


RUN_PARTLY = ["--limit", "4", "--set", "dataset.split=null", "--set", "conditions=[blurred]"]


JUDGE_AT_07 = "roles.judge.sampling.temperature=0.7"
JUDGE_NOTE = (
    "note: roles.judge.sampling.temperature=0.7 is not used: the judge's requests use 0.0 (the "
    "role samples greedily, so its outputs reproduce)"
)


def test_an_override_the_role_replaces_is_named_by_config_show_and_run(tmp_path, monkeypatch):
    shown = runner.invoke(app, ["config", "show", "--set", JUDGE_AT_07])
    assert shown.exit_code == 0 and shown.stderr.splitlines() == [JUDGE_NOTE]
    assert (
        yaml.safe_load(shown.stdout)["experiment"]["roles"]["judge"]["sampling"]["temperature"]
        == 0.7
    )  # what the config says, as it says it
    scripted_cli(tmp_path, monkeypatch, scripted_roles)
    args = ["run", "--output-dir", str(tmp_path / "r"), "--set", JUDGE_AT_07, *RUN_PARTLY]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == JUDGE_NOTE


def test_run_says_which_instances_run_unscored_before_its_first_key(tmp_path, monkeypatch):
    scripted_cli(tmp_path, monkeypatch, scripted_roles)
    data = _partly_golden(tmp_path)
    args = ["run", "--output-dir", str(tmp_path / "r"), "--set", f"dataset.path={data}"]
    result = runner.invoke(app, [*args, *RUN_PARTLY])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # The experiment line, then the note, before any progress line.
    assert lines[1] == _unscored_note(data) and lines[2].startswith("quickstart: 0/4 done")


def test_a_dry_run_says_what_the_run_would_note(tmp_path):
    data = _partly_golden(tmp_path)
    args = ["run", "--dry-run", "--output-dir", str(tmp_path / "r"), "--set", JUDGE_AT_07]
    result = runner.invoke(app, [*args, "--set", f"dataset.path={data}", *RUN_PARTLY])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2:] == [JUDGE_NOTE, _unscored_note(data)]
    assert not (tmp_path / "r").exists()


def test_the_unscored_note_comes_before_any_model_is_opened(tmp_path, monkeypatch):
    scripted_cli(tmp_path, monkeypatch, scripted_roles)
    data = _partly_golden(tmp_path)
    events: list[str] = []
    scripted = experiment_module.open_engines

    @asynccontextmanager
    async def recorded(*args, **kwargs):
        events.append("engines opened")
        async with scripted(*args, **kwargs) as engines:
            yield engines

    monkeypatch.setattr(experiment_module, "open_engines", recorded)
    overrides = [f"dataset.path={data}", "dataset.split=null", "dataset.limit=4"]
    resolved = load_experiment(None, [*overrides, "conditions=[blurred]"])
    run_experiment(resolved, tmp_path / "r", notify=events.append, show_progress=False)
    assert events == [_unscored_note(data), "engines opened"]


def test_data_validate_takes_a_corpus_with_a_bad_first_line_for_a_corpus(tmp_path):
    document = '{"doc_id": "d1", "url": "u", "text": "t"}\n'
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d0", "url": \n' + document)
    result = runner.invoke(app, ["data", "validate", str(corpus)])
    assert result.exit_code == 1
    first, count = result.output.splitlines()[:2]
    assert first.startswith(f"{corpus}:1: <row>: malformed JSON") and count.startswith("1 problem")
    # A BOM on the first row: a corpus still, read past its BOM; not a dataset whose every row
    # misses id and both queries.
    other = document.replace('"d1", "url": "u"', '"d2", "url": "u2"')
    corpus.write_bytes(b"\xef\xbb\xbf" + (document + other).encode())
    lines = runner.invoke(app, ["data", "validate", str(corpus)]).output.splitlines()
    assert lines[0] == f"{corpus}: OK (2 documents)"


def test_data_stats_refuses_a_corpus_and_counts_skipped_rows(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d1", "url": "u", "text": "t"}\n' * 2)
    result = runner.invoke(app, ["data", "stats", str(corpus)])
    assert result.exit_code == 2 and "instances" not in result.output
    assert f"{corpus} is a corpus (its rows have doc_id)" in result.output
    stats = get_command(app).commands["data"].commands["stats"]  # type: ignore[attr-defined]
    (path,) = [p for p in stats.params if p.name == "path"]
    assert "not a corpus" in path.help and "a corpus JSONL" not in path.help
    rows = _sample_rows(2)
    rows[1]["blurred_query"] = rows[1]["fused_query"]
    rows[1]["language"] = "qq"  # two problems, one row
    data = _jsonl(tmp_path / "d.jsonl", rows)
    result = runner.invoke(app, ["data", "stats", str(data), "--json"])
    assert result.exit_code == 0
    assert result.output.startswith("1 invalid row(s) skipped (2 problem(s));")
