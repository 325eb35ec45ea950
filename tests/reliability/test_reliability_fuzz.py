"""Property-based fuzzing of every input parser (issue 13 §2).

For any input (arbitrary bytes or text, JSON/YAML nested deeply, odd unicode, lone surrogates,
NUL, numbers too long to convert), each parser returns a value or raises its domain error
(DatasetError / CorpusError / ConfigError / ConstrainedOutputError, or a ProtocolError turn),
never another exception. The strategies mostly build valid input (rows, configs, turns, judge
answers) and inject a few faults into it (fields removed, renamed or replaced by hostile
values, bytes inserted or cut), so that the fuzzer reaches past the first parse error; the rest
is raw arbitrary input. Each property prints how many examples it ran and how they ended
(`pytest -s`), which shows that both the valid and the error paths are reached.

Budgets are small and derandomized, so CI is reproducible; CTS_FUZZ_EXAMPLES=2000 hunts harder.
The plain tests at the end pin the cases the fuzzer found.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cts.agents.clarifier import questions_schema
from cts.agents.judge import LABELS, judge, judge_schema
from cts.agents.nugget_builder import nuggets_schema
from cts.configs import DEFAULT_EXPERIMENT
from cts.eval.data.dataset import DatasetSource, GoldTable, load_instances
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import CONSTRAINT_TYPES, Instance
from cts.eval.run.config import ExperimentConfig, load_experiment
from cts.foundation.yaml_config import ConfigError, load_config, parse_override
from cts.serving.errors import ConstrainedOutputError
from cts.serving.outputs import validate_output
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import (
    ChatRequest,
    ChoiceOutput,
    JsonSchemaOutput,
    OutputSpec,
    RegexOutput,
    Sampling,
)
from cts.webdancer.agent import FINAL_REGEX, TURN_REGEX
from cts.webdancer.corpus import CorpusError, Problem, load_corpus
from cts.webdancer.protocol import TOOL_NAMES, FinalAnswer, ProtocolError, ToolCall, parse_turn

#: What draws a value from a strategy (`data.draw`, or a composite's `draw`).
Draw = Callable[..., Any]

EXAMPLES = int(os.environ.get("CTS_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Ran:
    """Examples a property ran and how each ended (a value, or which domain error)."""

    name: str
    outcomes: Counter[str] = field(default_factory=Counter)

    def __call__(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def attempt(self, call: Callable[[], object], error: type[Exception], failed: str) -> bool:
        """Whether `call` passed; if it raised `error` (with a message), it is counted `failed`."""
        try:
            call()
        except error as e:
            assert str(e)
            self(failed)
            return False
        return True

    def report(self) -> None:
        examples = sum(self.outcomes.values())
        ends = ", ".join(f"{n} {outcome}" for outcome, n in self.outcomes.most_common())
        print(f"\n[fuzz] {self.name}: {examples} examples ({ends})")
        assert examples > 0  # the property really ran


# -- building blocks ------------------------------------------------------------------------------

#: Characters that break parsers: NUL and controls, lone surrogates, BOM, line and paragraph
#: separators, bidi overrides, combining marks, astral and CJK, and syntax characters.
ODD = st.sampled_from(
    [
        *"\x00\x01\x1c\x85\t\r\n \\\"'{}[],:#&*!%|>-?=.~@`$/<",
        "\r\n",
        "\ud800",
        "\udfff",
        "\udc80",
        "\ufeff",
        "\u2028",
        "\u2029",
        "\u202e",
        "e\u0301",
        "𝕏",
        "北京",
        "١٢٣",
    ]
)


def texts(max_size: int = 20) -> st.SearchStrategy[str]:
    """Plain text, text with any code point (lone surrogates included), and odd pieces."""
    return st.one_of(
        st.text(max_size=max_size),
        st.text(st.characters(exclude_categories=()), max_size=max_size),
        st.lists(st.one_of(ODD, st.text(max_size=3)), max_size=max_size // 2).map("".join),
    )


#: JSON text no Python value serializes to: numbers too long or too large, nesting deeper than
#: the parsers recurse, escaped lone surrogates and NUL. `Raw(i)` is written as RAW_JSON[i].
RAW_JSON = [
    "1" * 5000,
    "-" + "9" * 4400,
    "1e99999",
    "NaN",
    "-Infinity",
    "[" * 3000 + "]" * 3000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    "[" * 150 + "]" * 150,
    '"\\ud800"',
    '"\\u0000"',
]


@dataclass(frozen=True)
class Raw:
    index: int


def raw_tokens(tokens: list[str]) -> st.SearchStrategy[Raw]:
    return st.integers(0, len(tokens) - 1).map(Raw)


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value, hostile leaves (`Raw`) included, nested a little."""
    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), texts(), raw_tokens(RAW_JSON)
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(texts(8), inner, max_size=3)
        ),
        max_leaves=6,
    )


def _swapped(value: Any, tokens: list[str], raws: list[str]) -> Any:
    """`value` with each `Raw` replaced by a placeholder (its token appended to `raws`)."""
    if isinstance(value, Raw):
        raws.append(tokens[value.index])
        return f"rawtoken{len(raws) - 1}x"
    if isinstance(value, dict):
        return {k: _swapped(v, tokens, raws) for k, v in value.items()}
    if isinstance(value, list):
        return [_swapped(v, tokens, raws) for v in value]
    return value


def dumps(value: Any, ensure_ascii: bool = True) -> str:
    """JSON text of `value`, with each `Raw` written as its raw token."""
    raws: list[str] = []
    text = json.dumps(_swapped(value, RAW_JSON, raws), ensure_ascii=ensure_ascii)
    for i, token in enumerate(raws):
        text = text.replace(f'"rawtoken{i}x"', token, 1)
    return text


def encode(text: str) -> bytes:
    """UTF-8, writing a lone surrogate as its (invalid) 3-byte form."""
    return text.encode("utf-8", "surrogatepass")


#: Faults injected into one valid input: none in about a third of the examples.
FAULTS = st.sampled_from([0, 0, 1, 1, 2, 3])


@st.composite
def mutated(draw: st.DrawFn, value: Any, values: st.SearchStrategy[Any] | None = None) -> Any:
    """`value` (a JSON tree, changed in place) with a few fields removed, renamed or replaced
    by `values` (default: any JSON value)."""
    values = values if values is not None else json_values()
    for _ in range(draw(FAULTS)):
        slots: list[tuple[Any, Any]] = []
        stack = [value]
        while stack:
            node = stack.pop()
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in list(items):
                slots.append((node, key))
                if isinstance(child, (dict, list)):
                    stack.append(child)
        if not slots:
            break
        node, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["replace", "replace", "remove", "rename"]))
        if op == "replace":
            node[key] = draw(values)
        elif op == "remove":
            del node[key]
        elif isinstance(node, dict):
            node[draw(texts(8))] = node.pop(key)
    return value


@st.composite
def bytes_mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data`, in a quarter of the examples with a byte-level edit or two: an insertion, a
    cut, or the rest dropped."""
    if draw(st.integers(0, 3)):
        return data
    pieces = st.one_of(
        st.binary(max_size=4),
        st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\x00", b"\r", b'"', b"\n", b"\xef\xbb\xbf"]),
    )
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "cut", "truncate"]))
        if op == "insert":
            data = data[:i] + draw(pieces) + data[i:]
        elif op == "cut":
            data = data[:i] + data[i + draw(st.integers(1, 8)) :]
        else:
            data = data[:i]
    return data


def line_count(data: bytes) -> int:
    """Lines as a text reader counts them (universal newlines)."""
    return data.count(b"\n") + data.count(b"\r") + 1


def check_problems(problems: list[Problem], files: set[str], lines: int | None) -> None:
    """Every problem names one of `files`, a line inside it (or none) and a field."""
    assert problems
    for problem in problems:
        assert problem.file in files, problem
        assert problem.line is None or 1 <= problem.line <= (lines or problem.line), problem
        assert isinstance(problem.field, str) and problem.field, problem
        assert isinstance(problem.message, str) and problem.message, problem
        assert str(problem)


# -- datasets -------------------------------------------------------------------------------------

#: Doc ids of the shipped sample corpus, which nugget `source_ids` are checked against.
DOC_IDS = ["A-0001", "A-0002", "A-0003"]


@st.composite
def instance_row(draw: st.DrawFn, i: int) -> dict[str, Any]:
    """A valid instance (the faults are injected over the whole table)."""
    row: dict[str, Any] = {
        "id": f"q{i}",
        "blurred_query": draw(st.sampled_from(["Which earbuds?", "电池多久?"])),
        "fused_query": draw(st.sampled_from(["Which Korvex earbuds?", "Korvex 电池多久?"])),
        "language": draw(st.sampled_from(["en", "zh", "zh-CN"])),
        "removed_constraints": draw(st.lists(st.sampled_from(CONSTRAINT_TYPES), max_size=2)),
        "golden": {
            "nuggets": [
                {
                    "id": f"n{j}",
                    "text": "A fact.",
                    "weight": draw(st.sampled_from([1, 2.5])),
                    "source_ids": draw(st.lists(st.sampled_from(DOC_IDS), max_size=2)),
                }
                for j in range(draw(st.integers(1, 2)))
            ]
        },
    }
    if draw(st.booleans()):
        row["meta"] = {"source": "fuzz"}
    return row


@st.composite
def instance_rows(draw: st.DrawFn) -> list[Any]:
    made = [draw(instance_row(i)) for i in range(draw(st.integers(0, 4)))]
    return draw(mutated(made))


def jsonl(draw: Draw, items: list[Any]) -> bytes:
    ascii_only = draw(st.booleans())
    lines = [dumps(item, ensure_ascii=ascii_only) for item in items]
    if draw(st.integers(0, 4)) == 0:  # a blank line, or one that is no JSON object
        lines.insert(draw(st.integers(0, len(lines))), draw(texts()))
    return encode("\n".join(lines) + "\n")


def json_array(draw: Draw, items: list[Any]) -> bytes:
    ascii_only = draw(st.booleans())
    indent = draw(st.sampled_from([None, 2]))
    body = json.dumps([f"item{i}x" for i in range(len(items))], indent=indent)
    for i, item in enumerate(items):
        body = body.replace(f'"item{i}x"', dumps(item, ensure_ascii=ascii_only), 1)
    if draw(st.booleans()):
        body = f'{{"{draw(st.sampled_from(["data", "instances", "rows", "x"]))}": {body}}}'
    return encode(body)


def cell(value: Any) -> str:
    """A CSV cell: lists and objects as JSON text, as spreadsheets hold them."""
    if isinstance(value, (dict, list, Raw)):
        return dumps(value)
    return "" if value is None else str(value)


def csv_table(draw: Draw, items: list[Any], delimiter: str) -> bytes:
    dicts = [item for item in items if isinstance(item, dict)]
    header = list(dict.fromkeys(str(k) for d in dicts for k in d)) or ["id"]
    if draw(st.integers(0, 5)) == 0:
        header.append(draw(st.sampled_from(header)))  # a repeated column
    out = io.StringIO()
    terminator = draw(st.sampled_from(["\n", "\r\n"]))
    writer = csv.writer(out, delimiter=delimiter, lineterminator=terminator)
    writer.writerow(header)
    for d in dicts:
        cells = [cell(d.get(k)) for k in header]
        if draw(st.integers(0, 5)) == 0:
            cells = cells[: draw(st.integers(0, len(cells)))]  # a short row
        writer.writerow(cells)
    text = ("\ufeff" if draw(st.booleans()) else "") + out.getvalue()
    return encode(text)


def _utf8(value: Any) -> Any:
    """`value` with lone surrogates replaced: Arrow strings are UTF-8, so Parquet cannot hold
    them (a reader never sees one)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    return value


def parquet_table(items: list[Any], path: Path) -> None:
    """`items` as Parquet: a column Arrow cannot type (mixed values) is written as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow_errors = (pa.ArrowException, OverflowError, ValueError, TypeError)
    dicts = [_utf8(item) for item in items if isinstance(item, dict)]
    columns: dict[str, list[Any]] = {}
    for key in dict.fromkeys(str(k) for d in dicts for k in d):
        values = [d.get(key) for d in dicts]
        try:
            pa.array(values)
        except arrow_errors:
            values = [None if v is None else cell(v) for v in values]
        columns[key] = values
    if not columns:
        columns = {"id": []}
    try:
        pq.write_table(pa.table(columns), path)
    except arrow_errors:  # e.g. an empty object: a struct with no fields has no Parquet type
        texts = {k: [None if v is None else cell(v) for v in vs] for k, vs in columns.items()}
        pq.write_table(pa.table(texts), path)


FORMATS = [".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet"]


@st.composite
def dataset_file(draw: st.DrawFn, directory: Path, stem: str, items: list[Any]) -> Path:
    """`items` written in a random format (bytes sometimes mutated), or arbitrary bytes."""
    suffix = draw(st.sampled_from(FORMATS))
    path = directory / f"{stem}{suffix}"
    if draw(st.integers(0, 9)) == 0:
        head = b"PAR1" if suffix == ".parquet" else b""
        path.write_bytes(head + draw(st.binary(max_size=200)))
        return path
    if suffix == ".parquet":
        parquet_table(items, path)
        if draw(st.integers(0, 7)) == 0:
            data = path.read_bytes()
            i = draw(st.integers(0, len(data)))
            path.write_bytes(data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i + 1 :])
        return path
    if suffix in (".jsonl", ".ndjson"):
        data = jsonl(draw, items)
    elif suffix == ".json":
        data = json_array(draw, items)
    else:
        data = csv_table(draw, items, "\t" if suffix == ".tsv" else ",")
    path.write_bytes(draw(bytes_mutated(data)))
    return path


def gold_table(draw: Draw, ids: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """A gold table (wide or long) for `ids` with faults, and the GoldTable options for it."""
    if draw(st.booleans()):  # wide: one row per instance, its nuggets in a list
        items: list[Any] = [
            {"qid": i, "items": [{"nid": "n1", "fact": "A fact.", "grade": "vital"}]} for i in ids
        ]
        options: dict[str, Any] = {"id_field": "qid", "nuggets_field": "items"}
    else:  # long: one row per nugget
        items = [
            {"qid": i, "nid": f"n{j}", "fact": "A fact.", "grade": "okay"}
            for i in ids
            for j in (1, 2)
        ]
        options = {"id_field": "qid"}
    options["nugget_field_map"] = {"id": "nid", "text": "fact", "weight": "grade"}
    options["weight_map"] = {"vital": 2.0, "okay": 1.0}
    return draw(mutated(items)), options


#: How foreign datasets name our fields (dotted: nested), and names that match nothing.
FIELD_MAPS: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.sampled_from(["qid", "meta.id"]),
            "blurred_query": st.sampled_from(["question", "q.vague"]),
            "fused_query": st.sampled_from(["intent.full", "full"]),
        },
    ),
    st.dictionaries(
        st.sampled_from(["id", "blurred_query", "fused_query", "language", "meta", "golden"]),
        st.one_of(st.sampled_from(["a..b", ".", "", "golden"]), texts(6)),
        max_size=2,
    ),
)


def _renamed(items: list[Any], field_map: dict[str, str]) -> list[Any]:
    """Rows whose columns are named as `field_map` says (dotted names nest)."""
    out = []
    for item in items:
        if isinstance(item, dict):
            item = dict(item)
            for ours, theirs in field_map.items():
                if ours not in item:
                    continue
                value = item.pop(ours)
                *parents, last = theirs.split(".")
                node = item
                for part in parents:
                    child = node.setdefault(part, {})
                    node = child if isinstance(child, dict) else {}
                node[last] = value
        out.append(item)
    return out


def test_dataset_loaders_fuzz(tmp_path):
    ran = Ran("dataset loaders (load_instances: JSONL/JSON/CSV/TSV/Parquet, gold join, corpus)")

    @FUZZ
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        for old in tmp_path.iterdir():
            old.unlink()
        field_map = data.draw(FIELD_MAPS)
        rows = data.draw(instance_rows())
        items = _renamed(rows, field_map)
        queries = data.draw(dataset_file(tmp_path, "queries", items))
        files = {str(queries)}
        gold = None
        if data.draw(st.integers(0, 3)) == 0:
            ids = [str(r.get("id")) for r in rows if isinstance(r, dict)]
            gold_items, options = gold_table(data.draw, ids)
            gold_path = data.draw(dataset_file(tmp_path, "gold", gold_items))
            gold = GoldTable(path=str(gold_path), **options)
            files.add(str(gold_path))
        corpus = data.draw(st.sampled_from(["sample", "sample", None, "~nosuchuser-cts/c.jsonl"]))
        source = DatasetSource(
            path=str(queries), split=None, field_map=field_map, gold=gold, corpus=corpus
        )
        try:
            instances = load_instances(source)
        except DatasetError as e:
            text_file = queries.suffix != ".parquet" and gold is None
            check_problems(
                e.problems, files, line_count(queries.read_bytes()) if text_file else None
            )
            ran("DatasetError")
        else:
            assert all(isinstance(i, Instance) for i in instances)
            assert len({i.id for i in instances}) == len(instances)
            ran("loaded")

    prop()
    ran.report()


@st.composite
def corpus_lines(draw: st.DrawFn) -> list[Any]:
    docs = [
        {
            "doc_id": f"D-{i}",
            "url": "https://x.example/a",
            "title": draw(st.sampled_from(["T", "标题", ""])),
            "text": "Some text.",
            "date": draw(st.sampled_from(["2024", "2024-05-01"])),
            "language": draw(st.sampled_from(["en", "zh-CN"])),
        }
        for i in range(draw(st.integers(0, 3)))
    ]
    return draw(mutated(docs))


def test_corpus_loader_fuzz(tmp_path):
    ran = Ran("corpus loader (cts.webdancer.corpus.load_corpus)")
    path = tmp_path / "corpus.jsonl"

    @FUZZ
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        if data.draw(st.integers(0, 9)) == 0:
            content = data.draw(st.binary(max_size=300))
        else:
            content = data.draw(bytes_mutated(jsonl(data.draw, data.draw(corpus_lines()))))
        path.write_bytes(content)
        try:
            documents = load_corpus(path)
        except CorpusError as e:
            check_problems(e.problems, {str(path)}, line_count(content))
            ran("CorpusError")
        else:
            assert len({d.doc_id for d in documents}) == len(documents)
            ran("loaded")

    prop()
    ran.report()


# -- configs and --set ----------------------------------------------------------------------------

#: YAML text no Python value dumps to: bad dates, long integers, bad tags, aliases, deep nesting.
RAW_YAML = [
    "2026-13-45",
    "1" * 5000,
    "!!timestamp garbage",
    "!!bool maybe",
    "!!int abc",
    "!!float x",
    "!!binary '*'",
    "!!python/object/apply:os.system ['true']",
    "!!set [a]",
    "*nope",
    "&a [1]",
    "[" * 3000,
    "[" * 600 + "]" * 600,
    ".nan",
    "'unterminated",
    '"\\ud800"',
]

#: --set overrides a user would write (valid), to inject faults into.
VALID_SETS = [
    ("roles.clarifier.model", "qwen3-8b"),
    ("roles.judge.sampling.temperature", "0.5"),
    ("models.smollm2-135m-instruct.sampling.max_tokens", "64"),
    ("dataset.limit", "2"),
    ("dataset.field_map.id", "qid"),
    ("search.date", "2026-11-30"),
    ("search.top_k", "5"),
    ("budgets.max_llm_calls", "4"),
    ("clarification.answer_span.max_words", "8"),
    ("golden.seed", "7"),
    ("seeds", "[0, 1]"),
    ("conditions", "[blurred, oracle]"),
    ("output_dir", "runs/{name}-{clarifier}"),
    ("cache.path", "~/x.sqlite"),
    ("report.min_gap", "2"),
]
#: Keys no config has, or that cannot be set.
BAD_KEYS = ["roles.nobody.model", "name.x", "seeds.0", "", ".", "a" + ".b" * 60, "models.x.engine"]


def set_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(RAW_YAML),
        st.sampled_from(["", "null", "[0, 0]", "{a: 1}", "{name.__class__}", "-1"]),
        texts(12),
    )


@st.composite
def set_override(draw: st.DrawFn) -> str:
    key, value = draw(st.sampled_from(VALID_SETS))
    fault = draw(st.integers(0, 5))
    if fault == 1:
        key = draw(st.sampled_from(BAD_KEYS))
    elif fault == 2:
        value = draw(set_values())
    elif fault == 3:
        return draw(texts(30))
    return f"{key}={value}"


def yaml_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        texts(12),
        raw_tokens(RAW_YAML),
        st.sampled_from(["runs/{name}", "{name.__class__}", "{", "qwen3-8b", "x.yaml", "llm"]),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(texts(8), inner, max_size=3)
        ),
        max_leaves=6,
    )


def yaml_dump(value: Any) -> str:
    """YAML text of `value`, with each `Raw` written as its raw token."""
    raws: list[str] = []
    text = yaml.safe_dump(_swapped(value, RAW_YAML, raws), allow_unicode=True, sort_keys=False)
    for i, token in enumerate(raws):
        text = text.replace(f"rawtoken{i}x", token, 1)
    return text


BASE_EXPERIMENT = yaml.safe_load(DEFAULT_EXPERIMENT.read_text(encoding="utf-8"))


def test_config_loader_and_set_overrides_fuzz(tmp_path):
    ran = Ran("config loader (load_config(ExperimentConfig), load_experiment) with --set")
    path = tmp_path / "experiments" / "fuzz.yaml"
    path.parent.mkdir()

    @FUZZ
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        kind = data.draw(st.integers(0, 9))
        if kind == 0:
            content = data.draw(st.binary(max_size=200))
        elif kind == 1:
            content = encode(data.draw(texts(80)))
        else:
            experiment = json.loads(json.dumps(BASE_EXPERIMENT))
            content = encode(yaml_dump(data.draw(mutated(experiment, yaml_values()))))
            content = data.draw(bytes_mutated(content))
        path.write_bytes(content)
        overrides = data.draw(st.lists(set_override(), max_size=3))
        try:
            loaded = load_config(ExperimentConfig, path, overrides)
        except ConfigError as e:
            # It names the file (and line) or the override it is about.
            assert str(e).startswith((str(path), "--set")), str(e)
            ran("ConfigError")
            return
        assert isinstance(loaded.config, ExperimentConfig)
        # Past validation: every role's model config (a shipped file or inline `models:`).
        failed = "valid, ConfigError resolving models"
        if ran.attempt(lambda: load_experiment(path, overrides), ConfigError, failed):
            ran("resolved")

    prop()
    ran.report()


def test_set_parser_fuzz():
    ran = Ran("--set parser (parse_override)")

    @FUZZ
    @given(
        st.one_of(
            set_override(),
            st.tuples(
                st.sampled_from([k for k, _ in VALID_SETS] + BAD_KEYS),
                st.one_of(set_values(), yaml_values().map(yaml_dump)),
            ).map("=".join),
            texts(40),
        )
    )
    def prop(text: str) -> None:
        try:
            override = parse_override(text)
        except ConfigError as e:
            assert str(e).startswith("--set ")
            ran("ConfigError")
        else:
            assert override.keys and all(isinstance(k, str) for k in override.keys)
            ran("parsed")

    prop()
    ran.report()


# -- the WebDancer turn parser --------------------------------------------------------------------


@st.composite
def turns(draw: st.DrawFn) -> str:
    """An assistant turn: a tool call and/or an answer, its JSON valid, tolerable (JSON5),
    faulty or hostile; or arbitrary text."""
    if draw(st.integers(0, 5)) == 0:
        return draw(texts(120))
    think = f"<think>{draw(texts(20))}</think>\n"
    payload = {
        "name": draw(st.sampled_from([*TOOL_NAMES, "shell"])),
        "arguments": {"query": [draw(texts(10))], "url": ["https://x.example"], "goal": "g"},
    }
    payload = draw(mutated(payload))
    style = draw(st.sampled_from(["json", "json5", "string-arguments", "raw", "text"]))
    if style == "json":
        body = dumps(payload, ensure_ascii=draw(st.booleans()))
    elif style == "json5":
        body = dumps(payload).replace('"', "'") + draw(st.sampled_from(["", ",", " // c"]))
    elif style == "string-arguments":
        arguments = draw(st.one_of(raw_tokens(RAW_JSON), st.just(payload.get("arguments"))))
        body = dumps({**payload, "arguments": dumps(arguments)})
    elif style == "raw":
        body = draw(st.sampled_from(RAW_JSON))
    else:
        body = draw(texts(30))
    call = f"<tool_call>\n{body}\n" + draw(st.sampled_from(["</tool_call>", ""]))
    answer = f"<answer>{draw(texts(20))}" + draw(st.sampled_from(["</answer>", ""]))
    shape = draw(
        st.sampled_from(
            [[call], [call], [answer], [call, answer], [answer, call], [call, "<tool_response>"]]
        )
    )
    return think + "".join(shape)


def test_turn_parser_fuzz():
    ran = Ran("WebDancer turn parser (parse_turn)")

    @FUZZ
    @given(turns())
    def prop(text: str) -> None:
        turn = parse_turn(text)
        assert isinstance(turn, (ToolCall, FinalAnswer, ProtocolError))
        if isinstance(turn, ToolCall):
            assert turn.name in TOOL_NAMES and isinstance(turn.arguments, dict)
        ran(type(turn).__name__)

    prop()
    ran.report()


# -- the judge and constrained answers ------------------------------------------------------------


@dataclass(frozen=True)
class _Nugget:
    id: str
    text: str


def judge_answer(data: st.DataObject, ids: list[str]) -> str:
    """A judge answer for `ids`: valid labels with faults injected, or arbitrary text."""
    if data.draw(st.integers(0, 5)) == 0:
        return data.draw(st.one_of(texts(60), st.sampled_from(RAW_JSON)))
    labels = {
        i: {"evidence": data.draw(st.sampled_from(["", "quote", "引文"])), "label": label}
        for i, label in zip(
            ids,
            data.draw(st.lists(st.sampled_from(LABELS), min_size=len(ids), max_size=len(ids))),
            strict=True,
        )
    }
    hostile = st.one_of(json_values(), st.sampled_from(["FULL", "x" * 121, "\ud800", "\x00"]))
    text = dumps(data.draw(mutated(labels, hostile)), ensure_ascii=data.draw(st.booleans()))
    # What a server sends is UTF-8: a lone surrogate cannot survive it.
    return data.draw(bytes_mutated(encode(text))).decode("utf-8", "replace")


def test_judge_output_parser_fuzz():
    ran = Ran("judge answer parser (judge() over validate_output, id-keyed schema)")
    ids = st.lists(
        st.one_of(st.sampled_from(["n1", "n2", "n3"]), texts(6)),
        min_size=1,
        max_size=12,
        unique=True,
    )

    @FUZZ
    @given(ids, st.data())
    def prop(nugget_ids: list[str], data: st.DataObject) -> None:
        def script(request: ChatRequest) -> str:
            assert isinstance(request.output, JsonSchemaOutput)
            return judge_answer(data, list(request.output.json_schema["required"]))

        engine = ScriptedEngine(script, "judge")
        nuggets = [_Nugget(i, "A fact.") for i in nugget_ids]
        try:
            labels = asyncio.run(judge(engine, "An answer.", nuggets, "en", Sampling()))
        except ConstrainedOutputError as e:
            assert str(e)
            ran("ConstrainedOutputError")
        else:
            assert set(labels) == set(nugget_ids)
            for label in labels.values():
                assert label.label in LABELS
                assert isinstance(label.evidence, str) and len(label.evidence) <= 120
            ran("labelled")

    prop()
    ran.report()


#: The project's own output specs, and a valid answer for each JSON one.
SPECS: list[tuple[OutputSpec, Any]] = [
    (
        JsonSchemaOutput(name="nugget_labels", json_schema=judge_schema(["n1", "n2"])),
        {"n1": {"evidence": "q", "label": "full"}, "n2": {"evidence": "", "label": "none"}},
    ),
    (
        JsonSchemaOutput(name="clarifying_questions", json_schema=questions_schema(2, True)),
        {"questions": ["Which year?", "Which city?"]},
    ),
    (
        JsonSchemaOutput(name="golden_nuggets", json_schema=nuggets_schema(["A-0001"], 3)),
        {"nuggets": [{"text": "A fact.", "weight": 2, "source_ids": ["A-0001"]}]},
    ),
    (RegexOutput(pattern=TURN_REGEX), None),
    (RegexOutput(pattern=FINAL_REGEX), None),
    (ChoiceOutput(choices=("yes", "no")), None),
]


def test_constrained_answer_validation_fuzz():
    ran = Ran("constrained answer validation (cts.serving.outputs.validate_output)")

    @FUZZ
    @given(st.sampled_from(range(len(SPECS))), st.data())
    def prop(index: int, data: st.DataObject) -> None:
        spec, valid = SPECS[index]
        if valid is not None and data.draw(st.integers(0, 3)):
            text = dumps(data.draw(mutated(json.loads(json.dumps(valid)))))
        elif isinstance(spec, RegexOutput) and data.draw(st.integers(0, 3)):
            text = data.draw(turns())
        elif isinstance(spec, ChoiceOutput) and data.draw(st.booleans()):
            text = data.draw(st.sampled_from(["yes", "no", "Yes", "yes ", ""]))
        else:
            text = data.draw(st.one_of(texts(60), st.sampled_from(RAW_JSON)))
        failed = "ConstrainedOutputError"
        if ran.attempt(lambda: validate_output(spec, text), ConstrainedOutputError, failed):
            ran("valid")

    prop()
    ran.report()


# -- what the fuzzer found, pinned ----------------------------------------------------------------

LONG_INT = "1" * 5000  # int() refuses more than 4300 digits with a plain ValueError
DEEP = "[" * 3000 + "]" * 3000  # deeper than json/json5/PyYAML recurse


def _dataset_problems(path: Path, **source: Any) -> list[str]:
    with pytest.raises(DatasetError) as e:
        load_instances(DatasetSource(path=str(path), split=None, corpus=None, **source))
    return [str(p) for p in e.value.problems]


def test_dataset_rows_with_a_too_long_integer_are_problems_on_their_line(tmp_path):
    row = '{"id": "q1", "blurred_query": "a", "fused_query": "a b"}'
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text(f'{row}\n{{"id": {LONG_INT}}}\n')
    assert _dataset_problems(jsonl) == [
        f"{jsonl}:2: <row>: malformed JSON: a number with too many digits"
    ]
    array = tmp_path / "q.json"
    array.write_text(f"[{row}, {LONG_INT}]")
    assert _dataset_problems(array) == [
        f"{array}:1: <row>: malformed JSON: a number with too many digits"
    ]


def test_a_csv_cell_with_a_too_long_integer_stays_text_for_the_schema_to_report(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text(f'id,blurred_query,fused_query,golden\nq1,a,a b,"[{LONG_INT}]"\n')
    problems = _dataset_problems(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: golden: ")


def test_json_rows_under_a_key_report_their_own_lines(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(
        '{"data": [\n  {"id": "q1", "blurred_query": "a", "fused_query": "a b"},\n\n  3\n]}'
    )
    assert _dataset_problems(path) == [f"{path}:4: <row>: expected a JSON object, got int"]


def test_paths_under_an_unknown_home_are_not_found_instead_of_a_traceback(tmp_path):
    missing = "~nosuchuser-cts/q.jsonl"
    assert _dataset_problems(Path(missing)) == [f"{missing}: <file>: no such file or folder"]
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        '{"id": "q1", "blurred_query": "a", "fused_query": "a b", "golden": {"nuggets": '
        '[{"id": "n1", "text": "t", "weight": 1, "source_ids": ["A-0001"]}]}}\n'
    )
    with pytest.raises(DatasetError) as e:
        load_instances(DatasetSource(path=str(queries), corpus=missing))
    assert [p.message for p in e.value.problems] == [f"'A-0001' not in corpus {missing}"]
    assert _dataset_problems(queries, gold=GoldTable(path=missing))[0] == (
        f"{missing}: <file>: no such file or folder"
    )


def test_corpus_rows_with_a_too_long_integer_or_an_empty_field_name(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        f'{{"doc_id": {LONG_INT}}}\n{{"doc_id": "d", "url": "u", "text": "t", "": 1}}\n'
    )
    with pytest.raises(CorpusError) as e:
        load_corpus(path)
    assert [str(p) for p in e.value.problems] == [
        f"{path}:1: <row>: malformed JSON: a number with too many digits",
        f"{path}:2: <row>: unknown field",
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2026-13-45", "'2026-13-45' is not a valid timestamp (month must be in 1..12)"),
        ("!!timestamp garbage", "'garbage' is not a valid timestamp"),
        ("!!bool maybe", "'maybe' is not a valid bool"),
        ("!!int abc", "'abc' is not a valid int"),
        ("!!float x", "'x' is not a valid float"),
        (LONG_INT, "is not a valid int (Exceeds the limit (4300 digits)"),
    ],
)
def test_yaml_scalars_that_are_no_value_are_config_errors_at_their_line(tmp_path, value, message):
    path = tmp_path / "x.yaml"
    path.write_text(f"name: q\ndescription: {value}\n")
    with pytest.raises(ConfigError) as e:
        load_config(ExperimentConfig, path)
    assert str(e.value).startswith(f"{path}: not valid YAML: ")
    assert message in str(e.value) and "line 2, column 14" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_override(f"description={value}")
    assert str(e.value).startswith("--set ") and message in str(e.value)


def test_yaml_nested_too_deeply_is_a_config_error(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(f"name: {DEEP}\n")
    # PyYAML's pure-Python composer runs out of recursion; libyaml has a limit of its own.
    deep = r"not valid YAML: (nested too deeply|(?s:.*)exceeded maximum nesting depth)"
    with pytest.raises(ConfigError, match=deep):
        load_config(ExperimentConfig, path)


def test_a_set_error_quotes_a_long_override_shortened():
    with pytest.raises(ConfigError) as e:
        parse_override(f"name=!!int {LONG_INT}")
    assert str(e.value).startswith("--set 'name=!!int 111") and len(str(e.value)) < 400


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (DEEP, "not a valid JSON"),  # json and json5 both recurse past the limit
        ("{'name': 'search', 'arguments': " + DEEP + "}", "not a valid JSON"),  # JSON5 only
        # arguments as a JSON string: the named tool refuses them, as in the release
        (json.dumps({"name": "search", "arguments": DEEP}), "[Search] Invalid request format"),
    ],
)
def test_a_tool_call_nested_too_deeply_is_a_protocol_error(body, message):
    turn = parse_turn(f"<think>t</think>\n<tool_call>\n{body}\n</tool_call>")
    assert isinstance(turn, ProtocolError) and message in turn.message


@pytest.mark.parametrize(
    ("text", "why"), [(DEEP, "nested too deeply"), (LONG_INT, "a number too long")]
)
def test_a_constrained_answer_that_json_cannot_convert_is_invalid(text, why):
    spec = JsonSchemaOutput(name="nugget_labels", json_schema=judge_schema(["n1"]))
    with pytest.raises(ConstrainedOutputError, match=why):
        validate_output(spec, text)


def test_file_paths_fuzz(tmp_path):
    ran = Ran("file paths (load_instances, load_corpus, load_config)")
    names = st.one_of(
        texts(30),
        st.sampled_from(["x" * 300, "a\x00b", "\ud800", "../" * 3, "~", ".", ""]),
    )

    folder = tmp_path / "empty"
    folder.mkdir()

    @FUZZ
    @given(names, st.sampled_from([".jsonl", ".csv", ".json", ".parquet", ".yaml", ".txt"]))
    def prop(name: str, suffix: str) -> None:
        # Absolute, so that it never reads as a `datasets` hub id (no network in tests), and
        # with a suffix, so that it never names a folder for `datasets` to scan.
        path = f"{folder}/{name}{suffix}"
        with pytest.raises(DatasetError):
            load_instances(DatasetSource(path=path, corpus=None))
        with pytest.raises(CorpusError):
            load_corpus(Path(path))
        with pytest.raises(ConfigError):
            load_config(ExperimentConfig, Path(path))
        ran("domain errors")

    prop()
    ran.report()


def test_a_file_name_too_long_is_a_domain_error_not_a_traceback(tmp_path):
    path = tmp_path / ("x" * 300 + ".jsonl")  # beyond NAME_MAX (255) of common file systems
    assert _dataset_problems(path) == [f"{path}: <file>: cannot read: File name too long"]
    with pytest.raises(CorpusError, match="cannot read: File name too long"):
        load_corpus(path)
    with pytest.raises(ConfigError, match="cannot read: File name too long"):
        load_config(ExperimentConfig, path)
