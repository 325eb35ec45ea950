"""`cts view` answers any request with work linear in what it reads and bounded by a cap per
field: a longer text is shown cut, with its length and a link to the raw file. The shape is
counted (Python bytecodes executed, peak memory allocated), never timed."""

from __future__ import annotations

import json
import random
import re
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.viewer.app import make_app
from cts.eval.viewer.cuts import MAX_FIELD_CHARS
from cts.eval.viewer.highlight import highlight
from cts.eval.viewer.listen import allowed_hosts
from cts.eval.viewer.trace import search_blocks
from cts.eval.viewer.trace import visited_pages as visited
from cts.eval.viewer.view import Viewer
from cts.webdancer.search import QUERY_SEPARATOR, SearchHit, render_hits
from cts.webdancer.visit import render_visit
from tests.eval.viewer.test_view import LOCAL, a_trace, llm_step, search_step

WORDS = "battery charge hours case earbuds noise cancelling lasts up to per".split()


def _text(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < n:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)[:n]


def _big_run(root: Path, n: int) -> Record:
    """One record whose answer, judge quotes, model turn and search and visit responses are
    each about `n` characters; the quotes match nowhere and everywhere."""
    resolved = load_experiment("quickstart", ["dataset.limit=1", "seeds=[0]"])
    RunDir(root).write_config(resolved)
    (instance,) = load_instances(DatasetSource(path="sample", split="dev", limit=1))
    answer = _text(n)
    trace = a_trace(answer)
    # Ten hits whose snippets grow with n: the lists of a trace stay as long.
    hits = [
        SearchHit(f"T{i} {_text(40, i)}", f"https://a.example/{i}", _text(n // 10, i))
        for i in range(10)
    ]
    trace["steps"] += [
        llm_step(f"<think>\n{_text(n, 1)}\n</think>\n<tool_call>\n{{}}\n</tool_call>"),
        search_step("q", hits),
        {
            "kind": "tool",
            "tool": "visit",
            "result": render_visit("https://a.example/1", "g", _text(n, 2), _text(n, 3)),
        },
    ]
    name = "blurred/big.json"
    path = RunDir(root).traces / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(trace))
    assert instance.golden is not None
    quotes = [_text(n // 2, 4), "battery charge", "lasts up to"]
    record = Record(
        instance_id=instance.id,
        condition="blurred",
        seed=0,
        answer=answer,
        trace_id=name,
        scores={"restore_score_100": 50.0},
        labels={f"n{i}": {"label": "full", "evidence": quotes[i % 3]} for i in range(30)},
    )
    RecordStore(root).append(record, Shard())
    return record


def _counted(work: Callable[[], Any]) -> tuple[int, int]:
    """(Python bytecodes executed, peak bytes allocated) by `work`: the same on any machine."""
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    tracemalloc.start()
    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return count, peak


def _sample_work(tmp_path: Path, n: int) -> tuple[int, int]:
    root = tmp_path / f"run-{n}"
    record = _big_run(root, n)
    viewer = Viewer([root])
    key = (0, record.instance_id, record.condition, record.seed)
    viewer.sample(*key)  # once first: the dataset is read on the first sample only
    return _counted(lambda: json.dumps(viewer.sample(*key)))


def test_a_samples_work_grows_at_most_linearly_and_stops_growing_at_the_cap(tmp_path):
    """10× the text is at most ~10× the work below the cap, and about the same work above it
    (the old page built a set per character of the answer and grew each segment one character
    at a time: 3 GB for a 4 MB answer)."""
    small, below = (
        _sample_work(tmp_path, n) for n in (MAX_FIELD_CHARS // 20, MAX_FIELD_CHARS // 2)
    )
    at, above = (_sample_work(tmp_path, n) for n in (MAX_FIELD_CHARS, 10 * MAX_FIELD_CHARS))
    assert below[0] <= 12 * small[0], (small, below)
    assert above[0] <= 1.5 * at[0], (at, above)
    # Memory: what was read (the trace and record files, ~5 copies of n), not ~800 bytes a
    # character of the answer.
    assert above[1] <= 40 * 10 * MAX_FIELD_CHARS, above


@pytest.fixture
def big(tmp_path: Path) -> tuple[TestClient, Record]:
    record = _big_run(tmp_path / "run", 3 * MAX_FIELD_CHARS)
    client = TestClient(make_app(Viewer([tmp_path / "run"]), allowed_hosts("127.0.0.1")), LOCAL)
    return client, record


def test_a_long_text_is_shown_cut_with_its_length_and_a_link_to_the_raw_file(big):
    client, record = big
    params = {"run": 0, "instance": record.instance_id, "condition": "blurred", "seed": 0}
    sample = client.get("/api/sample", params=params).json()
    assert sample["cut"]
    answer = "".join(s["text"] for s in sample["answer_segments"])
    assert answer.startswith(record.answer[:MAX_FIELD_CHARS])
    assert f"[cut: {len(record.answer):,} characters in all" in answer
    assert len(sample["record"]["answer"]) < MAX_FIELD_CHARS + 100
    for turn in sample["trace"]["turns"]:
        assert len(turn["text"]) < MAX_FIELD_CHARS + 100
    raw = client.get(sample["raw"]["record"])
    assert raw.status_code == 200 and Record.model_validate_json(raw.content) == record
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"
    assert raw.headers["x-content-type-options"] == "nosniff"
    trace = client.get(sample["raw"]["trace"])
    assert trace.status_code == 200 and json.loads(trace.content)["answer"] == record.answer
    assert client.get("/api/raw", params={**params, "part": "x"}).status_code == 400


# -- the parsers read what the renderers write, in one pass -------------------------------------

_OLD_HIT = re.compile(
    r"^(\d+)\. \[([^\n]*)\]\((\S*)\)\n(?:Date published: ([^\n]*)\n)?\n?(.*?)"
    r"(?=\n\n\d+\. \[|\Z)",
    re.DOTALL | re.MULTILINE,
)
_OLD_PAGE = re.compile(
    r"The useful information in (.*?) for user goal (.*?) as follows: \n\n"
    r"Evidence in page: \n(.*?)\n\nSummary: \n(.*)",
    re.DOTALL,
)


def test_the_linear_parsers_read_rendered_tools_as_the_old_patterns_did():
    rng = random.Random(7)
    for trial in range(200):
        hits = [
            SearchHit(
                rng.choice(["T", "a [b] c", "x](y", ""]),
                rng.choice(["https://a.example/p", "u(1)", ""]),
                # (an empty snippet made the old pattern swallow the next hit)
                rng.choice(["one line", "two\nlines", "3. [not a hit] here"]),
                rng.choice([None, "2024-01-01"]),
            )
            for _ in range(rng.randrange(0, 4))
        ]
        query = rng.choice(["q", "it's ' found 3 results:", "中文"])
        text = render_hits(query, hits)
        (block,) = search_blocks(text, [])
        old = [(int(m[1]), m[2], m[3], m[4], m[5].strip()) for m in _OLD_HIT.finditer(text)]
        new = [(h["rank"], h["title"], h["url"], h["date"], h["snippet"]) for h in block["hits"]]
        assert new == old, (trial, text)
        assert block["query"] == (query if hits else None)
        page = render_visit(
            rng.choice(["https://a.example/", "u for user goal v"]),
            rng.choice(["g", "a goal as follows: x"]),
            rng.choice(["e", "two\n\nparas"]),
            rng.choice(["s", "Summary: \nagain"]),
        )
        found = _OLD_PAGE.search(page)
        assert found is not None
        (shown,) = visited(page, [], {})
        assert (shown["url"], shown["goal"], shown["evidence"], shown["summary"]) == (
            found[1],
            found[2],
            found[3].strip(),
            found[4].strip(),
        )


def test_the_quote_marks_match_the_old_pattern_on_random_answers():
    rng = random.Random(3)
    for _ in range(300):
        answer = "".join(
            rng.choice(["Ab", "ab", " ", "\n", "  ", "c", "İ", "ß"]) for _ in range(30)
        )
        words = answer.split()
        quotes = {
            f"n{i}": " ".join(words[rng.randrange(len(words)) :][: rng.randrange(1, 4)])
            if words
            else "x"
            for i in range(3)
        }
        covered = [set() for _ in answer]
        for nugget, quote in quotes.items():
            parts = quote.split()
            if len("".join(parts)) < 3:
                continue
            pattern = re.compile(r"\s+".join(re.escape(w) for w in parts), re.IGNORECASE)
            for m in pattern.finditer(answer):
                for i in range(m.start(), m.end()):
                    covered[i].add(nugget)
        segments = highlight(answer, quotes)
        marked = [tuple(s["nuggets"]) for s in segments for _ in s["text"]]
        assert "".join(s["text"] for s in segments) == answer
        assert marked == [tuple(sorted(c)) for c in covered], (answer, quotes)


def test_search_texts_that_made_the_old_patterns_backtrack_are_read_in_one_pass():
    """A line of "](" repeated, a page text without its separators: read, not matched."""
    line = "1. [" + "](" * 50_000
    (block,) = search_blocks(line + "\n\nx", [])
    assert block["hits"] == [] and block["text"].startswith("1. [")
    (page,) = visited("The useful information in " + "x for user goal " * 20_000, [], {})
    assert page["url"] is None
    joined = QUERY_SEPARATOR.join([render_hits("q", [SearchHit("t", "u", "s")])] * 3)
    assert [len(b["hits"]) for b in search_blocks(joined, [])] == [1, 1, 1]
    empty = render_hits("q", [SearchHit("a", "u1"), SearchHit("b", "u2")])  # no snippets
    assert [h["title"] for h in search_blocks(empty, [])[0]["hits"]] == ["a", "b"]
