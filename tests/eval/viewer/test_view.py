"""`cts view`: the index API (filters, sorting, pages), a sample with its trace, what it refuses
(paths out of traces/, other Host names, writes), and, in headless Chromium, the pages
themselves and report.html (figures, printing at A4)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from cts.cli import app as cts_app
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.viewer.app import make_app
from cts.eval.viewer.highlight import highlight
from cts.eval.viewer.index import parse_query
from cts.eval.viewer.listen import allowed_hosts
from cts.eval.viewer.view import Viewer
from cts.webdancer.search import QUERY_SEPARATOR, SearchHit, render_hits
from cts.webdancer.visit import render_visit
from tests.scripted_cts import ROOT, cts

SEEDS = [0, 1]
LOCAL = "http://127.0.0.1"


# -- a run directory written record by record -------------------------------------------------


def search_step(query: str, hits: list[SearchHit]) -> dict[str, Any]:
    return {
        "kind": "tool",
        "tool": "search",
        "arguments": {"query": [query]},
        "result": render_hits(query, hits),
        "doc_ids": [h.doc_id for h in hits if h.doc_id],
        "urls": [h.url for h in hits],
        "errors": {},
        "evidence": [{"id": h.doc_id or h.url, "url": h.url} for h in hits],
        "cached": False,
        "latency_s": 0.01,
    }


def llm_step(text: str, final: bool = False) -> dict[str, Any]:
    return {
        "kind": "llm",
        "final": final,
        "text": text,
        "finish_reason": "stop",
        "cached": False,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "latency_s": 0.1,
    }


def a_trace(answer: str) -> dict[str, Any]:
    """A search run as cts.webdancer.agent writes it: search, visit (one page read, one failed),
    answer; the tool texts from the real renderers."""
    hits = [
        SearchHit(
            "Aura specs", "https://korvex.example/aura", "6 hours per charge", None, "A-0003"
        ),
        SearchHit("Other", "https://other.example/x", "", "2024-01-01", "B-0041"),
    ]
    visit = QUERY_SEPARATOR.join(
        [
            render_visit("https://korvex.example/aura", "battery", "7.5 hours quoted", "Long."),
            render_visit("https://gone.example/", "battery", "could not", "nothing"),
        ]
    ).strip()
    call = '{"name": "search", "arguments": {"query": ["aura battery"]}}'
    visit_call = (
        '{"name": "visit", "arguments": {"url": ["https://korvex.example/aura", '
        '"https://gone.example/"], "goal": "battery"}}'
    )
    return {
        "answer": answer,
        "termination": "answer",
        "messages": [],
        "steps": [
            llm_step(f"<think>\nlook it up\n</think>\n<tool_call>\n{call}\n</tool_call>"),
            search_step("aura battery", hits),
            llm_step(f"<think>\nread the page\n</think>\n<tool_call>\n{visit_call}\n</tool_call>"),
            {
                "kind": "tool",
                "tool": "visit",
                "arguments": {"url": ["https://korvex.example/aura"], "goal": "battery"},
                "result": visit,
                "doc_ids": ["A-0003"],
                "urls": ["https://korvex.example/aura", "https://gone.example/"],
                "errors": {"https://gone.example/": "not in the local corpus"},
                "evidence": [{"id": "A-0003", "url": "https://korvex.example/aura"}],
                "cached": True,
                "latency_s": 0.01,
            },
            llm_step(f"<think>\nenough\n</think>\n<answer>\n{answer}\n</answer>", final=True),
        ],
        "llm_calls": 3,
        "prompt_tokens": 300,
        "completion_tokens": 60,
        "seconds": 0.3,
        "error": None,
        "doc_ids": ["A-0003", "B-0041"],
    }


XSS_ID = 'x<img src=x onerror="window.__xss=1">'
XSS_ANSWER = (
    'Battery: <script>window.__xss=2</script> and <img src=x onerror="window.__xss=3"> '
    "It lasts 7.5 hours per charge."
)


def records_for(instances: list[Any]) -> list[Record]:
    """Every instance × condition × seed, with scores, failures and all-unknown dialogues
    spread over them by position (so that each filter keeps some and drops some)."""
    out = []
    for i, instance in enumerate(instances):
        for c, condition in enumerate(ALL_CONDITIONS):
            for seed in SEEDS:
                k = int(condition[-1]) if condition.startswith("clarify@") else 0
                n = i * 10 + c * 2 + seed
                failed = n % 17 == 0
                answers = ["unknown" if (n + j) % 3 else "2024" for j in range(k)]
                record = Record(
                    instance_id=instance.id,
                    condition=condition,
                    seed=seed,
                    language=instance.language,
                    removed_constraints=list(instance.removed_constraints),
                    questions=[f"Which {j}?" for j in range(k)],
                    answers=answers,
                    question_types=[["time"]] * k,
                    search_query=instance.blurred_query,
                    answer=f"answer {n}",
                    termination="error" if failed else "answer",
                    scores={} if failed else {"restore_score_100": float(n % 101)},
                    error={"kind": "search_error", "stage": "search", "message": f"boom {n}"}
                    if failed
                    else None,
                )
                out.append(record)
    return out


def make_run(root: Path, limit: int = 24) -> list[Record]:
    """A run directory of the quickstart's config over the sample dev split, written with the
    run directory's and record store's own writers; one record per key, plus a trace each
    for the first instance."""
    resolved = load_experiment("quickstart", [f"dataset.limit={limit}", f"seeds={SEEDS}"])
    RunDir(root).write_config(resolved)
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=limit))
    records = records_for(instances)
    store = RecordStore(root)
    for record in records:
        if record.instance_id == instances[0].id:
            name = f"{record.condition.replace('@', '-')}/{record.instance_id}-s{record.seed}.json"
            path = RunDir(root).traces / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(a_trace(record.answer)))
            record.trace_id = name
            golden = instances[0].golden
            assert golden is not None
            record.labels = {
                n.id: {"label": ["full", "partial", "none"][j % 3], "evidence": record.answer}
                for j, n in enumerate(golden.nuggets)
            }
        store.append(record, Shard())
    return records


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Record]]:
    root = tmp_path_factory.mktemp("view") / "run"
    return root, make_run(root)


@pytest.fixture(scope="module")
def client(run: tuple[Path, list[Record]]) -> Iterator[TestClient]:
    with TestClient(make_app(Viewer([run[0]]), allowed_hosts("127.0.0.1")), LOCAL) as c:
        yield c


def page(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/api/records", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def every_key(client: TestClient, **params: Any) -> list[tuple[str, str, int]]:
    """The keys of every page of a query, in order (pages of an odd size)."""
    keys: list[tuple[str, str, int]] = []
    offset = 0
    while True:
        found = page(client, offset=offset, limit=37, **params)
        keys += [(r["instance_id"], r["condition"], r["seed"]) for r in found["rows"]]
        offset += 37
        if offset >= found["total"]:
            return keys


# -- the index --------------------------------------------------------------------------------


FILTERS = [
    ({}, lambda r: True),
    ({"condition": "clarify@2"}, lambda r: r.condition == "clarify@2"),
    ({"condition": "blurred,oracle"}, lambda r: r.condition in ("blurred", "oracle")),
    ({"language": "zh"}, lambda r: r.language == "zh"),
    ({"removed": "region"}, lambda r: "region" in r.removed_constraints),
    ({"failed": "1"}, lambda r: r.error is not None),
    ({"failed": "0"}, lambda r: r.error is None),
    (
        {"all_unknown": "1"},
        lambda r: bool(r.answers) and all(a == "unknown" for a in r.answers),
    ),
    (
        {"score_min": "20", "score_max": "60.5"},
        lambda r: r.error is None and 20 <= r.scores["restore_score_100"] <= 60.5,
    ),
    (
        {"condition": "clarify@3", "all_unknown": "0", "failed": "0", "language": "en"},
        lambda r: (
            r.condition == "clarify@3"
            and r.error is None
            and r.language == "en"
            and any(a != "unknown" for a in r.answers)
        ),
    ),
    ({"q": "B-DEV"}, lambda r: "b-dev" in r.instance_id.lower()),
]


@pytest.mark.parametrize(("params", "keep"), FILTERS, ids=lambda p: str(p))
def test_each_filter_keeps_exactly_the_records_it_names(client, run, params, keep):
    records = run[1]
    expected = {r.key for r in records if keep(r)}
    assert 0 < len(expected) < len(records) or not params
    assert page(client, limit=1, **params)["total"] == len(expected)
    keys = every_key(client, **params)
    # Every page together: each matching record exactly once.
    assert len(keys) == len(set(keys)) and set(keys) == expected


def test_the_first_page_is_the_natural_order_and_pages_are_counted(client, run):
    first = page(client)
    assert first["total"] == len(run[1]) == 24 * 5 * 2
    assert len(first["rows"]) == 50 and first["offset"] == 0
    rows = first["rows"]
    assert [(r["condition"], r["seed"]) for r in rows[:3]] == [
        ("blurred", 0),
        ("blurred", 1),
        ("clarify@1", 0),
    ]
    last = page(client, offset=200, limit=50)
    assert len(last["rows"]) == 40 and last["total"] == 240
    assert page(client, offset=1000)["rows"] == []


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_sorting_by_score_puts_failed_records_last_either_way(client, run, order):
    keys = every_key(client, sort="score", order=order)
    scores = [next(r for r in run[1] if r.key == k).scores.get("restore_score_100") for k in keys]
    present = [s for s in scores if s is not None]
    assert present == sorted(present, reverse=order == "desc")
    assert scores[len(present) :] == [None] * (len(scores) - len(present))
    assert len(present) < len(scores)


def test_sorting_by_condition_follows_the_study_order(client):
    rows = every_key(client, sort="condition", order="desc")
    ranks = [list(ALL_CONDITIONS).index(c) for _, c, _ in rows]
    assert ranks == sorted(ranks, reverse=True)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": "x"}, "limit"),
        ({"limit": "100000"}, "limit"),
        ({"offset": "-1"}, "offset"),
        ({"sort": "answer"}, "sort"),
        ({"order": "up"}, "order"),
        ({"failed": "maybe"}, "failed"),
        ({"score_min": "high"}, "score_min"),
        ({"run": "first"}, "run"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(client, params, named):
    response = client.get("/api/records", params=params)
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{named}:")


def test_parse_query_takes_repeated_and_comma_separated_values():
    query = parse_query({"condition": ["blurred,oracle", "clarify@1"], "limit": ["7"]})
    assert query.conditions == ["blurred", "oracle", "clarify@1"] and query.limit == 7


# -- a sample ---------------------------------------------------------------------------------


def sample_of(client: TestClient, record: Record, run_id: int = 0) -> dict[str, Any]:
    response = client.get(
        "/api/sample",
        params={
            "run": run_id,
            "instance": record.instance_id,
            "condition": record.condition,
            "seed": record.seed,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_sample_holds_its_queries_dialogue_trace_and_labels(client, run):
    record = next(r for r in run[1] if r.condition == "clarify@2" and r.trace_id and not r.error)
    sample = sample_of(client, record)
    instance = load_instances(DatasetSource(path="sample", split="dev", limit=1))[0]
    assert sample["instance"]["fused_query"] == instance.fused_query
    assert sample["instance"]["blurred_query"] == instance.blurred_query
    assert [t["question"] for t in sample["dialogue"]] == record.questions
    assert [t["unknown"] for t in sample["dialogue"]] == [a == "unknown" for a in record.answers]
    assert sample["dialogue"][0]["question_types"] == ["time"]
    search, visit, final = sample["trace"]["turns"]
    assert search["reasoning"] == "look it up"
    assert search["tool_call"] == {"name": "search", "arguments": {"query": ["aura battery"]}}
    (block,) = search["observation"]["searches"]
    assert block["query"] == "aura battery"
    assert [(h["doc_id"], h["title"], h["date"]) for h in block["hits"]] == [
        ("A-0003", "Aura specs", None),
        ("B-0041", "Other", "2024-01-01"),
    ]
    assert block["hits"][0]["snippet"] == "6 hours per charge"
    read, failed = visit["observation"]["pages"]
    assert (read["doc_id"], read["evidence"], read["summary"]) == (
        "A-0003",
        "7.5 hours quoted",
        "Long.",
    )
    assert read["error"] is None and failed["error"] == "not in the local corpus"
    assert final["answer"] == record.answer and final["final"] and final["observation"] is None
    assert instance.golden is not None
    nuggets = sample["nuggets"]
    assert [n["id"] for n in nuggets] == [n.id for n in instance.golden.nuggets]
    assert [n["weight"] for n in nuggets] == [n.weight for n in instance.golden.nuggets]
    assert [n["label"] for n in nuggets][:3] == ["full", "partial", "none"]
    # Every nugget quoted the whole answer: one segment, marked for all of them.
    assert sample["answer_segments"] == [
        {"text": record.answer, "nuggets": sorted(n.id for n in instance.golden.nuggets)}
    ]


def test_a_failed_sample_shows_its_stage_and_message(client, run):
    record = next(r for r in run[1] if r.error is not None and r.trace_id is None)
    sample = sample_of(client, record)
    assert sample["record"]["error"] == record.error
    assert sample["trace"] is None and sample["trace_error"] == "the record names no trace"


def test_an_unknown_key_is_a_404(client):
    response = client.get(
        "/api/sample", params={"run": 0, "instance": "nope", "condition": "blurred", "seed": 0}
    )
    assert response.status_code == 404 and "nope" in response.json()["error"]
    assert client.get("/api/sample", params={"run": 0}).status_code == 400


def test_the_quote_is_found_ignoring_case_and_spacing_and_short_quotes_are_not():
    answer = "It lasts 7.5 HOURS\nper charge; the case adds 18 hours."
    segments = highlight(answer, {"n1": "7.5 hours per  charge", "n2": "18 hours", "n3": "e"})
    assert "".join(s["text"] for s in segments) == answer
    marked = [(s["text"], s["nuggets"]) for s in segments if s["nuggets"]]
    assert marked == [("7.5 HOURS\nper charge", ["n1"]), ("18 hours", ["n2"])]
    overlapping = highlight("abc def ghi", {"a": "abc def", "b": "def ghi"})
    assert [(s["text"], s["nuggets"]) for s in overlapping] == [
        ("abc ", ["a"]),
        ("def", ["a", "b"]),
        (" ghi", ["b"]),
    ]


def test_the_same_instance_is_listed_under_every_condition_and_run(tmp_path, run):
    second = tmp_path / "second"
    make_run(second, limit=2)
    viewer = Viewer([run[0], second])
    keys = viewer.keys(run[1][0].instance_id)
    assert len(keys) == 2 * len(ALL_CONDITIONS) * len(SEEDS)
    assert {k["run"] for k in keys} == {0, 1}
    # Two runs of one experiment are told apart by their folders.
    names = [r["name"] for r in viewer.describe_runs()]
    assert names[0] != names[1] and names[1].endswith("[second]")


def test_a_run_whose_config_no_longer_loads_is_still_browsed(tmp_path):
    root = tmp_path / "old"
    make_run(root, limit=2)
    config = RunDir(root).config
    config.write_text(config.read_text().replace("seeds:", "seeds: nope\n  old_seeds:", 1))
    viewer = Viewer([root])
    (described,) = viewer.describe_runs()
    assert described["name"] == "old" and described["records"] == 2 * 5 * len(SEEDS)
    assert "config.yaml" in described["config_error"]
    record = next(iter(viewer.runs[0].records.values()))
    sample = viewer.sample(0, record.instance_id, record.condition, record.seed)
    assert sample["instance"] is None and "config.yaml does not load" in sample["instance_error"]
    assert sample["trace"] is not None  # what does not need the config is still there


# -- what it refuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trace_id", ["../config.yaml", "/etc/passwd", "blurred/../../config.yaml", "link.json"]
)
def test_a_trace_path_out_of_traces_is_not_read(tmp_path, trace_id):
    root = tmp_path / "run"
    resolved = load_experiment("quickstart", ["dataset.limit=1"])
    RunDir(root).write_config(resolved)
    RunDir(root).traces.mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text('{"steps": [], "answer": "SECRET"}')
    (RunDir(root).traces / "link.json").symlink_to(secret)
    record = Record(instance_id="A-dev-01", condition="blurred", seed=0, trace_id=trace_id)
    RecordStore(root).append(record, Shard())
    with TestClient(make_app(Viewer([root]), allowed_hosts("127.0.0.1")), LOCAL) as c:
        sample = sample_of(c, record)
    assert sample["trace"] is None
    assert "leaves the run's traces/" in sample["trace_error"]
    assert "SECRET" not in json.dumps(sample) and "root:" not in json.dumps(sample)


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {
        str(p.relative_to(root)): (
            p.stat().st_mode,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "",
        )
        for p in sorted(root.rglob("*"))
    }


def test_browsing_writes_nothing_and_only_get_is_answered(run):
    root = run[0]
    before = snapshot(root)
    viewer = Viewer([root])
    with TestClient(make_app(viewer, allowed_hosts("127.0.0.1")), LOCAL) as c:
        for path in ("/", "/static/app.js", "/static/style.css", "/api/runs", "/api/ping"):
            response = c.get(path)
            assert response.status_code == 200, path
            assert "script-src 'self'" in response.headers["content-security-policy"]
        every_key(c, sort="score")
        for record in run[1][:12]:
            sample_of(c, record)
        assert c.post("/api/records").status_code == 405
        assert c.put("/api/sample").status_code == 405
        assert c.get("/static/../config.yaml").status_code == 404
        assert c.get("/static/%2e%2e/config.yaml").status_code == 404
        assert c.get("/config.yaml").status_code == 404
    assert snapshot(root) == before


def test_another_host_name_is_refused(run):
    # A page that rebinds its own name to 127.0.0.1 still sends that name as Host.
    with TestClient(make_app(Viewer([run[0]]), allowed_hosts("127.0.0.1")), LOCAL) as c:
        assert c.get("/api/runs", headers={"host": "evil.example:8765"}).status_code == 400
        assert c.get("/api/runs", headers={"host": "localhost:8765"}).status_code == 200


def test_cts_view_refuses_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(cts_app, ["view", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2
    assert "not a run directory" in result.output


def test_cts_view_says_when_its_port_is_taken(run):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cts_app, ["view", str(run[0]), "--port", str(port)])
    finally:
        taken.close()
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


# -- in a real browser ------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def needs_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        why = f"missing {', '.join(missing)}: run scripts/chromium.sh"
        if os.environ.get("CTS_REQUIRE_BROWSER"):
            pytest.fail(f"CTS_REQUIRE_BROWSER is set but {why}")
        pytest.skip(why)


def start_view(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """`cts view ARGS --port 0` in a subprocess, and the URL it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cts", "view", *args, "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    # Lines are read by a thread: a select() on the pipe would miss a second line that arrived
    # in the same chunk as the first and waits in the reader's buffer.
    lines: queue.Queue[str] = queue.Queue()
    output = process.stdout

    def read() -> None:
        for line in output:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        found = re.search(r"cts view: (http://\S+/)", line)
        if found:
            return process, found.group(1)
    process.kill()
    raise AssertionError(f"cts view did not start: {''.join(seen)}")


@pytest.fixture(scope="module")
def browsed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the real `cts run` on scripted engines (some of its keys fail: the scripted
    searcher under the protocol's grammar refuses Chinese queries), plus one record whose text
    is markup."""
    needs_browser()
    base = tmp_path_factory.mktemp("browsed")
    root = base / "run"
    # The grammar by hand: the quickstart's searcher adapter runs without it.
    options = ["--set", "dataset.limit=24", "--set", "seeds=[0,1,2]"]
    options += ["--set", "search.constrained=true"]
    done = cts(["run", *options, "--output-dir", str(root)], base / "home")
    assert done.returncode == 0, done.stderr[-3000:]
    trace = a_trace(XSS_ANSWER)
    trace["steps"][0]["text"] = "<think>\n<b>bold?</b> <script>window.__xss=4</script>\n</think>"
    (RunDir(root).traces / "xss.json").write_text(json.dumps(trace))
    record = Record(
        instance_id=XSS_ID,
        condition="clarify@1",
        seed=0,
        language="en",
        removed_constraints=["entity"],
        questions=['Which <i onmouseover="window.__xss=5">one</i>?'],
        answers=["unknown"],
        question_types=[["entity"]],
        answer=XSS_ANSWER,
        termination="answer",
        trace_id="xss.json",
        labels={"n1": {"label": "full", "evidence": "it lasts 7.5 hours per charge"}},
        scores={"restore_score_100": 42.0},
    )
    RecordStore(root).append(record, Shard())
    return root


@pytest.fixture(scope="module")
def viewer_url(browsed_run: Path) -> Iterator[str]:
    """`cts view` of the run and of a copy of it (a second system, as far as it can tell)."""
    second = browsed_run.with_name("run-b")
    shutil.copytree(browsed_run, second)
    process, url = start_view([str(browsed_run), str(second)])
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    needs_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    chrome = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    chrome.set_script_timeout(20)
    try:
        yield chrome
    finally:
        chrome.quit()


def wait_for(driver: Any, condition: str, what: str, timeout: float = 60) -> Any:
    """Poll a JavaScript expression until it is truthy (the timeout is a hang guard)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return {condition}")
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {condition}")


def rendered(driver: Any, view: str) -> None:
    wait_for(driver, f"document.body.dataset.rendered === {json.dumps(view)}", view)


def text_of(driver: Any, selector: str) -> str:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent).join('\\n')",
        selector,
    )


#: Text no page should show: a value the page failed to turn into text.
STRAY = """const walk = document.createTreeWalker(document.getElementById("main"), 4);
const bad = [];
while (walk.nextNode()) {
  const text = walk.currentNode.textContent;
  if (/^(null|undefined|NaN)$/.test(text.trim()) || text.includes("[object ")) bad.push(text);
}
return bad;"""


def rendered_cleanly(driver: Any, view: str) -> None:
    rendered(driver, view)
    assert driver.execute_script(STRAY) == []


def navigate(driver: Any, url: str, view: str) -> None:
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.get(url)
    rendered_cleanly(driver, view)


@pytest.mark.browser
def test_the_viewer_in_chromium(driver, viewer_url, browsed_run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    records = RecordStore(browsed_run).completed()
    failed = sum(r.error is not None for r in records.values())
    assert 0 < failed < len(records) == 361

    # The index: the first page of every record of both runs.
    driver.get(viewer_url)
    rendered_cleanly(driver, "index")
    total = 2 * len(records)
    assert driver.find_element(By.ID, "count").text.startswith(f"{total} record(s) match")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#records tbody tr")) == 50
    driver.save_screenshot(str(tmp_path / "index.png"))

    # Filtered to the failures: each row shows its stage and kind.
    driver.execute_script("document.body.dataset.rendered = ''")
    Select(driver.find_element(By.NAME, "failed")).select_by_value("1")
    wait_for(
        driver, f"document.getElementById('count').textContent.startsWith('{2 * failed} ')", ""
    )
    stages = {e.text for e in driver.find_elements(By.CSS_SELECTOR, "#records td.stage")}
    assert stages == {"search: search_error"}
    assert "failed=1" in driver.current_url
    driver.save_screenshot(str(tmp_path / "index-failed.png"))

    # Sorted by score, highest first (a header click), among the first run's clarify@2.
    navigate(driver, viewer_url + "#/?condition=clarify%402&run=0", "index")
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.find_element(By.CSS_SELECTOR, "th a[data-sort=score]").click()
    rendered(driver, "index")
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.find_element(By.CSS_SELECTOR, "th a[data-sort=score]").click()
    wait_for(driver, "location.hash.includes('order=desc')", "descending")
    rendered(driver, "index")
    scores = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#records td.score")]
    numbers = [float(s) for s in scores if s != "–"]
    assert numbers == sorted(numbers, reverse=True) and numbers

    # A sample: its dialogue, trace and labels.
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.find_element(By.CSS_SELECTOR, "#records td.id a").click()
    rendered_cleanly(driver, "sample")
    assert text_of(driver, ".dialogue td.question") == "Which year?\nWhich city?"
    assert "unknown" in text_of(driver, ".dialogue td.answer.unknown")
    assert len(driver.find_elements(By.CSS_SELECTOR, ".trace > li.turn")) >= 2
    assert "tool call: search" in text_of(driver, ".trace .call h4")
    assert re.search(r"[A-F]-\d{4}", text_of(driver, ".hits .doc"))
    labels = text_of(driver, ".nuggets .label").split("\n")
    assert set(labels) <= {"full", "partial", "none"} and len(labels) >= 3
    assert text_of(driver, "section.part h3").count("Search trace") == 1
    driver.save_screenshot(str(tmp_path / "sample.png"))

    compare_side_by_side(driver, tmp_path)
    failure_and_markup(driver, viewer_url, records, tmp_path)
    assert all((tmp_path / f).stat().st_size > 1000 for f in ("index.png", "sample.png"))


def compare_side_by_side(driver: Any, tmp_path: Path) -> None:
    """From a sample: the same key in the other run (the default), then another condition."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    sample_url = driver.current_url
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.find_element(By.ID, "compare-go").click()
    rendered_cleanly(driver, "compare")
    names = text_of(driver, ".side-by-side .run-name").split("\n")
    assert [n.rsplit("[", 1)[1] for n in names] == ["run]", "run-b]"]
    titles = text_of(driver, ".side-by-side h2").split("\n")
    assert titles[0] == titles[1] and "clarify@2" in titles[0]
    driver.save_screenshot(str(tmp_path / "compare-runs.png"))
    navigate(driver, sample_url, "sample")
    choose = Select(driver.find_element(By.ID, "compare-with"))
    choose.select_by_visible_text(f"{names[0]} · blurred · seed 0")
    driver.execute_script("document.body.dataset.rendered = ''")
    driver.find_element(By.ID, "compare-go").click()
    rendered_cleanly(driver, "compare")
    titles = text_of(driver, ".side-by-side h2").split("\n")
    assert "clarify@2" in titles[0] and titles[1].endswith("blurred · seed 0")
    # The clarification section of the blurred side has no dialogue, the other one has.
    assert len(driver.find_elements(By.CSS_SELECTOR, ".side-by-side .column .dialogue")) == 1
    driver.save_screenshot(str(tmp_path / "compare-conditions.png"))


def failure_and_markup(driver: Any, viewer_url: str, records: dict, tmp_path: Path) -> None:
    """A failed key's page, and markup in a record shown as text."""
    from selenium.webdriver.common.by import By

    # A failure, with its stage and message.
    key = next(r for r in records.values() if r.error is not None)
    navigate(driver, viewer_url + sample_hash(key), "sample")
    assert "failed at stage search (search_error)" in text_of(driver, ".error-box strong")
    assert key.error is not None and key.error["message"][:40] in text_of(driver, ".error-box pre")

    # Markup in ids, questions, answers and traces is text, and runs nothing.
    xss = records[(XSS_ID, "clarify@1", 0)]
    navigate(driver, viewer_url + sample_hash(xss), "sample")
    assert driver.execute_script("return window.__xss") is None
    assert driver.find_elements(By.CSS_SELECTOR, "#main img, #main script, #main b, #main i") == []
    assert text_of(driver, "#answer") == XSS_ANSWER
    assert XSS_ID in text_of(driver, ".sample h2")
    assert "<script>window.__xss=4</script>" in text_of(driver, ".trace .reasoning")
    # The judge's quote, marked where the answer holds it.
    assert text_of(driver, "#answer mark") == "It lasts 7.5 hours per charge"
    assert "7.5 hours quoted" in text_of(driver, ".page .evidence")
    driver.save_screenshot(str(tmp_path / "sample-markup.png"))


def sample_hash(record: Record) -> str:
    from urllib.parse import urlencode

    query = {
        "run": 0,
        "instance": record.instance_id,
        "condition": record.condition,
        "seed": record.seed,
    }
    return "#/sample?" + urlencode(query)


@pytest.mark.browser
def test_report_html_in_chromium_renders_links_and_prints_at_a4(
    driver, viewer_url, browsed_run, tmp_path
):
    report = (browsed_run / "report.html").as_uri()
    # Offline (no viewer at that address): the page shows no viewer links.
    driver.get(report + "?viewer=http://127.0.0.1:9")
    driver.execute_script("return new Promise(r => setTimeout(r, 300))")
    assert driver.execute_script("return document.getElementById('cts-viewer').hidden")

    driver.get(report + "?viewer=" + viewer_url)
    tables = driver.find_elements("css selector", "table")
    assert len(tables) >= 5
    assert text_of(driver, "table:first-of-type th").startswith("system")
    headings = text_of(driver, "h2")
    assert "quickstart" in headings
    # Diagnostics: the User Answerer, question types and breakdown tables.
    head_cells = text_of(driver, "th")
    for column in ("answerability", "question type", "removed constraint", "language"):
        assert column in head_cells
    images = driver.execute_script(
        "return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth])"
    )
    assert [a for a, _, _ in images] == ["score_vs_k", "question_types", "unknown_rate_per_type"]
    assert all(done and width > 0 for _, done, width in images), images

    # With the viewer up, each system links into it.
    wait_for(driver, "!document.getElementById('cts-viewer').hidden", "viewer links")
    link = driver.find_element("css selector", "#cts-viewer-links a")
    assert link.get_attribute("href").startswith(viewer_url + "#/?runpath=")
    driver.save_screenshot(str(tmp_path / "report.png"))
    link.click()
    rendered(driver, "index")
    assert "run=0" in driver.current_url

    # Printed at A4: a PDF of a sane number of pages, nothing wider than the page.
    driver.get(report)
    pdf = driver.execute_cdp_cmd(
        "Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69, "printBackground": False}
    )
    data = base64.b64decode(pdf["data"])
    (tmp_path / "report.pdf").write_bytes(data)
    pages = len(re.findall(rb"/Type\s*/Page(?!s)", data))
    assert data.startswith(b"%PDF") and 1 <= pages <= 12, pages
    # A4 less Chromium's default print margins (0.4 in each side), in CSS pixels.
    width = round((8.27 - 0.8) * 96)
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        wider = driver.execute_script(
            "return [...document.body.querySelectorAll('*')]"
            ".filter(e => e.getBoundingClientRect().right > arguments[0] + 1)"
            ".map(e => e.tagName + ': ' + e.textContent.slice(0, 40))",
            width,
        )
        assert wider == [], wider
        assert driver.execute_script("return document.documentElement.scrollWidth") <= width
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
