"""Dataset loading and validation: formats, foreign shapes, and one bad row per rule."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cts.eval.data.dataset import DatasetSource, GoldTable, check_source, load_instances
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Instance
from cts.webdancer.corpus import check_corpus

GOOD = {
    "id": "q1",
    "blurred_query": "best trail in the park",
    "fused_query": "best winter trail in Valmora park for beginners",
    "language": "en",
    "removed_constraints": ["time", "scope"],
    "golden": {
        "nuggets": [
            {"id": "n1", "text": "The Ridge Loop is 4 km.", "weight": 2.0, "source_ids": ["d1"]},
            {
                "id": "n2",
                "text": "It is open in winter.",
                "weight": 1.0,
                "source_ids": ["d1", "d2"],
            },
        ]
    },
    "meta": {"domain": "travel"},
}
SECOND = {
    **GOOD,
    "id": "q2",
    "language": "zh",
    "blurred_query": "公园步道",
    "fused_query": "2024年冬季公园步道",
    "removed_constraints": [],
    "golden": None,
    "meta": {},
}


def instances() -> list[Instance]:
    return [Instance.model_validate(GOOD), Instance.model_validate(SECOND)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def write_corpus(path: Path, ids: list[str]) -> Path:
    return write_jsonl(
        path,
        [
            {
                "doc_id": i,
                "url": f"https://x.example/{i}",
                "title": i,
                "text": "text",
                "date": "2024-01-02",
                "language": "en",
            }
            for i in ids
        ],
    )


def load(path: Path, **source) -> list[Instance]:
    return load_instances(DatasetSource(path=str(path), split=None, **source))


# -- round trips ----------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    rows = [i.model_dump(exclude_none=True) for i in instances()]
    assert load(write_jsonl(tmp_path / "d.jsonl", rows)) == instances()


def test_json_round_trip(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(
        json.dumps(
            [i.model_dump(exclude_none=True) for i in instances()], indent=2, ensure_ascii=False
        )
    )
    assert load(path) == instances()


def test_csv_round_trip_with_json_cells_and_delimited_constraints(tmp_path):
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "id",
                "blurred_query",
                "fused_query",
                "language",
                "removed_constraints",
                "golden",
                "meta",
            ]
        )
        for i in instances():
            writer.writerow(
                [
                    i.id,
                    i.blurred_query,
                    i.fused_query,
                    i.language,
                    ";".join(i.removed_constraints),
                    json.dumps(i.golden.model_dump(exclude_none=True)) if i.golden else "",
                    json.dumps(i.meta) if i.meta else "",
                ]
            )
    assert load(path) == instances()


def test_parquet_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [i.model_dump(mode="json") for i in instances()]
    for row in rows:  # parquet wants one type per column
        row["golden"] = json.dumps(row["golden"]) if row["golden"] else None
        row["meta"] = json.dumps(row["meta"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert load(tmp_path / "d.parquet") == instances()


def test_datasets_path_on_a_local_folder(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    rows = [
        {
            "id": i.id,
            "blurred_query": i.blurred_query,
            "fused_query": i.fused_query,
            "language": i.language,
        }
        for i in instances()
    ]
    write_jsonl(folder / "validation.jsonl", rows)
    loaded = load_instances(DatasetSource(path=str(folder), split="validation"))
    assert [i.id for i in loaded] == ["q1", "q2"]
    assert loaded[1].fused_query == "2024年冬季公园步道"


def test_a_missing_file_shaped_like_a_hub_id_is_a_missing_file(tmp_path, monkeypatch):
    """`data/hard518.jsonl` before the file is placed: no such file, not a hub lookup."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=r"data/hard518.jsonl: <file>: no such file or folder"):
        load_instances(DatasetSource(path="data/hard518.jsonl"))


def test_missing_hub_dataset_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(
        DatasetError,
        match=r"no-such-owner/no-such-data: <dataset>: "
        r"datasets.load_dataset failed.*offline mode is on",
    ):
        load_instances(DatasetSource(path="no-such-owner/no-such-data", split="test"))


# -- foreign shapes -------------------------------------------------------------------------------


def test_field_map_joins_a_query_csv_with_a_gold_jsonl(tmp_path):
    """The original release's shape: a queries CSV beside a gold JSONL, other column names."""
    queries = tmp_path / "hard_518_queries.csv"
    queries.write_text(
        "qid,fused_query,blurred_query,lang,category\n"
        "101,What did the Valmora council decide in March 2024?,What did the council decide?,"
        "en,politics\n"
        "102,Ticket price of the Esker night train in 2023,Ticket price of the night train,"
        "en,travel\n"
    )
    gold = write_jsonl(
        tmp_path / "gold_public_hard518.jsonl",
        [
            {
                "qid": 101,
                "nuggets": [
                    {
                        "nid": 1,
                        "fact": "It approved the budget.",
                        "importance": "vital",
                        "evidence": ["e1"],
                    },
                    {
                        "nid": 2,
                        "fact": "The vote was 7-2.",
                        "importance": "okay",
                        "evidence": ["e2"],
                    },
                ],
            },
            {
                "qid": 102,
                "nuggets": [
                    {"nid": 1, "fact": "It cost 40 euros.", "importance": "vital", "evidence": []}
                ],
            },
        ],
    )
    loaded = load_instances(
        DatasetSource(
            path=str(queries),
            split=None,
            field_map={"id": "qid", "language": "lang"},
            gold=GoldTable(
                path=str(gold),
                id_field="qid",
                nugget_field_map={
                    "id": "nid",
                    "text": "fact",
                    "weight": "importance",
                    "source_ids": "evidence",
                },
                weight_map={"vital": 2, "okay": 1},
            ),
        )
    )
    assert [i.id for i in loaded] == ["101", "102"]
    first = loaded[0]
    assert first.meta == {"category": "politics"}
    assert first.golden is not None
    assert [(n.id, n.text, n.weight, n.source_ids) for n in first.golden.nuggets] == [
        ("1", "It approved the budget.", 2.0, ["e1"]),
        ("2", "The vote was 7-2.", 1.0, ["e2"]),
    ]


def test_long_gold_table_one_row_per_nugget(tmp_path):
    queries = write_jsonl(
        tmp_path / "q.jsonl", [{"id": "a", "blurred_query": "x", "fused_query": "x in 2020"}]
    )
    gold = tmp_path / "gold.csv"
    gold.write_text("query_id,id,text,weight\na,n1,first fact,2\na,n2,second fact,1\n")
    (instance,) = load_instances(
        DatasetSource(
            path=str(queries), split=None, gold=GoldTable(path=str(gold), id_field="query_id")
        )
    )
    assert instance.golden is not None
    assert [n.weight for n in instance.golden.nuggets] == [2.0, 1.0]


def test_nested_field_map(tmp_path):
    path = write_jsonl(
        tmp_path / "n.jsonl", [{"key": "z", "intent": {"short": "a", "full": "a b"}}]
    )
    (instance,) = load(
        path, field_map={"id": "key", "blurred_query": "intent.short", "fused_query": "intent.full"}
    )
    assert (instance.blurred_query, instance.fused_query) == ("a", "a b")


# -- one bad row per rule -------------------------------------------------------------------------


def _nugget(**kw) -> dict:
    return {"id": "n1", "text": "fact", "weight": 1, "source_ids": ["d1"], **kw}


BAD_ROWS = [
    ("missing required field", {"id": "a", "blurred_query": "x"}, "fused_query: missing"),
    (
        "empty required field",
        {"id": "a", "blurred_query": "", "fused_query": "y"},
        "blurred_query: empty",
    ),
    (
        "blank required field",
        {"id": "a", "blurred_query": "   ", "fused_query": "y"},
        "blurred_query: empty",
    ),
    (
        "blurred equals fused",
        {"id": "a", "blurred_query": "same", "fused_query": "same"},
        "blurred_query: equal to fused_query",
    ),
    (
        "weight <= 0",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "golden": {"nuggets": [_nugget(weight=-1)]},
        },
        "golden.nuggets[0].weight: must be a number > 0 and at most 1e6, got -1",
    ),
    (
        "weight not a number",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "golden": {"nuggets": [_nugget(weight="heavy")]},
        },
        "golden.nuggets[0].weight: must be a number > 0 and at most 1e6, got 'heavy'",
    ),
    (
        # Finite, yet its weighted sum overflowed to NaN: a record every resume refused.
        "weight too large",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "golden": {"nuggets": [_nugget(weight=1e308)]},
        },
        "golden.nuggets[0].weight: must be a number > 0 and at most 1e6, got 1e+308",
    ),
    (
        "duplicate nugget id",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "golden": {"nuggets": [_nugget(), _nugget()]},
        },
        "golden.nuggets[1].id: duplicate nugget id 'n1'",
    ),
    (
        "source id not in corpus",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "golden": {"nuggets": [_nugget(source_ids=["d1", "d9"])]},
        },
        "golden.nuggets[0].source_ids: 'd9' not in corpus {corpus}",
    ),
    (
        "unknown constraint type",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "removed_constraints": ["time", "place"],
        },
        "removed_constraints[1]: unknown constraint type 'place' (expected one of time, region, "
        "scope, entity, numeric, definition, other)",
    ),
    (
        "removed span not in the fused query",
        {
            "id": "a",
            "blurred_query": "hotel tax",
            "fused_query": "hotel tax in Calvanne",
            "removed_constraints": [{"type": "region", "span": "Paris"}],
        },
        "removed_constraints[0].span: 'Paris' is not in fused_query",
    ),
    (
        "removed span still in the blurred query",
        {
            "id": "a",
            "blurred_query": "hotel tax",
            "fused_query": "hotel tax in Calvanne",
            "removed_constraints": ["time", {"type": "region", "span": "tax"}],
        },
        "removed_constraints[1].span: 'tax' is still in blurred_query",
    ),
    (
        "removed constraint object without its span",
        {
            "id": "a",
            "blurred_query": "x",
            "fused_query": "y",
            "removed_constraints": [{"type": "region"}],
        },
        "removed_constraints[0]: not a {{type, span}} object with two strings (expected one of "
        "time, region, scope, entity, numeric, definition, other)",
    ),
    (
        "unknown language",
        {"id": "a", "blurred_query": "x", "fused_query": "y", "language": "xx"},
        "language: unknown language 'xx' (expected an ISO 639-1 code)",
    ),
]


@pytest.mark.parametrize(("rule", "row", "message"), BAD_ROWS, ids=[r[0] for r in BAD_ROWS])
def test_each_rule_reports_file_line_field(tmp_path, rule, row, message):
    corpus = write_corpus(tmp_path / "corpus.jsonl", ["d1"])
    good = {"id": "ok", "blurred_query": "x", "fused_query": "x y"}
    path = write_jsonl(tmp_path / "d.jsonl", [good, row])
    checked = check_source(DatasetSource(path=str(path), split=None, corpus=str(corpus)))
    assert [str(p) for p in checked.problems] == [f"{path}:2: " + message.format(corpus=corpus)]
    assert [i.id for i in checked.instances] == ["ok"]


def test_duplicate_id_names_the_first_line(tmp_path):
    row = {"id": "a", "blurred_query": "x", "fused_query": "x y"}
    path = write_jsonl(tmp_path / "d.jsonl", [row, {**row, "fused_query": "x z"}])
    (problem,) = check_source(DatasetSource(path=str(path), split=None)).problems
    assert str(problem) == f"{path}:2: id: duplicate id 'a' (first at line 1)"


def test_malformed_json_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "a", "blurred_query": "x", "fused_query": "x y"}\n{"id": "b",,}\n')
    (problem,) = check_source(DatasetSource(path=str(path), split=None)).problems
    assert str(problem).startswith(f"{path}:2: <row>: malformed JSON: Expecting property name")


def test_malformed_csv_row(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id,blurred_query,fused_query\na,x,x y\nb,x,x y,extra\n")
    (problem,) = check_source(DatasetSource(path=str(path), split=None)).problems
    assert str(problem) == f"{path}:3: <row>: malformed CSV row: expected 3 fields, got 4"


def test_json_array_rows_report_their_lines(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(
        '[\n  {"id": "a", "blurred_query": "x", "fused_query": "x y"},\n'
        '  {"id": "b",\n   "blurred_query": "x", "fused_query": "x"}\n]\n'
    )
    (problem,) = check_source(DatasetSource(path=str(path), split=None)).problems
    assert str(problem) == f"{path}:3: blurred_query: equal to fused_query"


def test_every_problem_in_a_file_is_reported(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", ["d1"])
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(row) for _, row, _ in BAD_ROWS) + "\nnot json\n")
    with pytest.raises(DatasetError) as e:
        load_instances(DatasetSource(path=str(path), split=None, corpus=str(corpus)))
    lines = {p.line for p in e.value.problems}
    assert lines == set(range(1, len(BAD_ROWS) + 2))
    assert f"{len(e.value.problems)} problem(s):" in str(e.value)


def test_corpus_problems(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"doc_id": "d1", "url": "u", "text": "t"},
                {"doc_id": "d1", "url": "u2", "text": "t"},
                {"doc_id": "d2", "url": "u3", "text": "", "date": "March 2024", "language": "qq"},
                # A visit finds a page by its URL: two documents at one read the last only.
                {"doc_id": "d3", "url": "u", "text": "t"},
            ]
        )
        + "\n"
    )
    documents, problems = check_corpus(path)
    assert [d.doc_id for d in documents] == ["d1"]
    assert [str(p) for p in problems] == [
        f"{path}:2: doc_id: duplicate doc_id 'd1' (first at line 1)",
        f"{path}:3: language: unknown language 'qq'",
        f"{path}:3: date: expected YYYY[-MM[-DD]], got 'March 2024'",
        f"{path}:3: text: empty",
        f"{path}:4: url: duplicate url 'u' (first at line 1)",
    ]


def test_a_dataset_without_golden_loads(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"id": "a", "blurred_query": "x", "fused_query": "x y"}]
    )
    (instance,) = load(path)
    assert instance.golden is None and instance.language == "en"


def test_removed_constraints_may_carry_their_spans(tmp_path):
    row = {
        "id": "a",
        "blurred_query": "hotel tax",
        "fused_query": "hotel tax in Calvanne in 2025",
        "removed_constraints": [{"type": "region", "span": "Calvanne"}, "time"],
    }
    path = write_jsonl(tmp_path / "d.jsonl", [row])
    (instance,) = load_instances(DatasetSource(path=str(path), split=None))
    assert instance.removed_constraints == ["region", "time"]
    assert instance.removed_spans == ["Calvanne", ""]
    # Dumped as given (golden construction writes it back), and read back the same.
    assert instance.model_dump(mode="json")["removed_constraints"] == row["removed_constraints"]
    assert Instance.model_validate(instance.model_dump(mode="json")) == instance
    # A dataset without spans dumps as before spans existed (its digest is unchanged).
    plain = Instance(id="b", blurred_query="x", fused_query="x y", removed_constraints=["time"])
    assert "removed_spans" not in plain.model_dump()


# -- misspelt fields (a typo used to be carried into meta, silently) ------------------------------


def _problems_of(path: Path, **source: object) -> list[str]:
    return [str(p) for p in check_source(DatasetSource(path=str(path), **source)).problems]


@pytest.mark.parametrize(
    ("column", "value", "meant"),
    [
        ("langauge", "zh", "language"),  # a Chinese row would have run with English prompts
        ("Language", "zh", "language"),
        ("removed_constraint", ["time"], "removed_constraints"),
        ("gold", GOOD["golden"], "golden"),  # unscored
        ("golden_nuggets", GOOD["golden"]["nuggets"], "golden"),  # an alias, not close
        ("lang", "zh", "language"),
    ],
)
def test_a_misspelt_field_is_an_error_naming_the_field_it_means(tmp_path, column, value, meant):
    row = {k: v for k, v in GOOD.items() if k not in (meant, "meta")} | {column: value}
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD | {"id": "q0"}, row])
    assert _problems_of(path) == [
        f'{path}:2: {column}: unknown field; did you mean "{meant}"? (rename the column, or '
        f"map it: --set dataset.field_map.{meant}={column})"
    ]
    with pytest.raises(DatasetError, match=f'{column}: unknown field; did you mean "{meant}"'):
        load(path)


def test_extra_columns_unlike_a_missing_field_still_go_to_meta(tmp_path):
    """Foreign datasets carry columns of their own: kept, under meta. So is a near miss of a
    field the row has (`gold` beside `golden`), or of a field a field map fills."""
    second = {k: v for k, v in SECOND.items() if k != "language"}
    rows = [
        GOOD | {"category": "travel", "source": "forum", "gold": "yes"},
        second | {"langue": "zh"},
        second | {"id": "q3", "langauge": ""},  # an empty cell (a CSV's) carries nothing
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    first, mapped, empty = load_instances(
        DatasetSource(path=str(path), split=None, field_map={"language": "langue"})
    )
    assert first.meta == GOOD["meta"] | {"category": "travel", "source": "forum", "gold": "yes"}
    assert (mapped.language, mapped.meta, empty.language) == ("zh", {}, "en")


def test_a_golden_from_the_gold_table_leaves_no_golden_to_misspell(tmp_path):
    row = {k: v for k, v in GOOD.items() if k != "golden"} | {"gold": "see the table"}
    path = write_jsonl(tmp_path / "q.jsonl", [row])
    nuggets = [{"id": "q1", "nuggets": GOOD["golden"]["nuggets"]}]
    gold = GoldTable(path=str(write_jsonl(tmp_path / "g.jsonl", nuggets)))
    (instance,) = load_instances(DatasetSource(path=str(path), split=None, gold=gold))
    assert instance.golden is not None and instance.meta["gold"] == "see the table"


# -- a UTF-8 BOM (editors and exports on Windows) -------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_bom_at_the_start_of_a_json_file_is_read_past(tmp_path, suffix):
    path = tmp_path / f"d{suffix}"
    rows = [GOOD, SECOND]
    text = json.dumps(rows) if suffix == ".json" else "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load(path) == instances()


def test_a_bom_at_the_start_of_a_corpus_is_read_past(tmp_path):
    path = tmp_path / "corpus.jsonl"
    document = {"doc_id": "d1", "url": "https://example.org/1", "text": "The Ridge Loop."}
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(document) + "\n").encode())
    documents, problems = check_corpus(path)
    assert ([d.doc_id for d in documents], problems) == (["d1"], [])


def test_a_bom_further_into_a_jsonl_file_is_a_problem_on_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(f"{json.dumps(GOOD)}\n\ufeff{json.dumps(SECOND)}\n".encode())
    (problem,) = _problems_of(path)
    assert problem.startswith(f"{path}:2: <row>: malformed JSON: Unexpected UTF-8 BOM")


def test_invalid_rows_count_rows_not_problems(tmp_path):
    bad = {"id": "b", "blurred_query": "x", "fused_query": "x", "language": "qq"}  # 2 problems
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, bad])
    path.write_text(path.read_text() + "not json\n")
    checked = check_source(DatasetSource(path=str(path), split=None))
    assert (len(checked.instances), checked.invalid_rows, len(checked.problems)) == (1, 2, 3)
