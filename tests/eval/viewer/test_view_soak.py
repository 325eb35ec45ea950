"""A soak of `cts view`: the real command on 10,000 records (a few with huge texts and traces),
1,000 random requests from 8 concurrent clients, malformed parameters mixed in. No answer is a
500 (nor a dropped connection), each is one of the answers its request allows, and the
server's memory stays bounded. Figures go to $CTS_SOAK_JSON when set (and are printed)."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from bench.view import trace, write_run
from cts.eval.data.schema import Record
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from tests.scripted_cts import ROOT

RECORDS = 10_000
REQUESTS = 1_000
CLIENTS = 8
#: The server's peak resident memory may not pass this (10k records held: ~0.2 GB here).
PEAK_RSS_MB = 1_000
#: Nor grow by more than this from the first request to the last: nothing accumulates.
GROWTH_MB = 200


#: A parameter of the index and a value it refuses.
MALFORMED = [
    ("sort", "bogus"),
    ("order", "sideways"),
    ("limit", "501"),
    ("limit", "0"),
    ("limit", "abc"),
    ("offset", "-5"),
    ("offset", "1e3"),
    ("score_min", "nan"),
    ("score_min", "inf"),
    ("score_min", "x"),
    ("failed", "maybe"),
    ("run", "x"),
]


def _rss_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) of a process, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = {k: int(v) / 1024 for k, v in re.findall(r"(VmRSS|VmHWM):\s+(\d+) kB", status)}
    return found["VmRSS"], found["VmHWM"]


def _add_huge(root: Path, rng: random.Random) -> list[Record]:
    """Three more records: a 4 MB answer, a trace with a 2 MB tool response, a trace nested
    too deeply to parse."""
    huge = [
        Record(instance_id="HUGE-answer", condition="blurred", seed=0, answer="word " * 800_000),
        Record(instance_id="HUGE-trace", condition="blurred", seed=0, trace_id="blurred/h.json"),
        Record(instance_id="HUGE-deep", condition="blurred", seed=0, trace_id="blurred/d.json"),
    ]
    big = trace(rng, 3)
    big["steps"][1]["result"] = "1. [" + "](" * 1_000_000
    (root / "traces" / "blurred" / "h.json").write_text(json.dumps(big))
    (root / "traces" / "blurred" / "d.json").write_text("[" * 200_000 + "]" * 200_000)
    for record in huge:
        RecordStore(root).append(record, Shard())
    return huge


def _requests(rng: random.Random, keys: list[dict[str, Any]]) -> list[tuple[str, str, set[int]]]:
    """(method, path, the statuses it may get), good and malformed mixed."""
    made: list[tuple[str, str, set[int]]] = []
    for _ in range(REQUESTS):
        key = rng.choice(keys)
        roll = rng.random()
        if roll < 0.35:
            params = {
                "sort": rng.choice(["score", "instance", "stage", "seed"]),
                "order": rng.choice(["asc", "desc"]),
                "limit": rng.choice(["50", "500"]),
                "offset": rng.choice(["0", "100", "9999"]),
                "score_min": rng.choice(["", "20"]),
                "failed": rng.choice(["", "1", "0"]),
                "condition": rng.choice(["", "clarify@2", "nope"]),
                "run": rng.choice(["", "0", "7"]),
                "q": rng.choice(["", "I-000", "\u0000", "%", "HUGE"]),
            }
            if rng.random() < 0.4:  # one malformed parameter
                name, value = rng.choice(MALFORMED)
                params[name] = value
            made.append(("GET", "/api/records?" + urlencode(params), {200, 400}))
        elif roll < 0.7:
            params = dict(key)
            if rng.random() < 0.3:
                broken = rng.choice(["run", "seed", "instance", "condition"])
                params[broken] = rng.choice(["", "x", "-1", "99", "\u00e9\u0301"])
            if rng.random() < 0.1:
                params.pop(rng.choice(list(params)))
            made.append(("GET", "/api/sample?" + urlencode(params), {200, 400, 404}))
        elif roll < 0.8:
            part = rng.choice(["record", "trace", "other"])
            made.append(("GET", "/api/raw?" + urlencode({**key, "part": part}), {200, 400, 404}))
        elif roll < 0.85:
            made.append(("GET", "/api/instance?" + urlencode({"instance": key["instance"]}), {200}))
        elif roll < 0.9:
            made.append(("GET", rng.choice(["/", "/static/app.js", "/api/runs"]), {200}))
        else:
            made.append(
                rng.choice(
                    [
                        ("GET", "/nope", {404}),
                        ("POST", "/api/records", {405}),
                        ("GET", "/api/sample", {400}),
                        ("GET", "/api/records?limit=" + "9" * 5000, {400}),
                    ]
                )
            )
    return made


@pytest.mark.slow
def test_cts_view_under_1000_random_requests_from_8_clients(tmp_path):
    rng = random.Random(27)
    root = tmp_path / "run"
    first = write_run(root, RECORDS, rng)
    huge = _add_huge(root, rng)
    keys = [
        {"run": 0, "instance": r.instance_id, "condition": r.condition, "seed": r.seed}
        for r in [first, *huge]
    ] + [
        {"run": 0, "instance": f"I-{i:05d}", "condition": "clarify@2", "seed": 0}
        for i in range(0, 2000, 37)
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "cts", "view", str(root), "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        address = None
        for line in process.stdout:
            found = re.search(r"cts view: http://127\.0\.0\.1:(\d+)/", line)
            if found:
                address = int(found.group(1))
                break
        assert address is not None, f"cts view did not start (exit {process.wait()})"
        figures = _soak(process.pid, address, _requests(rng, keys))
    finally:
        process.terminate()
        process.wait(timeout=60)
    print(json.dumps(figures))
    if os.environ.get("CTS_SOAK_JSON"):
        Path(os.environ["CTS_SOAK_JSON"]).write_text(json.dumps(figures, indent=1))
    assert not figures["unexpected"], figures["unexpected"][:10]
    assert figures["statuses"].get("500", 0) == 0 and figures["errors"] == 0
    assert figures["peak_rss_mb"] <= PEAK_RSS_MB, figures
    assert figures["rss_end_mb"] - figures["rss_start_mb"] <= GROWTH_MB, figures


def _soak(pid: int, port: int, requests: list[tuple[str, str, set[int]]]) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    unexpected: list[tuple[str, str, int]] = []
    errors: list[str] = []
    lock = threading.Lock()
    rss_start = _rss_mb(pid)[0]

    def client(mine: list[tuple[str, str, set[int]]]) -> None:
        for method, path, allowed in mine:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            try:
                connection.request(method, path)
                answer = connection.getresponse()
                answer.read()
                status = answer.status
            except OSError as e:  # a dropped connection counts against the server
                with lock:
                    errors.append(f"{method} {path[:80]}: {e}")
                continue
            finally:
                connection.close()
            with lock:
                statuses[str(status)] += 1
                if status not in allowed:
                    unexpected.append((method, path[:200], status))

    threads = [
        threading.Thread(target=client, args=(requests[i::CLIENTS],)) for i in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rss_end, peak = _rss_mb(pid)
    return {
        "records": RECORDS + 3,
        "requests": len(requests),
        "clients": CLIENTS,
        "statuses": dict(sorted(statuses.items())),
        "unexpected": unexpected,
        "errors": len(errors),
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "peak_rss_mb": round(peak, 1),
    }
