"""`cts data fuse` and `cts data blur` on scripted engines: the shipped raw queries through
fuse → blur → golden build → `cts run`, shards and resume, bad input, and the plan's draw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.agents.fuser import StatedConstraint
from cts.cli import app
from cts.eval.construct.blur import (
    BlurError,
    BlurPlan,
    FusedQuery,
    draw_targets,
    parse_mix,
    read_fused,
)
from cts.eval.construct.checks import REASONS, overlaps
from cts.eval.construct.fuse import read_raw
from cts.eval.data.dataset import SAMPLE_DIR, DatasetSource, load_instances
from cts.eval.data.readers import DatasetError
from cts.eval.report.report import load_run
from cts.serving.errors import EngineError
from cts.serving.scripted import ScriptedEngine, scripted_roles
from tests.builders import cts, scripted_cli

RAW = SAMPLE_DIR / "raw_queries.jsonl"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return scripted_cli(tmp_path, monkeypatch, scripted_roles)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def fuse_and_blur(root: Path, *blur_args: str) -> Path:
    fused, blurred = root / "fused.jsonl", root / "blurred.jsonl"
    result = cts("data", "fuse", str(RAW), "--out", str(fused))
    assert result.exit_code == 0, result.output
    assert f"32 fused queries in {fused}" in result.output
    result = cts("data", "blur", str(fused), "--out", str(blurred), *blur_args)
    assert result.exit_code == 0, result.output
    return blurred


def test_the_shipped_raw_queries_become_a_benchmark_that_runs(cli: Path) -> None:
    blurred = fuse_and_blur(cli, "--per-query", "2")
    fused = lines(cli / "fused.jsonl")
    assert [f["key"] for f in fused][:2] == ["raw-en-01", "raw-en-02"]
    assert all(
        f["provenance"]["role"] == "fuser" and len(f["provenance"]["prompt"]) == 64 for f in fused
    )
    for f in fused:  # every stated span is in its fused query
        assert all(c["span"] in f["fused_query"] for c in f["constraints"])
    summary = json.loads((cli / "blurred.summary.json").read_text())
    accepted, rejects = lines(blurred), lines(cli / "blurred.rejects.jsonl")
    v = summary["variants"]
    assert v["accepted"] == len(accepted) > 0 and v["rejected"] == len(rejects) > 0
    assert v["n"] == len(accepted) + len(rejects) and v["failed"] == 0
    assert sum(summary["reasons"].values()) >= len(rejects)
    assert all(r["rejected"] for r in rejects)
    # Accepted rows are instances whose spans were removed and recovered.
    instances = load_instances(DatasetSource(path=str(blurred)))
    assert len(instances) == len(accepted)
    for row, instance in zip(accepted, instances, strict=True):
        assert instance.removed_spans and instance.removed_spans[0] not in instance.blurred_query
        recovery = row["meta"]["recovery"][0]
        assert recovery["from_blurred"] == "unknown"
        assert overlaps(recovery["from_fused"], recovery["span"])
    assert summary["mix"]["n_removed"] == len(accepted)
    assert summary["mix"]["n_drawn"] == v["n"]  # one removed constraint a variant
    assert sum(summary["mix"]["drawn"].values()) == pytest.approx(1.0)
    assert summary["mix"]["asked"]["time"] == 0.3
    # Then golden construction and a run, as on any dataset.
    golden, run = cli / "golden", cli / "run"
    result = cts(
        "golden",
        "build",
        "--set",
        f"dataset.path={blurred}",
        "--set",
        "dataset.split=null",
        "--output-dir",
        str(golden),
    )
    assert result.exit_code == 0, result.output
    result = cts(
        "run",
        "--set",
        f"dataset.path={golden / 'dataset.jsonl'}",
        "--set",
        "dataset.split=null",
        "--output-dir",
        str(run),
    )
    assert result.exit_code == 0, result.output
    assert (run / "summary.json").is_file()


def test_shards_write_side_by_side_and_the_last_writes_what_one_run_writes(
    cli: Path, tmp_path: Path
) -> None:
    whole = fuse_and_blur(cli)
    sharded = tmp_path / "sharded"
    fused = cli / "fused.jsonl"
    out = sharded / "blurred.jsonl"
    first = cts("data", "blur", str(fused), "--out", str(out), "--shard", "0/2")
    assert first.exit_code == 0 and "rows of other shards are missing" in first.output
    assert not out.exists()
    second = cts("data", "blur", str(fused), "--out", str(out), "--shard", "1/2")
    assert second.exit_code == 0, second.output
    assert out.read_text() == whole.read_text()
    again = cts("data", "blur", str(fused), "--out", str(out))
    assert "0 rows done now" in again.output
    assert out.read_text() == whole.read_text()


def test_a_resume_with_other_settings_is_refused(cli: Path) -> None:
    fuse_and_blur(cli)
    result = cts(
        "data",
        "blur",
        str(cli / "fused.jsonl"),
        "--out",
        str(cli / "blurred.jsonl"),
        "--mix",
        "time=1",
    )
    assert result.exit_code == 2
    assert "blurred before with other mix" in result.output


def test_a_failed_model_call_is_kept_and_retried(
    cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roles = scripted_roles()
    good = roles["blurrer"].script
    failing = {"on": True}

    def flaky(request):  # type: ignore[no-untyped-def]
        return EngineError("the blurrer timed out") if failing["on"] else good(request)

    roles["blurrer"] = ScriptedEngine(flaky, name="blurrer")
    monkeypatch.setattr("tests.scripted_cts.scripted_roles", lambda: roles)
    fused, out = cli / "fused.jsonl", cli / "blurred.jsonl"
    assert cts("data", "fuse", str(RAW), "--out", str(fused)).exit_code == 0
    first = cts("data", "blur", str(fused), "--out", str(out))
    assert first.exit_code == 0 and "failed 0" not in first.output
    summary = json.loads((cli / "blurred.summary.json").read_text())
    assert summary["variants"]["failed"] == summary["variants"]["n"] > 0
    assert summary["reasons"] == {"model_error": summary["variants"]["n"]}
    failing["on"] = False
    again = cts("data", "blur", str(fused), "--out", str(out), "--retry-failed")
    assert again.exit_code == 0, again.output
    assert json.loads((cli / "blurred.summary.json").read_text())["variants"]["failed"] == 0


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"query": "a"}\nnot json\n', ":2: <line>: not JSON"),
        ('{"group": "g"}\n', ":1: query: Field required"),
        ('{"query": "  "}\n', ":1: query: empty"),
        ('{"query": "a", "language": "xx-bad-"}\n', ":1: language: unknown language"),
        (
            '{"query": "a", "group": "g"}\n{"query": "乙", "group": "g", "language": "zh"}\n',
            ":2: language: group 'g' mixes languages",
        ),
        ("\n", ": <file>: no raw query"),
        ('{"query": "a", "group": "a/b"}\n', ":1: group: 'a/b' must not contain a path separator"),
    ],
)
def test_a_bad_raw_file_names_the_line_and_field(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DatasetError) as raised:
        read_raw(path)
    assert any(str(p).startswith(str(path)) and where in str(p) for p in raised.value.problems), (
        raised.value
    )


def test_raw_groups_keep_their_order_and_a_line_without_group_is_its_own() -> None:
    groups = read_raw(RAW)
    assert len(groups) == 32 and sum(g.language == "zh" for g in groups) == 16
    assert groups[0].id == "raw-en-01" and len(groups[0].queries) == 3
    assert groups[0].lines == (1, 2, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time=x", "not a number"),
        ("when=1", "unknown type"),
        ("time=0", "no type"),
        ("time=-1", "at least 0"),
        ("time=inf", "finite"),
    ],
)
def test_a_bad_mix_is_refused(text: str, message: str) -> None:
    with pytest.raises(BlurError, match=message):
        parse_mix(text)


def test_the_draw_follows_the_mix_and_never_removes_one_constraint_twice() -> None:
    row = FusedQuery(
        key="q",
        fused_query="Ostreby grant 2024 for two-bedroom homes",
        constraints=[
            StatedConstraint(type="time", span="2024"),
            StatedConstraint(type="region", span="Ostreby"),
            StatedConstraint(type="scope", span="two-bedroom"),
        ],
    )
    plan = BlurPlan(mix={"time": 1.0, "region": 1.0}, per_query=3)
    variants = draw_targets(row, plan)
    assert len(variants) == 2  # scope has no weight: two variants, not three
    assert {v[0].type for v in variants} == {"time", "region"}
    assert draw_targets(row, plan) == variants  # the same plan draws the same
    assert draw_targets(row, BlurPlan(mix={"time": 1.0, "region": 1.0}, remove=2))[0] != []
    assert draw_targets(row, BlurPlan(mix={"scope": 1.0}, remove=2)) == []


#: Raw groups whose sessions end in a query with a year: the tiny Fuser copies it and lists
#: the year, the tiny Blurrer deletes it (the shipped run: 6 of 27 variants accepted, these 3
#: among them; docs/data-and-golden.md).
TINY_GROUPS = ("raw-en-03", "raw-en-06", "raw-en-14")


@pytest.mark.slow
@pytest.mark.demo
def test_the_tiny_model_builds_a_benchmark_that_runs(tmp_path: Path) -> None:
    """On the real tiny model (cts/configs/experiments/build.yaml: the Fuser and Blurrer adapters,
    the quickstart's User Answerer): fuse → blur → golden build → `cts run` (clarify@1: the
    Clarifier, User Answerer, Rewriter, searcher and judge) on three shipped raw groups, every
    row accounted for (fused, accepted or rejected with a known reason)."""
    raw = tmp_path / "raw.jsonl"
    kept = [
        line
        for line in RAW.read_text(encoding="utf-8").splitlines()
        if any(f'"{group}"' in line for group in TINY_GROUPS)
    ]
    raw.write_text("\n".join(kept) + "\n", encoding="utf-8")
    fused, blurred = tmp_path / "fused.jsonl", tmp_path / "blurred.jsonl"
    result = cts("data", "fuse", str(raw), "--out", str(fused))
    assert result.exit_code == 0, result.output
    rows = lines(fused)
    assert [r["key"] for r in rows] == list(TINY_GROUPS)
    assert all(r["provenance"]["model"] == "smollm2-135m-fuser" for r in rows)
    assert all(c["span"] in r["fused_query"] for r in rows for c in r["constraints"])
    result = cts("data", "blur", str(fused), "--out", str(blurred), "--per-query", "1")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "blurred.summary.json").read_text())
    v = summary["variants"]
    assert v["accepted"] + v["rejected"] + v["failed"] == v["n"] and set(summary["reasons"]) <= set(
        REASONS
    )
    assert len(lines(blurred)) == v["accepted"] >= 1, summary
    golden, run = tmp_path / "golden", tmp_path / "run"
    dataset = ["--set", "dataset.split=null", "--set", "dataset.limit=null"]
    result = cts(
        "golden", "build", "--set", f"dataset.path={blurred}", *dataset, "--output-dir", str(golden)
    )
    built = lines(golden / "dataset.jsonl")  # exit 1 when an instance found no evidence
    assert result.exit_code in (0, 1) and len(built) >= 1, result.output
    result = cts(
        "run",
        "--set",
        f"dataset.path={golden / 'dataset.jsonl'}",
        *dataset,
        "--set",
        "conditions=[clarify@1]",
        "--output-dir",
        str(run),
    )
    assert result.exit_code == 0, result.output
    records = load_run(run).records
    assert len(records) == len(built) and all(r.error is None for r in records)


def test_a_torn_last_row_is_cut_and_an_edited_one_stops_the_step(cli: Path) -> None:
    blurred = fuse_and_blur(cli)
    shard = cli / "blurred.jsonl.parts" / "shard-0-of-1.jsonl"
    rows = shard.read_text().splitlines()
    # A crash mid-write: the last row is torn; the resume cuts it and makes it again.
    shard.write_text("\n".join(rows[:-1]) + "\n" + rows[-1][:20])
    again = cts("data", "blur", str(cli / "fused.jsonl"), "--out", str(blurred))
    assert again.exit_code == 0 and "1 rows done now" in again.output, again.output
    assert len(shard.read_text().splitlines()) == len(rows)
    # A line someone edited is not a row: the step stops and names it.
    shard.write_text('{"key": 3}\n' + shard.read_text())
    broken = CliRunner().invoke(
        app, ["data", "blur", str(cli / "fused.jsonl"), "--out", str(blurred)]
    )
    assert broken.exit_code == 1
    assert f"build rows error: {shard}:1: key: " in broken.output and "not a row" in broken.output


def test_the_judge_can_check_that_a_blurred_query_is_still_a_question(cli: Path) -> None:
    fused = cli / "fused.jsonl"
    assert cts("data", "fuse", str(RAW), "--out", str(fused)).exit_code == 0
    out = cli / "judged.jsonl"
    refused = CliRunner().invoke(
        app, ["data", "blur", str(fused), "--out", str(out), "--question-check", "judge"]
    )
    assert refused.exit_code == 2 and "missing judge" in refused.output
    result = cts(
        "data", "blur", str(fused), "--out", str(out), "--question-check", "judge",
        "--set", "roles.judge.model=smollm2-135m-instruct",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((cli / "judged.summary.json").read_text())
    assert summary["plan"]["question_check"] == "judge"
    # The scripted judge says no to a query under four words (the zh ones, unspaced).
    assert summary["reasons"].get("not_a_question", 0) > 0
    rejected = [r for r in lines(cli / "judged.rejects.jsonl") if r["rejected"]]
    judged = [r for r in rejected if r["rejected"][0]["reason"] == "not_a_question"]
    assert all(len(r["blurred_query"].split()) < 4 for r in judged)
    assert all(r["provenance"]["judge"]["role"] == "judge" for r in rejected)


def test_a_bad_fused_file_names_the_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "fused.jsonl"
    path.write_text(
        '{"key": "ok", "fused_query": "a b c"}\n'
        '{"key": "x/y", "fused_query": "a b c"}\n'
        '{"key": "c", "fused_query": "a", "constraints": [{"type": "when", "span": "a"}]}\n'
        "nope\n"
        '{"key": "d", "error": "EngineError: down", "fused_query": ""}\n',
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as raised:
        read_fused(path)
    found = [str(p) for p in raised.value.problems]
    assert [p.split(": ", 1)[0] for p in found] == [f"{path}:2", f"{path}:3", f"{path}:4"], found
    assert "key: 'x/y' must not contain a path separator" in found[0]
    assert "constraints.0.type" in found[1] and "<line>: not JSON" in found[2]
