"""The pipeline and runner with scripted engines: information flow, records, shards, resume."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cts.eval.data.schema import Instance
from cts.eval.report.dialogue_diagnostics import clarification
from cts.eval.run.config_sections import ALL_CONDITIONS, ClarificationConfig, JudgeConfig
from cts.eval.run.pipeline import PipelineContext, run_instance
from cts.eval.run.records import RecordFileError, RecordStore, merge
from cts.eval.run.run_dir import Shard
from cts.eval.run.runner import RunOutcome, run_keys
from tests.scripted import dev_instances as instances
from tests.scripted import scripted_context as context

CONDITIONS: list[str] = list(ALL_CONDITIONS)
SENTINEL = "SENTINEL-7f3a"


CLARIFICATION_OPTIONS = [
    ClarificationConfig(),
    ClarificationConfig(mode="all_at_once", allow_stop=True),
    ClarificationConfig(answerer="abstractive", question_types="llm"),
]


def restated_canary(request, instances) -> bool:  # type: ignore[no-untyped-def]
    """Whether a judge request is the restatement canary's: its answer is a fused query."""
    user = request.messages[-1].content
    return any(f"\n{i.fused_query}\n" in user for i in instances)


@pytest.mark.parametrize("options", CLARIFICATION_OPTIONS, ids=lambda o: f"{o.mode}-{o.answerer}")
def test_the_fused_query_reaches_only_the_user_answerer(search, options):
    """The User Answerer discloses real spans of the fused query (its start); the sentinel sits
    where no answer reaches, and must never appear in another role's prompt."""
    planted = [
        i.model_copy(update={"fused_query": f"In 2024 {i.fused_query} {SENTINEL}"})
        for i in instances(3)
    ]
    ctx, roles = context(search, options=options)

    async def go():
        for condition in CONDITIONS:
            for instance in planted:
                record = await run_instance(instance, condition, 0, ctx)
                assert record.error is None, record.error
                if condition.startswith("clarify@"):
                    # Real answers flowed on to the rewriter, not only `unknown`.
                    assert any(a != "unknown" for a in record.answers), record.answers
                    assert SENTINEL not in " ".join(record.answers)
            for role in (
                "clarifier",
                "rewriter",
                "searcher",
                "summarizer",
                "question_classifier",
                "judge",
            ):
                requests = roles[role].requests
                if role == "judge":
                    # The restatement canary shows the judge the fused query as an answer (a
                    # diagnostic request, whose labels never score: `judge.canary.answer`).
                    requests = [r for r in requests if not restated_canary(r, planted)]
                seen = [m.content for r in requests for m in r.messages]
                # The oracle condition searches on the fused query by definition.
                if condition == "oracle" and role in ("searcher", "summarizer"):
                    continue
                assert not [c for c in seen if SENTINEL in c], (condition, role)
            if condition.startswith("clarify@") and options.answerer == "extractive":
                rewritten = [m.content for r in roles["rewriter"].requests for m in r.messages]
                assert any("2024" in c for c in rewritten)  # a disclosed span reached it
            for engine in roles.values():
                engine.requests.clear()

    asyncio.run(go())


def test_the_user_answerer_does_see_it_and_the_judge_only_when_asked(search):
    (instance,) = instances(1)
    instance = instance.model_copy(
        update={"fused_query": f"In 2024, {instance.fused_query} {SENTINEL}"}
    )
    ctx, roles = context(search)
    record = asyncio.run(run_instance(instance, "clarify@2", 0, ctx))
    assert record.questions == ["Which year?", "Which city?"]
    assert record.answers == ["2024", "In 2024"]
    assert record.question_types == [["time"], ["region"]]
    assert SENTINEL in roles["user_answerer"].requests[0].messages[0].content
    # The study's judge sees the answer and the nuggets only.
    judged = roles["judge"].requests[0].messages[1].content
    assert SENTINEL not in judged and judged.startswith("Answer:")
    ctx.judge = JudgeConfig(show_query=True)
    roles["judge"].requests.clear()
    asyncio.run(run_instance(instance, "blurred", 0, ctx))
    judged = roles["judge"].requests[0].messages[1].content
    assert SENTINEL in judged and judged.startswith("Question: In 2024,")


def test_all_at_once_asks_k_questions_in_one_call(search):
    (instance,) = instances(1)
    ctx, roles = context(search, options=ClarificationConfig(mode="all_at_once"))
    record = asyncio.run(run_instance(instance, "clarify@3", 0, ctx))
    assert record.error is None, record.error
    assert len(roles["clarifier"].requests) == 1
    schema = roles["clarifier"].requests[0].output.json_schema["properties"]["questions"]
    assert schema["minItems"] == schema["maxItems"] == 3
    assert record.questions == ["Which year?", "Which city?", "Which model?"]
    assert len(roles["user_answerer"].requests) == 3 and not record.stopped_early
    # Room for three questions, not one.
    assert roles["clarifier"].requests[0].sampling.max_tokens == 3 * 64


def test_a_sequential_stop_keeps_the_question_written_beside_it(search):
    """What a fine-tuned clarifier learns to output when it stops (cts/train/pairs.py)."""
    (instance,) = instances(1)
    ctx, roles = context(search, options=ClarificationConfig(allow_stop=True))

    def stop_at_turn_two(request):
        if "\nQ1" in request.messages[-1].content:
            return json.dumps({"question": "Nothing more to ask.", "stop": True})
        return json.dumps({"question": "Which year?", "stop": False})

    roles["clarifier"].script = stop_at_turn_two
    two = asyncio.run(run_instance(instance, "clarify@2", 0, ctx))
    assert (two.questions, two.stopped_early) == (["Which year?"], True)
    assert two.stop_question == "Nothing more to ask."
    # clarify@1 took its one question before the stop: no stop of its own.
    one = asyncio.run(run_instance(instance, "clarify@1", 0, ctx))
    assert (one.questions, one.stopped_early, one.stop_question) == (["Which year?"], False, "")


def test_abstractive_answers_are_post_checked_and_counted(search):
    (instance,) = instances(1)
    ctx, _ = context(
        search, options=ClarificationConfig(answerer="abstractive", question_types="llm")
    )
    record = asyncio.run(run_instance(instance, "clarify@2", 0, ctx))
    assert record.error is None, record.error
    assert record.answers == ["probably Sweden", "probably Sweden"]
    assert record.unsupported_words == [["probably", "sweden"]] * 2
    assert record.question_types == [["numeric"], ["numeric"]]
    diagnostics = clarification([record])
    assert diagnostics["unsupported_answers"] == {"checked": 2, "rate": 1.0}
    assert diagnostics["question_type_counts"]["numeric"] == 2


def test_a_record_carries_everything(search, tmp_path):
    (instance,) = instances(1)
    ctx, _ = context(search, tmp_path / "traces")
    record = asyncio.run(run_instance(instance, "clarify@1", 3, ctx))
    assert record.key == (instance.id, "clarify@1", 3)
    assert record.rewrite and record.search_query == record.rewrite
    assert record.answer == "an answer" and record.termination == "answer"
    assert record.doc_ids and record.trace_id
    assert (tmp_path / "traces" / record.trace_id).is_file()
    assert set(record.labels) == {n.id for n in instance.golden.nuggets}
    assert set(record.scores) == {"restore_score_100", "strict", "unweighted"}


def test_a_failing_instance_is_recorded_with_its_error_and_the_run_goes_on(search, tmp_path):
    ctx, roles = context(search)
    from cts.serving.errors import EngineUnavailable

    roles["rewriter"].script = lambda r: EngineUnavailable("http://gpu7:8000/v1: down")
    store = RecordStore(tmp_path)
    outcome = run_through(ctx, (instances(2), ["blurred", "clarify@1"], [0]), store)
    assert outcome.ran == 4 and outcome.failures == {"engine_unavailable": 2}
    failed = [r for r in store.completed().values() if r.error]
    assert {r.condition for r in failed} == {"clarify@1"}
    assert failed[0].error["stage"] == "rewrite" and "gpu7" in failed[0].error["message"]
    assert failed[0].questions == ["Which year?"]  # the work done before the failure is kept


def _fails_after(calls: int, script):
    """`script`, until `calls` requests have been answered; then an unavailable server."""
    from cts.serving.errors import EngineUnavailable

    answered = []

    def failing(request):
        answered.append(request)
        return EngineUnavailable("down") if len(answered) > calls else script(request)

    return failing


@pytest.mark.parametrize(
    ("role", "calls", "condition", "kind", "stage"),
    [
        ("clarifier", 1, "clarify@2", "engine_unavailable", "clarify"),
        ("searcher", 1, "clarify@1", "search_error", "search"),
        ("judge", 0, "clarify@1", "engine_unavailable", "judge"),
    ],
)
def test_a_failed_stage_is_the_error_and_what_came_before_it_stays(
    search, tmp_path, role, calls, condition, kind, stage
):
    """Each stage's output is in the record even when a later stage fails: the first
    question when the second cannot be asked; the search run's answer, usage and trace when
    its model fails mid-run or the judge fails after it."""
    ctx, roles = context(search, tmp_path / "traces")
    roles[role].script = _fails_after(calls, roles[role].script)
    (instance,) = instances(1)
    record = asyncio.run(run_instance(instance, condition, 0, ctx))
    assert record.error is not None
    assert (record.error["kind"], record.error["stage"]) == (kind, stage)
    assert record.error["message"].endswith("down")
    assert record.questions[:1] == ["Which year?"] and not record.scores
    # seconds are rounded to 1 ms and a scripted stage can fail faster than that
    assert record.seconds >= 0
    if stage == "clarify":
        assert record.questions == ["Which year?"] and record.rewrite is None
        assert not record.search_query and not record.trace_id
    else:
        assert record.rewrite and record.search_query == record.rewrite
        assert record.termination and record.usage["search_llm_calls"] >= 1
        assert (tmp_path / "traces" / str(record.trace_id)).is_file()
    if stage == "judge":
        assert record.answer == "an answer" and not record.labels


def run_through(
    ctx: PipelineContext,
    keys: tuple[list[Instance], list[str], list[int]],
    store: RecordStore,
    **options: Any,
) -> RunOutcome:
    """run_keys over `keys` (instances, conditions, seeds), each key through the pipeline of
    `ctx`; what it says it did."""
    return asyncio.run(run_keys(*keys, partial(run_instance, ctx=ctx), store, **options))


def run_all(search, run_dir: Path, shard: Shard | None = None):
    ctx, _ = context(search)
    store = RecordStore(run_dir)
    run_through(ctx, (instances(), CONDITIONS, [0, 1]), store, shard=shard or Shard())
    return store


def comparable(records) -> dict:
    return {k: r.model_dump(exclude={"seconds"}) for k, r in records.items()}


def test_three_shards_merged_equal_one_unsharded_run(search, tmp_path):
    whole = run_all(search, tmp_path / "whole")
    for i in range(3):
        run_all(search, tmp_path / "sharded", Shard(i, 3))
    expected = merge(whole, instances(), CONDITIONS, [0, 1])
    merged = merge(RecordStore(tmp_path / "sharded"), instances(), CONDITIONS, [0, 1])
    assert expected.ok and merged.ok
    assert comparable(merged.records) == comparable(expected.records)
    assert len(merged.records) == 4 * 5 * 2


def test_resume_skips_done_keys_and_merge_finds_gaps_and_duplicates(search, tmp_path):
    store = run_all(search, tmp_path, Shard(0, 2))
    report = merge(store, instances(), CONDITIONS, [0, 1])
    assert len(report.missing) == 20 and not report.duplicates  # shard 1 not run yet
    ctx, roles = context(search)
    again = run_through(ctx, (instances(), CONDITIONS, [0, 1]), store, shard=Shard(0, 2))
    assert again.ran == 0 and again.skipped == 20 and not roles["searcher"].requests
    path = store.path("blurred", Shard(0, 2))
    path.write_text(path.read_text() + path.read_text().splitlines(keepends=True)[0])
    assert merge(store, instances(), CONDITIONS, [0, 1]).duplicates


def test_a_torn_last_line_is_dropped_and_rerun(search, tmp_path):
    store = run_all(search, tmp_path)
    path = store.path("oracle", Shard())
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    assert len(store.completed()) == 39
    run_all(search, tmp_path)
    report = merge(store, instances(), CONDITIONS, [0, 1])
    assert report.ok and len(report.records) == 40


def test_shard_parsing():
    assert Shard.parse("2/4") == Shard(2, 4)
    for bad in ("4/4", "x", "1/0", "-1/3"):
        with pytest.raises(ValueError):
            Shard.parse(bad)


def test_a_corrupt_record_line_is_an_error_naming_file_and_line(tmp_path):
    store = RecordStore(tmp_path)
    path = store.path("blurred", Shard())
    path.parent.mkdir(parents=True)
    path.write_text('{"instance_id": "a", "condition": "blurred", "seed": 0}\n{"oops": 1}\n')
    with pytest.raises(RecordFileError, match=r"shard-0-of-1.jsonl:2: instance_id: Field required"):
        store.completed()


def test_a_non_finite_score_in_a_records_file_is_an_error_naming_file_and_line(tmp_path):
    """JSON reads NaN and Infinity: a hand-edited or foreign line with one must stop the reader
    with its file and line, not reach the statistics (where an MDE search never ended)."""
    store = RecordStore(tmp_path)
    path = store.path("blurred", Shard())
    path.parent.mkdir(parents=True)
    good = '{"instance_id": "a", "condition": "blurred", "seed": 0, "scores": {"strict": 5}}\n'
    for bad in ("NaN", "Infinity", "-Infinity"):
        line = '{"instance_id": "b", "condition": "blurred", "seed": 0, "scores": '
        path.write_text(good + line + f'{{"restore_score_100": {bad}}}}}\n')
        with pytest.raises(
            RecordFileError,
            match=r"shard-0-of-1.jsonl:2: scores.restore_score_100: .* is not a finite number",
        ):
            store.completed()


def test_retry_failed_reruns_only_failures_and_the_success_counts(search, tmp_path):
    ctx, roles = context(search)
    store = RecordStore(tmp_path)
    data = instances(2)
    broken = {"on": True}
    original = roles["searcher"].script

    def flaky(request):  # type: ignore[no-untyped-def]
        if broken["on"] and data[0].blurred_query in request.messages[-1].content:
            return RuntimeError("server down")
        return original(request)

    roles["searcher"].script = flaky

    def run(retry: bool):  # type: ignore[no-untyped-def]
        return run_through(ctx, (data, ["blurred"], [0]), store, retry_failed=retry)

    first = run(False)
    assert (first.ran, sum(first.failures.values())) == (2, 1)
    broken["on"] = False
    assert run(False).ran == 0  # a recorded failure is done unless retried
    again = run(True)
    assert (again.ran, again.skipped, sum(again.failures.values())) == (1, 1, 0)
    # Both lines stay on disk; the success counts, and it is not a duplicate.
    assert len(store.read(store.path("blurred", Shard()))) == 3
    assert all(r.error is None for r in store.completed().values())
    merged = merge(store, data, ["blurred"], [0])
    assert merged.ok and all(r.error is None for r in merged.records.values())


@pytest.mark.parametrize("role", ["clarifier", "user_answerer", "rewriter", "searcher", "judge"])
def test_a_dead_server_stops_the_run_and_resume_finishes_it_as_if_uninterrupted(
    search, tmp_path, role
):
    """Nobody listening (ServerUnreachable) is not a key's failure: no failure record, no
    failed dialogue saved; the keys in flight stop unrecorded, the error reaches the caller,
    and a resume with the server back gives the records an uninterrupted run gives."""
    from cts.eval.run.dialogue import DialogueStore
    from cts.serving.errors import ServerUnreachable

    def run(root: Path, dead_after: int | None = None):
        store = DialogueStore(root / "dialogues", "shard-0-of-1")
        ctx, roles = context(search, root / "traces", store=store)
        if dead_after is not None:
            script = roles[role].script
            answered: list[object] = []

            def dying(request):
                answered.append(request)
                if len(answered) > dead_after:
                    return ServerUnreachable("http://gpu7:8000/v1: 5 attempts failed")
                return script(request)

            roles[role].script = dying
        keys = (instances(3), ["blurred", "clarify@1", "clarify@2"], [0])
        return run_through(ctx, keys, RecordStore(root), **kw)

    kw = {"concurrency": 3}
    run(tmp_path / "whole")
    with pytest.raises(ServerUnreachable, match="gpu7"):
        run(tmp_path / "cut", dead_after=2)
    cut = RecordStore(tmp_path / "cut").completed()
    assert len(cut) < 9 and all(r.error is None for r in cut.values())
    saved = tmp_path / "cut" / "dialogues" / "shard-0-of-1.jsonl"
    lines = saved.read_text().splitlines() if saved.exists() else []
    assert all(json.loads(line)["error"] is None for line in lines)
    outcome = run(tmp_path / "cut")
    assert outcome.ran == 9 - len(cut) and not outcome.failures

    def comparable(root: Path) -> dict:
        return {
            key: (r.questions, r.answers, r.rewrite, r.answer, r.labels, r.scores)
            for key, r in RecordStore(root).completed().items()
        }

    assert comparable(tmp_path / "cut") == comparable(tmp_path / "whole")
