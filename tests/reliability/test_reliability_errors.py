"""Input-handling faults that used to end in a traceback: each must be a ConfigError naming
`file:line: field` (or `--set`), a `file:line: field: message` problem, or a one-line error
naming the path with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.run.config import load_experiment
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError, parse_override
from cts.webdancer.corpus import CorpusError, check_corpus, load_corpus

runner = CliRunner()

ROLES = "clarifier user_answerer rewriter searcher summarizer judge".split()


def _experiment(tmp_path: Path, roles: list[str] | None = None, extra: str = "") -> Path:
    roles = ROLES if roles is None else roles
    lines = [f"  {r}: {{model: smollm2-135m-instruct}}" for r in roles]
    body = "roles:\n" + "\n".join(lines) if lines else "roles: {}"
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: t\n{body}\n{extra}")
    return path


# -- 1: --set values and keys ---------------------------------------------------------------------


def test_set_invalid_date_is_a_config_error_naming_set():
    with pytest.raises(ConfigError, match=r"^--set 'search.date=2026-13-45': "):
        parse_override("search.date=2026-13-45")


def test_set_valid_date_is_kept_as_text():
    assert parse_override("search.date=2026-11-30").value == "2026-11-30"


def test_set_key_nested_too_deep_is_a_config_error_naming_set():
    key = ".".join(["a"] * 3000)
    with pytest.raises(ConfigError, match=r"^--set 'a\.a\.a.*: key nested too deeply \(3000 "):
        parse_override(f"{key}=1")
    result = runner.invoke(app, ["config", "show", "--set", f"models.x.{key}=1"])
    assert result.exit_code == 2, result.output
    assert "key nested too deeply" in result.output


def test_cts_set_invalid_date_exits_2():
    result = runner.invoke(app, ["config", "show", "--set", "search.date=2026-13-45"])
    assert result.exit_code == 2, result.output
    assert "--set 'search.date=2026-13-45'" in result.output
    assert "Traceback" not in result.output


# -- 2: roles --------------------------------------------------------------------------------------


def test_empty_roles_is_a_config_error_naming_roles(tmp_path):
    exp = _experiment(tmp_path, roles=[])
    with pytest.raises(ConfigError, match=r"exp.yaml:2: roles: .*at least one role"):
        load_experiment(exp)


def test_run_without_the_roles_its_conditions_need_exits_2(tmp_path):
    exp = _experiment(tmp_path, roles=["clarifier"])
    result = runner.invoke(app, ["run", "-c", str(exp), "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "roles" in result.output and "searcher" in result.output
    assert "rewriter" in result.output  # clarify@k needs it
    assert not (tmp_path / "run").exists()


def test_run_with_blurred_only_needs_no_clarification_roles(tmp_path):
    from cts.eval.experiment import missing_roles

    exp = _experiment(tmp_path, roles=["searcher", "summarizer", "judge"])
    resolved = load_experiment(exp, ["conditions=[blurred, oracle]"])
    assert missing_roles(resolved) == []


# -- 3: --output-dir / --out that is a file --------------------------------------------------------


@pytest.mark.parametrize("command", [["run"], ["golden", "build"], ["serve", "--dry-run"]])
def test_output_dir_that_is_a_file_exits_2(tmp_path, command):
    exp = _experiment(tmp_path, roles=[*ROLES, "nugget_builder"])
    file = tmp_path / "taken"
    file.write_text("not a directory\n")
    result = runner.invoke(app, [*command, "-c", str(exp), "--output-dir", str(file)])
    assert result.exit_code == 2, result.output
    assert str(file) in result.output and "not a directory" in result.output
    assert "Traceback" not in result.output
    assert file.read_text() == "not a directory\n"


def test_report_out_that_is_a_file_exits_2(tmp_path):
    file = tmp_path / "taken"
    file.write_text("x\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = runner.invoke(app, ["report", str(run_dir), "--out", str(file)])
    assert result.exit_code == 2, result.output
    assert f"--out {file}" in result.output and "not a directory" in result.output
    assert file.read_text() == "x\n"


# -- 4: a garbage run-directory config.yaml --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "experiment: [unclosed\n",
        "- just\n- a list\n",
        "models: {}\n",
        "\xff\xfe bad bytes\n",
        "experiment: &a {name: x}\nagain: *a\n",
    ],
    ids=["not-yaml", "not-a-mapping", "no-experiment", "not-utf8", "alias"],
)
def test_garbage_run_config_is_a_config_error_naming_the_file(tmp_path, text):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = run_dir / "config.yaml"
    config.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match=str(config).replace("\\", "\\\\")):
        RunDir(run_dir).read_config()
    for command in (
        ["merge", str(run_dir)],
        ["report", str(run_dir), "--out", str(tmp_path / "r")],
        # Resuming into it is refused before any model loads (the tiny model is never read).
        ["run", "--output-dir", str(run_dir), "--set", "models.smollm2-135m-instruct.path=/no"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert str(config) in result.output
        assert "Traceback" not in result.output


# -- 5: corpus lines -------------------------------------------------------------------------------


def _doc(doc_id: str) -> bytes:
    return (json.dumps({"doc_id": doc_id, "url": f"u/{doc_id}", "text": "t"}) + "\n").encode()


def test_corpus_invalid_utf8_is_a_problem_on_its_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(_doc("a") + b'{"doc_id": "b", "url": "u", "text": "\xff"}\n' + _doc("c"))
    documents, problems = check_corpus(corpus)
    assert [d.doc_id for d in documents] == ["a", "c"]
    assert [str(p) for p in problems] == [f"{corpus}:2: <row>: not valid UTF-8 (byte 0xff)"]


def test_corpus_json_nested_too_deep_is_a_problem_on_its_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(_doc("a") + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(CorpusError) as e:
        load_corpus(corpus)
    assert [str(p) for p in e.value.problems] == [
        f"{corpus}:2: <row>: malformed JSON: nested too deeply"
    ]


def test_cts_data_validate_bad_corpus_names_the_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(_doc("a") + b"\xc3\x28\n" + b"{" * 5000 + b"\n")
    result = runner.invoke(app, ["data", "validate", str(corpus)])
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert f"{corpus}:2" in result.output


def test_set_unknown_key_above_the_override_names_set():
    with pytest.raises(ConfigError, match=r"^--set typo: unknown key$"):
        load_experiment(None, ["typo.x.y=1"])
