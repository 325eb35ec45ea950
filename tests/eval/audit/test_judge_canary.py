"""A judge that ignores the answer must not pass as informative: the judge's labels are checked
per language and per condition, and an answer-independence canary (the record's nuggets judged
against an answer that states none of them) warns with its rate. A scripted judge that gives
every English nugget `none` and every Chinese one `full`, whatever the answer (what the tiny
judge did on held-out data), warns; one that reads the answer stays silent."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Canary, Record
from cts.eval.report.diagnostics import judge_labels, paired_instances, score_records, summarize
from cts.eval.report.warnings import warnings
from cts.eval.run.config_sections import JudgeCanary, JudgeConfig
from cts.eval.run.pipeline import canary_drawn, run_instance
from cts.serving.types import ChatRequest
from tests.scripted import scripted_context

CONDITIONS = ["blurred", "clarify@1", "oracle"]


def two_languages():
    """Two English and two Chinese instances of the sample dev split."""
    every = load_instances(DatasetSource(path="sample", split="dev"))
    chosen = [i for i in every if i.language == "en"][:2] + [
        i for i in every if i.language == "zh"
    ][:2]
    assert [i.language for i in chosen] == ["en", "en", "zh", "zh"]
    return chosen


def judged(request: ChatRequest) -> tuple[str, dict[str, str]]:
    """The answer and the nuggets (id → text) of a judge prompt (cts/agents/prompts/judge.yaml)."""
    user = request.messages[1].content
    found = re.search(r"(?:Answer:|回答：)\n(.*)\n\n(?:Nuggets:|要点：)\n(.*)", user, re.S)
    assert found, user
    nuggets = dict(line.split(": ", 1) for line in found.group(2).splitlines())
    return found.group(1), nuggets


def labels_json(labels: dict[str, str]) -> str:
    return json.dumps({i: {"evidence": "e", "label": label} for i, label in labels.items()})


def ignoring_judge(request: ChatRequest) -> str:
    """Never reads the answer: English nuggets `none`, Chinese ones `full`."""
    _, nuggets = judged(request)
    chinese = request.messages[0].content.startswith("你")
    return labels_json(dict.fromkeys(nuggets, "full" if chinese else "none"))


def units(text: str) -> set[str]:
    """Latin words of 4+ letters and CJK character pairs, lower-cased."""
    words = set(re.findall(r"[a-z0-9]{4,}", text.lower()))
    cjk = "".join(re.findall(r"[\u4e00-\u9fff]", text))
    return words | {cjk[i : i + 2] for i in range(len(cjk) - 1)}


def reading_judge(request: ChatRequest) -> str:
    """Reads the answer: `full` when it holds half a nugget's words, `partial` a quarter,
    `none` otherwise (so always `none` against no answer)."""
    answer, nuggets = judged(request)
    said = units(answer) if answer != "(no answer)" else set()

    def label(text: str) -> str:
        shared = len(units(text) & said)
        need = len(units(text))
        return "full" if shared * 2 >= need else "partial" if shared * 4 >= need else "none"

    return labels_json({i: label(text) for i, text in nuggets.items()})


def echoing_searcher(request: ChatRequest) -> str:
    """Searches once, then answers with the question it was given: the oracle's answer holds
    the fused query, the blurred one only the blurred query."""
    question = request.messages[1].content.rsplit("User: ", 1)[1]
    if len(request.messages) == 2:
        call = {"name": "search", "arguments": {"query": [question[:60]]}}
        return f"<think>\nsearch\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return f"<think>\ndone\n</think>\n<answer>\n{question}\n</answer>"


def run(search, judge, canary: JudgeCanary) -> tuple[list[Record], Counter[str]]:
    """Every key of the four instances under CONDITIONS, seed 0, through the pipeline; the
    records, and the judge's requests by answer shown."""
    ctx, roles = scripted_context(search)
    roles["judge"].script = judge
    roles["searcher"].script = echoing_searcher
    ctx.judge = JudgeConfig(canary=canary)

    async def go() -> list[Record]:
        return [await run_instance(i, c, 0, ctx) for i in two_languages() for c in CONDITIONS]

    records = asyncio.run(go())
    assert all(r.error is None for r in records), [r.error for r in records]
    shown = Counter(judged(r)[0] for r in roles["judge"].requests)
    return records, shown


def report_warnings(records: list[Record]) -> list[str]:
    scored = score_records(records, CONDITIONS, [0], "exclude")
    ids = paired_instances([(scored, CONDITIONS)])
    return warnings("sys", summarize(records, CONDITIONS, [0], ids, scored))


def test_a_judge_that_ignores_the_answer_warns_per_language_and_by_its_canary(search):
    records, shown = run(search, ignoring_judge, JudgeCanary(share=1.0, answer="empty"))
    judge = judge_labels(records)
    # Over the run no label dominates (30 `none`, 30 `full`): the run-wide check is silent.
    assert judge["counts"] == {"full": 30, "partial": 0, "none": 30}
    assert not judge["degenerate"]
    assert judge["by_language"]["en"]["dominant"] == "none"
    assert judge["by_language"]["zh"]["dominant"] == "full"
    assert judge["by_language"]["zh"]["degenerate"] and judge["by_language"]["en"]["degenerate"]
    assert not any(g["degenerate"] for g in judge["by_condition"].values())
    # The canary: every record, the nuggets against "(no answer)"; the Chinese ones got credit.
    canary = judge["canary"]
    assert (canary["records"], canary["instances"], canary["failed"]) == (12, 4, 0)
    assert (canary["labels"], canary["full"], canary["partial"]) == (60, 30, 0)
    assert canary["rate"] == 0.5
    assert canary["by_language"]["zh"] == {"labels": 30, "full": 30, "partial": 0, "rate": 1.0}
    assert canary["by_answer"]["empty"]["warn"]
    # One canary request per record (the scripted judge has no cache in front of it).
    assert shown["(no answer)"] == 12
    found = report_warnings(records)
    per_language = [w for w in found if "per language" in w]
    assert len(per_language) == 1
    assert "en (100% `none` of 30)" in per_language[0]
    assert "zh (100% `full` of 30)" in per_language[0]
    (alarm,) = [w for w in found if "canary" in w and "per language" not in w]
    assert "canary (empty answer)" in alarm
    assert "the judge gave 30 of 60 labels full or partial (50%, warned from 10%" in alarm
    assert "12 records of 4 instances sampled" in alarm and "without reading" in alarm


def test_a_judge_that_reads_the_answer_is_silent_but_its_restatement_bias_shows(search):
    """The scripted reading judge credits a nugget's words wherever they come from: silent
    against another instance's nuggets and against no answer, it credits the fused query
    restated, and the default canary (`other`, `restated`) says so."""
    records, _ = run(search, reading_judge, JudgeCanary(share=1.0, answer=["other", "empty"]))
    judge = judge_labels(records)
    assert judge["counts"]["full"] and judge["counts"]["none"]  # it tells answers apart
    canary = judge["canary"]
    assert (canary["records"], canary["labels"], canary["full"], canary["partial"]) == (
        12,
        60,
        0,
        0,
    )
    assert set(canary["by_answer"]) == {"other", "empty"}
    assert report_warnings(records) == []
    records, shown = run(search, reading_judge, JudgeCanary(share=1.0))
    by_answer = judge_labels(records)["canary"]["by_answer"]
    assert set(by_answer) == {"other", "restated"}
    assert by_answer["other"]["rate"] == 0.0 and not by_answer["other"]["warn"]
    assert by_answer["restated"]["warn"]
    fused = {i.fused_query for i in two_languages()}
    assert fused <= set(shown)  # the restated answer is the fused query itself
    (alarm,) = [w for w in report_warnings(records) if "canary" in w]
    assert "canary (restated answer)" in alarm and "restates the question" in alarm


def answer_blind_judge(request: ChatRequest) -> str:
    """Credits every nugget of any answer that says something, whatever it says."""
    answer, nuggets = judged(request)
    return labels_json(dict.fromkeys(nuggets, "none" if answer == "(no answer)" else "full"))


def test_the_default_canary_catches_a_judge_that_credits_anything_said(search):
    """A judge that labels any non-empty answer `full` scored 81-83 in every condition with
    no warning while the canary's answer was empty by default; another instance's nuggets,
    the default now, catch it. The empty answer alone still misses it."""
    records, _ = run(search, answer_blind_judge, JudgeCanary(share=1.0, answer="empty"))
    assert judge_labels(records)["canary"]["rate"] == 0.0
    assert not [w for w in report_warnings(records) if "canary (" in w]
    records, _ = run(search, answer_blind_judge, JudgeCanary(share=1.0))
    by_answer = judge_labels(records)["canary"]["by_answer"]
    assert by_answer["other"]["rate"] == 1.0 and by_answer["other"]["warn"]
    alarms = [w for w in report_warnings(records) if "canary (other answer)" in w]
    assert len(alarms) == 1 and "without reading the answer" in alarms[0]


def test_the_unrelated_answer_and_a_failed_canary_call(search):
    def judge(request: ChatRequest) -> str | Exception:
        answer, _ = judged(request)
        if "烤箱" in answer:  # the Chinese unrelated answer: the canary call fails
            return RuntimeError("judge down")
        return reading_judge(request)

    records, shown = run(search, judge, JudgeCanary(share=1.0, answer="unrelated"))
    assert any(a.startswith("Preheat the oven") for a in shown)
    canary = judge_labels(records)["canary"]
    # The Chinese records' canary failed: counted apart, their own labels stand.
    assert (canary["records"], canary["failed"], canary["labels"]) == (6, 6, 30)
    assert canary["full"] + canary["partial"] == 0
    failed = [r for r in records if r.canary is not None and r.canary.error]
    assert {r.language for r in failed} == {"zh"} and all(r.scores for r in failed)


def test_the_canary_is_drawn_by_the_key_and_can_be_switched_off(search):
    keys = [(f"q{i}", c, s) for i in range(400) for c in CONDITIONS for s in (0, 1)]
    drawn = [k for k in keys if canary_drawn(k, 0.25)]
    # A fixed draw (SHA-256 of the key): about a quarter, the same every time.
    assert 0.2 < len(drawn) / len(keys) < 0.3
    assert drawn == [k for k in keys if canary_drawn(k, 0.25)]
    assert all(canary_drawn(k, 1.0) for k in keys)
    records, shown = run(search, ignoring_judge, JudgeCanary(enabled=False))
    assert all(r.canary is None for r in records) and "(no answer)" not in shown
    assert judge_labels(records)["canary"]["records"] == 0
    # The default draws some records only; those it draws carry the canary.
    records, _ = run(search, ignoring_judge, JudgeCanary())
    carried = {r.key for r in records if r.canary is not None}
    assert carried == {r.key for r in records if canary_drawn(r.key, 0.25)}


def test_a_group_with_few_labels_is_not_flagged():
    def record(condition: str, labels: list[str]) -> Record:
        return Record(
            instance_id="q",
            condition=condition,
            seed=0,
            language="en",
            labels={f"n{i}": {"label": label} for i, label in enumerate(labels)},
            canary=Canary(answer="empty", labels={"n0": "none"}),
        )

    # blurred: 9 labels, all `none` (below the 10 a group needs); oracle: 19 of 20 `full`
    # (95%, flagged); the run: 19 full of 29 (66%).
    judge = judge_labels(
        [record("blurred", ["none"] * 9), record("oracle", ["full"] * 19 + ["none"])]
    )
    assert not judge["by_condition"]["blurred"]["degenerate"]
    assert judge["by_condition"]["oracle"]["degenerate"]
    assert judge["by_condition"]["oracle"]["dominant_share"] == 0.95
    assert not judge["degenerate"]
    assert judge["canary"]["rate"] == 0.0


def test_a_run_reports_its_canary_and_a_rejudge_runs_its_own(tmp_path, monkeypatch):
    """`cts run` then `cts rejudge` (scripted roles behind the real cache): the run's judge
    labels by position whatever the answer, and its report warns; the rejudge draws the same
    records, replaces their canary with its own judge's, and its report is silent on it."""
    from cts.eval.run.records import RecordStore
    from cts.eval.run.run_dir import RunDir
    from tests.eval.test_rejudge import make_source, rejudge

    # The restated question as the canary's answer: another instance's nuggets would hold the
    # nuggets that make this scripted judge fail.
    source = make_source(
        tmp_path, monkeypatch, "judge.canary.share=0.5", "judge.canary.answer=[restated]"
    )
    report = RunDir(source).report_md.read_text()
    assert "WARNING" in report and "answer-independence canary (" in report
    old = RecordStore(source).completed()
    drawn = {k for k, r in old.items() if r.canary is not None}
    reached = {k for k, r in old.items() if r.labels}
    assert drawn == {k for k in reached if canary_drawn(k, 0.5)} and drawn
    out = tmp_path / "again"
    # The reading judge credits a restated question: its canary is asked another instance's
    # nuggets only.
    options = ["judge.canary.share=0.5", "judge.canary.answer=[other]"]
    rejudge(source, out, monkeypatch, options, judge=reading_judge)
    new = RecordStore(out).completed()
    # The same draw; and the records whose judge failed in the source are judged now.
    carried = {k: r.canary for k, r in new.items() if r.canary is not None}
    assert set(carried) == {k for k, r in new.items() if r.labels and canary_drawn(k, 0.5)}
    assert drawn < set(carried)
    assert all(set(c.labels.values()) == {"none"} for c in carried.values())
    report = RunDir(out).report_md.read_text()
    assert "answer-independence canary (" not in report
    assert "Answer-independence canary: nugget labels full or partial: other answer 0 of " in report
