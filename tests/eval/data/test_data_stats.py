"""`cts data stats`: the removed-type mix as shares and the removed spans (how many recorded,
their lengths in units per language), on a dataset small enough to count by hand and on the
shipped sample, which records no spans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cts.eval.data.data_stats import dataset_stats
from cts.eval.data.schema import CONSTRAINT_TYPES, Instance
from tests.builders import cts


def row(id_: str, blurred: str, fused: str, *removed: str | tuple[str, str]) -> dict[str, Any]:
    """An instance row; a removed constraint is a type, or (type, span)."""
    constraints = [r if isinstance(r, str) else {"type": r[0], "span": r[1]} for r in removed]
    language = "zh" if id_.startswith("zh") else "en"
    return {
        "id": id_,
        "language": language,
        "blurred_query": blurred,
        "fused_query": fused,
        "removed_constraints": constraints,
    }


# Nine removed constraints, seven of them with a span; units: a word, or one CJK character.
HAND: list[dict[str, Any]] = [
    # `in Calvanne`, `in 2025`: 2 units each.
    row(
        "en1",
        "Tourist tax for hotel stays",
        "Tourist tax for hotel stays in Calvanne in 2025",
        ("region", "in Calvanne"),
        ("time", "in 2025"),
    ),
    # 3 units, and a constraint given by its type only.
    row(
        "en2",
        "Battery life of the Korvex earbuds",
        "Battery life of the Korvex Aura Pro wireless earbuds",
        ("entity", "Aura Pro wireless"),
        "scope",
    ),
    row("en3", "Train timetable", "Train timetable for Easter", "time"),  # no span
    # in the first quarter of 2024: 6 units.
    row(
        "en4",
        "GDP growth",
        "GDP growth in the first quarter of 2024",
        ("time", "in the first quarter of 2024"),
    ),
    # 溪 川 市: 3 units; 2025 年: 2.
    row(
        "zh1",
        "公租房申请的收入标准是多少？",
        "溪川市2025年公租房申请的收入标准是多少？",
        ("region", "溪川市"),
        ("time", "2025年"),
    ),
    # 2024 年 高 血 压: 5 units.
    row(
        "zh2", "华岳医学会发布的指南", "华岳医学会发布的2024年高血压指南", ("time", "2024年高血压")
    ),
]


def test_span_figures_on_a_hand_counted_dataset():
    stats = dataset_stats([Instance.model_validate(row) for row in HAND])
    # 9 removed constraints: time 5 (en1 en3 en4 zh1 zh2), region 2, entity 1, scope 1.
    assert stats["removed_constraints"]["time"] == 5
    assert stats["removed_constraint_shares"] == {
        "n": 9,
        "shares": {
            "time": 0.556,
            "region": 0.222,
            "scope": 0.111,
            "entity": 0.111,
            "numeric": 0.0,
            "definition": 0.0,
            "other": 0.0,
        },
    }
    spans = stats["removed_spans"]
    # en2's scope and en3's time have no span: 7 of 9.
    assert spans["with_span"] == {"n": 9, "count": 7, "share": 0.778}
    # en: 2 2 3 6 (median of an even count: the middle two's mean); zh: 3 2 5.
    assert spans["span_units"] == {
        "en": {"n": 4, "min": 2, "median": 2.5, "mean": 3.25, "max": 6},
        "zh": {"n": 3, "min": 2, "median": 3, "mean": 3.33, "max": 5},
    }


def test_a_dataset_without_spans_or_constraints():
    bare = Instance(id="a", blurred_query="x", fused_query="x y", removed_constraints=["time"])
    assert dataset_stats([bare])["removed_spans"] == {
        "with_span": {"n": 1, "count": 0, "share": 0.0},
        "span_units": {},
    }
    # No removed constraint at all: no share to give.
    empty = dataset_stats([bare.model_copy(update={"removed_constraints": []})])
    assert empty["removed_spans"]["with_span"] == {"n": 0, "count": 0, "share": None}
    assert empty["removed_constraint_shares"] == {
        "n": 0,
        "shares": dict.fromkeys(CONSTRAINT_TYPES),
    }


def test_cts_data_stats_shows_the_spans(tmp_path: Path, wide_terminal):
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in HAND))
    document = json.loads(cts("data", "stats", str(path), "--json").output)[str(path)]
    assert document["removed_spans"]["with_span"]["count"] == 7
    assert document["removed_spans"]["span_units"]["zh"]["median"] == 3
    shown = cts("data", "stats", str(path)).output
    assert "7 of 9 removed constraints have a span (78%; lengths below)" in shown
    assert "of 9: time 56%, region 22%, scope 11%, entity 11%, numeric 0%" in shown
    assert "removed span length" in shown and "in units: a word, or one CJK character" in shown
    lines = [" ".join(line.strip("│┃ ").split()) for line in shown.splitlines()]
    assert "en │ 4 │ 2 │ 2.5 │ 3.25 │ 6" in lines
    assert "zh │ 3 │ 2 │ 3 │ 3.33 │ 5" in lines


def test_the_shipped_sample_records_no_spans(wide_terminal):
    stats = json.loads(cts("data", "stats", "sample", "--split", "dev", "--json").output)["dev"]
    removed = sum(stats["removed_constraints"].values())
    assert removed == stats["removed_constraint_shares"]["n"] > 0
    assert stats["removed_spans"] == {
        "with_span": {"n": removed, "count": 0, "share": 0.0},
        "span_units": {},
    }
    shown = cts("data", "stats", "sample", "--split", "dev").output
    assert f"no spans recorded (0 of {removed} removed constraints)" in shown
    assert "removed span length" not in shown
