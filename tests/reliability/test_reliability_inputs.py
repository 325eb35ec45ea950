"""Hostile or broken input files (issue 13): each must end in a ConfigError or a
`file:line: field: message` problem, never a hang, a traceback or a file written outside the
run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.dataset import DatasetSource, GoldTable, check_source, load_instances
from cts.eval.data.readers import DatasetError
from cts.foundation.yaml_config import ConfigError, read_yaml

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _bomb(levels: int) -> str:
    """A "billion laughs" YAML: each level refers to the previous one nine times."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def _row(key: str, **extra: object) -> str:
    return json.dumps({"id": key, "blurred_query": "q", "fused_query": "q more", **extra}) + "\n"


def _problems(path: Path, **source: object) -> list[str]:
    """Every problem `check_source` reports (or raises) for a dataset file."""
    try:
        checked = check_source(DatasetSource(path=str(path), corpus=None, **source))
    except DatasetError as e:
        return [str(p) for p in e.problems]
    return [str(p) for p in checked.problems]


def _assert_one_problem(path: Path, content: str | bytes, expected: str) -> None:
    """Write a dataset file with one fault in it: its one problem is `path` then `expected`."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    problems = _problems(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}{expected}"), problems


# -- A: YAML configs ------------------------------------------------------------------------------


def test_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb(10))
    # In a subprocess, so that an exponential walk fails the test instead of hanging it.
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from cts.foundation.yaml_config import ConfigError, read_yaml\n"
        "try:\n"
        "    read_yaml(Path(sys.argv[1]))\n"
        "except ConfigError as e:\n"
        "    print('ConfigError:', e)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(bomb)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a YAML alias bomb did not finish in 30 s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ConfigError: {bomb}:2: YAML aliases (*a0)")


def test_an_alias_is_refused_before_anything_is_composed(tmp_path, monkeypatch):
    """What bounds the work on any bomb: the refusal comes from one linear pass over the parse
    events; the composer and constructors, whose walk of aliases is exponential, never run."""
    import cts.foundation.yaml_config

    def composed(*args: object) -> None:
        raise AssertionError("the YAML was composed before its aliases were refused")

    monkeypatch.setattr(cts.foundation.yaml_config._Loader, "get_single_node", composed)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb(40))
    with pytest.raises(ConfigError, match=r":2: YAML aliases \(\*a0\) are not allowed"):
        read_yaml(bomb)


def test_yaml_alias_is_refused_with_file_and_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("base: &b {x: 1}\nname: t\nother: *b\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(config)
    assert str(e.value) == f"{config}:3: YAML aliases (*b) are not allowed in configs"


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """YAML keeps the last of two equal keys silently: `seeds: [0]` then `seeds: [1]` ran seed
    1 with nothing said. Nested mappings and mappings inside lists are checked too."""
    config = tmp_path / "config.yaml"
    config.write_text("name: t\nseeds: [0]\nconcurrency: 2\nseeds: [1]\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(config)
    assert str(e.value).startswith(f"{config}:4: key 'seeds' given twice (first at line 2)")
    nested = tmp_path / "nested.yaml"
    nested.write_text("roles:\n  judge: {model: a, model: b}\n")
    with pytest.raises(ConfigError, match=r"nested.yaml:2: key 'model' given twice"):
        read_yaml(nested)
    listed = tmp_path / "listed.yaml"
    listed.write_text("items:\n  - {id: 1}\n  - id: 2\n    id: 3\n")
    with pytest.raises(ConfigError, match=r"listed.yaml:4: key 'id' given twice"):
        read_yaml(listed)
    fine = tmp_path / "fine.yaml"
    fine.write_text("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n")
    assert read_yaml(fine)[0]["b"] == {"x": 2}


def test_yaml_config_with_invalid_utf8_is_a_config_error(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_bytes(b"name: x\ntitle: caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(config)
    assert str(e.value) == f"{config}:2: not valid UTF-8 (byte 0xe9)"


# -- B: instance ids that would name files outside the run directory ------------------------------

UNSAFE_IDS = ["../../x", "a/b", "a\\b", "a\x00b", "a\tb", "a\x7fb", ".", "..", "é" * 101]


def test_unsafe_instance_ids_are_row_problems(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(_row(key) for key in UNSAFE_IDS))
    problems = _problems(data)
    for line in range(1, len(UNSAFE_IDS) + 1):
        assert any(p.startswith(f"{data}:{line}: id: ") for p in problems), (line, problems)
    assert len(problems) == len(UNSAFE_IDS)


def test_data_validate_reports_unsafe_instance_ids(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(_row("ok") + _row("../../etc/x"))
    result = runner.invoke(app, ["data", "validate", str(data)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith(f"{data}:2: id: ")


def test_ordinary_ids_with_spaces_unicode_and_dots_pass(tmp_path):
    data = tmp_path / "d.jsonl"
    keys = ["q 1", "中文 问题", "v1.2.3", "a..b", ".hidden", "x" * 200]
    data.write_text("".join(_row(key) for key in keys))
    assert [i.id for i in load_instances(DatasetSource(path=str(data), corpus=None))] == keys


# -- C: dataset files that used to end in a traceback ---------------------------------------------


def test_dataset_jsonl_with_invalid_utf8_is_a_row_problem(tmp_path):
    jsonl = _row("a").encode() + b'{"id": "caf\xe9"}\n' + _row("b").encode()
    _assert_one_problem(tmp_path / "d.jsonl", jsonl, ":2: <row>: not valid UTF-8")


def test_dataset_csv_with_invalid_utf8_is_a_row_problem(tmp_path):
    csv = b"id,blurred_query,fused_query\na,q,q x\nb,caf\xe9,q y\n"
    _assert_one_problem(tmp_path / "d.csv", csv, ":3: <row>: not valid UTF-8")


def test_gold_table_with_invalid_utf8_is_a_problem(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(_row("a"))
    gold = tmp_path / "gold.jsonl"
    gold.write_bytes(b'{"id": "a", "text": "caf\xe9", "weight": 1}\n')
    problems = _problems(data, gold=GoldTable(path=str(gold)))
    assert problems and problems[0].startswith(f"{gold}:1: <row>: not valid UTF-8")


def test_dataset_json_with_invalid_utf8_is_a_problem(tmp_path):
    array = b'[\n{"id": "a"},\n{"id": "caf\xe9"}\n]\n'
    _assert_one_problem(tmp_path / "d.json", array, ":3: <row>: not valid UTF-8")


def test_meta_that_is_not_an_object_is_a_row_problem(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(_row("a", meta="text") + _row("b", meta=[1, 2]) + _row("c", meta={"k": 1}))
    problems = _problems(data)
    assert [p.split(": ")[0:2] for p in problems] == [[f"{data}:1", "meta"], [f"{data}:2", "meta"]]


def test_deeply_nested_json_line_is_a_row_problem(tmp_path):
    deep = '{"id": "b", "meta": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}\n"
    _assert_one_problem(tmp_path / "d.jsonl", _row("a") + deep + _row("c"), ":2: <row>: ")


def test_meta_too_deep_to_serialize_is_a_row_problem(tmp_path):
    # json.loads reads 500 levels, but pydantic cannot serialize them (the dataset digest a
    # run computes at start): validation must say so, not the run.
    too_deep = _row("a", meta={"x": json.loads("[" * 500 + "]" * 500)})
    _assert_one_problem(tmp_path / "d.jsonl", too_deep, ":1: meta: ")


def test_deeply_nested_json_in_a_csv_cell_is_a_row_problem(tmp_path):
    cell = '"' + "[" * 10_000 + "]" * 10_000 + '"'  # under csv's field size limit
    csv = f"id,blurred_query,fused_query,removed_constraints\na,q,q x,{cell}\n"
    _assert_one_problem(tmp_path / "d.csv", csv, ":2: removed_constraints")


def test_deeply_nested_json_file_is_a_problem(tmp_path):
    _assert_one_problem(tmp_path / "d.json", "[" * 100_000 + "]" * 100_000, ":1: <row>: ")


def test_parquet_file_that_is_not_parquet_is_a_problem(tmp_path):
    _assert_one_problem(tmp_path / "d.parquet", _row("a"), ": <file>: not a readable Parquet file")


def test_csv_with_a_utf8_bom_reads_its_first_column(tmp_path):
    data = tmp_path / "d.csv"
    data.write_bytes("\ufeffid,blurred_query,fused_query\na,q,q x\n".encode())
    assert [i.id for i in load_instances(DatasetSource(path=str(data), corpus=None))] == ["a"]


def test_csv_with_a_duplicate_column_is_a_problem(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("id,blurred_query,fused_query,id\na,q,q x,b\n")
    problems = _problems(data)
    assert problems == [f"{data}:1: <row>: malformed CSV header: duplicate column 'id'"]


def test_empty_dataset_is_a_problem(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n")
    assert _problems(data) == [f"{data}: <dataset>: no instances"]
    result = runner.invoke(app, ["data", "validate", str(data)])
    assert result.exit_code == 1 and "OK" not in result.output


@pytest.mark.parametrize("limit", ["0", "-2"])
def test_a_limit_below_one_is_refused_not_read_as_everything(limit):
    """`--limit 0` used to run the whole dataset, a negative limit sliced from its end."""
    from cts.eval.run.config import load_experiment

    with pytest.raises(ConfigError, match=r"--set dataset.limit: .*greater than or equal to 1"):
        load_experiment("quickstart", [f"dataset.limit={limit}"])
