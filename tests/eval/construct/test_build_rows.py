"""What a fuse or blur keeps and counts: the removed constraints are the drawn ones, spans are
the fused query's own text, a resume never mixes rows made from other inputs or models, and the
console and summary count each row once (scripted engines, or the functions themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cts.agents.blurrer import blurred_schema
from cts.agents.fuser import StatedConstraint
from cts.eval.construct.blur import BlurPlan, BlurredRow, blur_summary, read_fused
from cts.eval.construct.fuse import read_raw, stated, verbatim_span
from cts.eval.data.readers import DatasetError
from cts.serving.errors import ConstrainedOutputError
from cts.serving.outputs import validate_output
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest, JsonSchemaOutput
from tests.builders import cts, scripted_cli

YEAR = StatedConstraint(type="time", span="2025")
PLACE = StatedConstraint(type="region", span="Caldmoor")
FUSED = {
    "key": "q1",
    "language": "en",
    "fused_query": "Which Caldmoor trains run to Innisvaile in 2025?",
    "constraints": [YEAR.model_dump(), PLACE.model_dump()],
}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


# -- the removed constraints are the drawn ones ---------------------------------------------------


def answer(removed: list[dict]) -> str:
    return json.dumps({"blurred_query": "Which trains run to Innisvaile?", "removed": removed})


def test_the_blurrer_schema_asks_for_every_target_as_its_own_pair() -> None:
    schema = JsonSchemaOutput(name="blurred_query", json_schema=blurred_schema([YEAR, PLACE]))
    both = [PLACE.model_dump(), YEAR.model_dump()]  # in any order
    assert validate_output(schema, answer(both))["removed"] == both
    swapped = [{"type": "region", "span": "2025"}, {"type": "time", "span": "Caldmoor"}]
    with pytest.raises(ConstrainedOutputError):
        validate_output(schema, answer(swapped))
    with pytest.raises(ConstrainedOutputError, match="too short"):
        validate_output(schema, answer([YEAR.model_dump()]))


def test_a_variant_whose_blurrer_names_other_constraints_than_drawn_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --remove 2, a Blurrer that lists one target twice (the schema's item count is
    met) says it removed one constraint, not two: the row is rejected, never an instance."""
    roles = scripted_roles()
    good = roles["blurrer"].script

    def twice(request: ChatRequest) -> str:
        found = json.loads(str(good(request)))
        return json.dumps({**found, "removed": [found["removed"][0]] * 2})

    roles["blurrer"] = ScriptedEngine(twice, name="blurrer")
    scripted_cli(tmp_path, monkeypatch, lambda: roles)
    fused = write_lines(tmp_path / "fused.jsonl", [FUSED])
    out = tmp_path / "blurred.jsonl"
    args = ["--remove", "2", "--mix", "time=1,region=1"]
    result = cts("data", "blur", str(fused), "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    assert lines(out) == []
    (reject,) = lines(tmp_path / "blurred.rejects.jsonl")
    assert [x["reason"] for x in reject["rejected"]] == ["not_the_targets"]
    summary = json.loads((tmp_path / "blurred.summary.json").read_text())
    assert summary["reasons"] == {"not_the_targets": 1}
    assert summary["mix"]["n_removed"] == 0


# -- spans are the fused query's own text -------------------------------------------------------


def test_a_span_found_only_folded_is_kept_as_the_fused_query_writes_it() -> None:
    query = "Which trains run from Caldmoor at Easter 2025 for ２０２５ fares?"
    kept, dropped = stated(
        query,
        [
            StatedConstraint(type="time", span="easter 2025"),  # case
            StatedConstraint(type="numeric", span="2025 fares"),  # width
            StatedConstraint(type="region", span="caldmoor  AT"),  # case and whitespace
            StatedConstraint(type="time", span="Easter 2025"),  # the first one again
            StatedConstraint(type="entity", span="Tarrow"),
        ],
    )
    assert [(c.type, c.span) for c in kept] == [
        ("time", "Easter 2025"),
        ("numeric", "２０２５ fares"),
        ("region", "Caldmoor at"),
    ]
    assert all(c.span in query for c in kept)
    assert [c.span for c in dropped] == ["Tarrow"]
    assert verbatim_span("Ｐｒｏ plan", "pro") == "Ｐｒｏ"
    assert verbatim_span("the Pro plan", "pro plans") is None


# -- input that would merge or drop rows ----------------------------------------------------------


def test_a_duplicate_fused_key_is_refused_naming_both_lines(tmp_path: Path) -> None:
    other = {**FUSED, "key": "q2"}
    path = write_lines(tmp_path / "fused.jsonl", [FUSED, other, FUSED])
    with pytest.raises(DatasetError) as raised:
        read_fused(path)
    assert [str(p) for p in raised.value.problems] == [f"{path}:3: key: 'q1': duplicate of line 1"]


@pytest.mark.parametrize("order", ["named first", "alone first"])
def test_a_line_without_group_is_never_merged_into_a_group_of_its_name(
    tmp_path: Path, order: str
) -> None:
    alone = {"query": "caldmoor line closure easter 2025"}
    if order == "named first":
        rows, where = [{"query": "tarrow final 2024", "group": "line-2"}, alone], ":2: group:"
    else:
        rows, where = [alone, {"query": "tarrow final 2024", "group": "line-1"}], ":1: group:"
    path = write_lines(tmp_path / "raw.jsonl", rows)
    with pytest.raises(DatasetError) as raised:
        read_raw(path)
    (problem,) = [str(p) for p in raised.value.problems]
    assert problem.startswith(f"{path}{where} missing") and "give this line a group" in problem
    # Lines without a group beside groups of other names stay sessions of their own.
    path = write_lines(tmp_path / "ok.jsonl", [alone, {"query": "b c", "group": "line-9"}, alone])
    assert [g.id for g in read_raw(path)] == ["line-1", "line-9", "line-3"]


# -- a resume never reuses rows made from something else ----------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return scripted_cli(tmp_path, monkeypatch, scripted_roles)


def test_a_resumed_blur_with_another_model_or_other_fused_queries_is_refused(cli: Path) -> None:
    fused, out = write_lines(cli / "fused.jsonl", [FUSED]), cli / "blurred.jsonl"
    assert cts("data", "blur", str(fused), "--out", str(out)).exit_code == 0
    other_model = ["--set", "roles.blurrer.model=smollm2-135m-instruct"]
    refused = cts("data", "blur", str(fused), "--out", str(out), *other_model)
    assert refused.exit_code == 2
    assert "blurred before with other blurrer" in refused.output
    corrected = {**FUSED, "fused_query": FUSED["fused_query"].replace("2025", "2026")}
    write_lines(fused, [corrected])
    refused = cts("data", "blur", str(fused), "--out", str(out))
    assert refused.exit_code == 2
    assert "blurred before with other fused_queries" in refused.output
    assert "another --out" in refused.output
    write_lines(fused, [FUSED])  # as it was: the resume goes on
    again = cts("data", "blur", str(fused), "--out", str(out))
    assert again.exit_code == 0 and "0 rows done now, 1 already done" in again.output


def test_a_resumed_fuse_with_another_seed_or_other_raw_queries_is_refused(cli: Path) -> None:
    raw = write_lines(cli / "raw.jsonl", [{"query": "alpha trains 2025 Caldmoor", "group": "g"}])
    out = cli / "fused.jsonl"
    assert cts("data", "fuse", str(raw), "--out", str(out), "--seed", "0").exit_code == 0
    refused = cts("data", "fuse", str(raw), "--out", str(out), "--seed", "7")
    assert refused.exit_code == 2
    assert "fused before with other seed" in refused.output
    write_lines(raw, [{"query": "alpha trains 2026 Caldmoor", "group": "g"}])
    refused = cts("data", "fuse", str(raw), "--out", str(out), "--seed", "0")
    assert refused.exit_code == 2 and "fused before with other raw_queries" in refused.output
    assert [r["provenance"]["seed"] for r in lines(out)] == [0]


# -- counts ----------------------------------------------------------------------------------


def test_the_console_counts_fused_rows_and_failures_kept_from_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roles = scripted_roles()
    good = roles["fuser"].script

    def flaky(request: ChatRequest) -> str | Exception:
        if "beta" in request.messages[-1].content:
            return ConstrainedOutputError("the fuser ran past its limit", "{")
        return good(request)

    roles["fuser"] = ScriptedEngine(flaky, name="fuser")
    scripted_cli(tmp_path, monkeypatch, lambda: roles)
    raw = write_lines(
        tmp_path / "raw.jsonl",
        [
            {"query": "alpha trains 2025 Caldmoor", "group": "g1"},
            {"query": "beta buses 2024 Innisvaile", "group": "g2"},
            {"query": "gamma ferries Portwen", "group": "g3"},
        ],
    )
    out = tmp_path / "fused.jsonl"
    first = cts("data", "fuse", str(raw), "--out", str(out))
    assert "3 rows done now, 0 already done, 1 failed" in first.output
    assert f"2 fused queries in {out}" in first.output
    again = cts("data", "fuse", str(raw), "--out", str(out))
    assert "0 rows done now, 3 already done, 1 failed" in again.output, again.output
    assert f"2 fused queries in {out}" in again.output
    # Blur: the failed fuse is skipped, the query without a year or name draws no variant.
    blurred = tmp_path / "blurred.jsonl"
    result = cts("data", "blur", str(out), "--out", str(blurred), "--mix", "time=1")
    assert result.exit_code == 0, result.output
    assert "not drawn: 1 variants short of --per-query, 1 fused rows without" in result.output


def test_a_reason_counts_once_for_a_row_that_breaks_its_rule_for_several_spans() -> None:
    def row(key: str, reasons: list[str]) -> BlurredRow:
        return BlurredRow(
            key=key,
            fused_key=key,
            variant=0,
            language="en",
            fused_query=FUSED["fused_query"],
            targets=[YEAR, PLACE],
            rejected=[{"reason": r, "detail": f"{r} {i}"} for i, r in enumerate(reasons)],
        )

    rows = [
        row("a", ["dangling", "dangling", "dangling"]),
        row("b", ["span_still_in_blurred", "span_still_in_blurred", "dangling"]),
    ]
    summary = blur_summary(rows, BlurPlan(mix={"time": 1.0, "region": 1.0}, remove=2), 2, 0)
    assert summary["reasons"] == {"dangling": 2, "span_still_in_blurred": 1}
    assert summary["variants"]["rejected"] == 2
