"""One bad key cannot kill a run: an exception the protocol does not know becomes that key's
`internal` failure record (stage, kind, message, traceback); the other keys finish, and a
resume does not repeat it."""

from __future__ import annotations

import asyncio

from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.runner import run_keys
from tests.scripted import dev_instances as instances
from tests.scripted import scripted_context as context


def test_an_unexpected_exception_is_one_internal_failure_and_the_run_goes_on(search, tmp_path):
    ctx, roles = context(search, tmp_path / "traces")
    good, bad = instances(2)
    assert bad.golden is not None
    marker = bad.golden.nuggets[0].text
    script = roles["judge"].script

    def judge(request):
        # The judge's prompt of one instance trips a parser's recursion limit.
        if any(marker in m.content for m in request.messages):
            raise RecursionError("deep")
        return script(request)

    roles["judge"].script = judge
    store = RecordStore(tmp_path / "run")

    def work(i, c, s):
        return run_instance(i, c, s, ctx)

    outcome = asyncio.run(run_keys([good, bad], ["oracle"], [0], work, store))
    assert outcome.ran == 2 and dict(outcome.failures) == {"internal": 1}, outcome
    records = {r.instance_id: r for r in store.completed().values()}
    failed = records[bad.id]
    assert failed.error is not None
    assert (failed.error["kind"], failed.error["stage"]) == ("internal", "judge")
    assert failed.error["message"] == "RecursionError: deep"
    assert "RecursionError" in failed.error["traceback"]
    assert failed.answer  # the search before the failing stage is kept
    assert records[good.id].error is None and records[good.id].scores

    # Resuming does not repeat the failed key (it is done unless --retry-failed).
    again = asyncio.run(run_keys([good, bad], ["oracle"], [0], work, store))
    assert again.ran == 0 and again.skipped == 2


def test_trace_names_stay_inside_and_never_collide():
    """Trace names come from a hash of the id: ids differing only in case (one file on a
    case-insensitive file system), or only in characters a file name cannot hold, get
    different files, and no id — even one validation would refuse — names a path outside."""
    from cts.eval.data.schema import Record
    from cts.eval.run.pipeline import trace_name

    ids = ["Q1", "q1", "a b", "a_b", "问题1", "问题2", "../../x", "..", ".hidden", "x" * 300]
    names = [
        trace_name(Record(instance_id=i, condition="clarify@2", seed=1, language="en")) for i in ids
    ]
    assert len({n.lower() for n in names}) == len(ids)
    for name in names:
        directory, file = name.split("/")
        assert directory == "clarify-2" and file.endswith("-seed1.json")
        assert not file.startswith(".") and len(file.encode()) < 100
    assert names[0].startswith("clarify-2/Q1-")  # plain ids stay readable


def test_the_logged_traceback_of_an_internal_failure_is_redacted(
    search, tmp_path, monkeypatch, caplog
):
    """On a cluster the log is the Slurm log: a key quoted by an unexpected exception is
    redacted there as in the record."""
    from cts.foundation.secrets import secret_from_env

    key = "sk-live-internal-0123456789"
    monkeypatch.setenv("CTS_TEST_KEY", key)
    secret_from_env("CTS_TEST_KEY")
    ctx, roles = context(search, tmp_path / "traces")
    (instance,) = instances(1)

    def judge(request):
        raise RuntimeError(f"header Authorization: Bearer {key}")

    roles["judge"].script = judge
    store = RecordStore(tmp_path / "run")
    with caplog.at_level("ERROR"):
        outcome = asyncio.run(
            run_keys([instance], ["oracle"], [0], lambda i, c, s: run_instance(i, c, s, ctx), store)
        )
    assert dict(outcome.failures) == {"internal": 1}
    assert "internal error at stage judge" in caplog.text and "RuntimeError" in caplog.text
    assert key not in caplog.text and "Bearer [redacted]" in caplog.text
    (record,) = store.completed().values()
    assert key not in record.error["message"] and key not in record.error["traceback"]
