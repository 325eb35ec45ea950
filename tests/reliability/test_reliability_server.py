"""The real vLLM-CPU server SIGKILLed in the middle of a `cts run` (issue 13 §2): the run
retries, then stops with a clear message and exit 1, its finished records kept and nothing
recorded for the keys the dead server cut; the server is restarted on the same port and the
same command resumes to records equal to an uninterrupted run's.

Then, on the restarted server, a run of 32 keys at once: the server is SIGKILLed again with
32 requests in flight and started a third time, and every dropped request is sent again.
Three server starts tell both stories (each start is most of the test's time).

Equality across two server processes needs each request computed alone and from scratch: one
key at a time (no batch whose make-up could change the float sums) and no prefix cache (a
cached prefix is computed in other chunks than a fresh one). Every model call is the search
agent's (conditions blurred and oracle, the lexical judge): what is killed is a server in the
middle of search runs, at the least cost a key can have."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cts.eval.run.records import RecordStore
from cts.serving.vllm_server import VllmServer, free_port
from tests.conftest import VLLM_CPU_ARGS, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.demo]

NAME = "smollm2-135m-instruct"
EXPERIMENT = """
name: server-kill
roles:
  clarifier: {{model: tiny}}
  user_answerer: {{model: tiny}}
  rewriter: {{model: tiny}}
  searcher: {{model: tiny}}
  summarizer: {{model: tiny}}
  judge: {{model: lexical-judge}}
models:
  tiny:
    name: {name}
    path: "tiny:{name}"
    engine: openai
    endpoint: {url}
    dtype: float32
    sampling: {{temperature: 0.0, max_tokens: 96}}
    max_retries: 3
dataset: {{path: sample, split: dev, limit: 1}}
search: {{backend: local, corpus: sample, top_k: 2, max_page_tokens: 300}}
budgets: {{max_llm_calls: 2, max_context_tokens: 3500}}
conditions: [blurred, oracle]
seeds: [0]
concurrency: 1
"""


def server(
    model_path: str, port: int, log: Path, *, batch: int = 1, prefix_cache: bool = False
) -> VllmServer:
    """A vLLM-CPU server of the tiny model. Without a prefix cache it computes every request
    from scratch: with one request in flight at a time its records are equal across server
    processes. `batch` is how many requests it may run at once, as a server at load does."""
    return VllmServer(
        model_path=model_path,
        served_name=NAME,
        log_path=log,
        port=port,
        python=vllm_python(),
        args=[
            *VLLM_CPU_ARGS,
            *("--max-model-len", "4096", "--max-num-seqs", str(batch)),
            *([] if prefix_cache else ["--no-enable-prefix-caching"]),
        ],
        env={"VLLM_CPU_KVCACHE_SPACE": "1" if batch == 1 else "3"},
    ).start()


def cts_run(config: Path, run_dir: Path, home: Path) -> list[str]:
    """The command line of a run with its own response and tool caches, so that no run
    answers another's requests from a cache."""
    return [
        *(sys.executable, "-m", "cts", "run", "-c", str(config)),
        *("--output-dir", str(run_dir)),
        *("--set", f"cache.path={home}/responses.sqlite"),
        *("--set", f"search.tool_cache={home}/tools.sqlite"),
    ]


def finished(command: list[str]) -> subprocess.CompletedProcess[str]:
    """`command` run to its end, which must be exit 0."""
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def comparable(run_dir: Path) -> dict:
    return {
        key: (r.error, r.questions, r.answers, r.rewrite, r.answer, r.labels, r.scores)
        for key, r in RecordStore(run_dir).completed().items()
    }


def record_lines(run_dir: Path) -> list[str]:
    return [
        line
        for path in sorted(run_dir.glob("records/*/shard-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def kill(running: VllmServer) -> None:
    assert running.process is not None
    os.killpg(running.process.pid, signal.SIGKILL)
    running.process.wait()


def cut_after_one_record(config: Path, tmp_path: Path, first: VllmServer) -> str:
    """`cts run` of two keys, held after its first record while `first` is killed, so that
    the second key meets a dead server however fast the machine; its stderr."""
    running = subprocess.Popen(
        cts_run(config, tmp_path / "cut", tmp_path / "home-cut"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "CTS_HOLD_AT_RECORDS": f"1:{tmp_path}"},
    )
    deadline = time.monotonic() + 900  # a hang guard, not a speed assumption
    while not (tmp_path / "held").exists():
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "no record written"
        time.sleep(0.2)
    kill(first)
    (tmp_path / "release").touch()
    _, err = running.communicate(timeout=300)
    assert running.returncode == 1, err[-3000:]
    return err


def test_a_killed_server_stops_the_run_and_a_restarted_one_resumes_it_and_survives_a_kill_at_load(
    tiny_path, tmp_path
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    config = tmp_path / "experiment.yaml"
    config.write_text(EXPERIMENT.format(name=NAME, url=url))
    first = server(tiny_path, port, tmp_path / "server-1.log")
    try:
        first.wait_ready(deadline_s=600)
        whole = tmp_path / "whole"
        finished(cts_run(config, whole, tmp_path / "home-whole"))
        assert len(comparable(whole)) == 2
        err = cut_after_one_record(config, tmp_path, first)
    finally:
        first.stop()

    assert "server unreachable: " in err and "4 attempts failed" in err
    assert "run the same command to resume" in err
    assert "Traceback" not in err
    cut = tmp_path / "cut"
    lines = record_lines(cut)
    assert len(lines) == 1  # the finished one kept, the cut one not recorded
    assert all(json.loads(line)["error"] is None for line in lines)

    # The restarted server may batch: the resumed run sends one request at a time.
    second = server(tiny_path, port, tmp_path / "server-2.log", batch=AT_LOAD)
    try:
        second.wait_ready(deadline_s=600)
        resumed = finished(cts_run(config, cut, tmp_path / "home-cut"))
        assert "1 records written, 1 already done" in resumed.stdout
        assert comparable(cut) == comparable(whole)
        killed_at_load(second, port, tmp_path / "load", tiny_path)
    finally:
        second.stop()


# -- at load: 32 requests in flight --------------------------------------------------------------

#: 16 instances × 2 conditions: 32 keys, all started at once, each with a request in flight
#: (its search run's only call: a budget of one).
AT_LOAD = 32
LOAD_EXPERIMENT = (
    EXPERIMENT.replace("limit: 1}", "limit: 16}")
    .replace("max_llm_calls: 2", "max_llm_calls: 1")
    .replace("concurrency: 1", f"concurrency: {AT_LOAD}")
    .replace(
        "    max_retries: 3\n",
        # A retry window (0.5 s doubling to 8 s, 150 times: ~20 min) no restart outlasts; a
        # timeout no request queued behind 31 others meets.
        f"    max_retries: 150\n    max_concurrency: {AT_LOAD}\n    timeout_s: 900\n",
    )
)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def in_flight(url: str) -> int:
    """Requests the server holds (running and waiting), from its Prometheus metrics."""
    import httpx

    try:
        text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0
    return int(
        sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
        )
    )


def killed_at_load(first: VllmServer, port: int, work: Path, tiny_path: str) -> None:
    """The real server SIGKILLed once it holds 32 requests (a point of progress read from its
    metrics, not a delay), then started again on the same port: every request it dropped is
    sent again until the new one answers, the run finishes (exit 0) with every record and no
    error of the server's making, and its retry line counts the attempts sent again, all for
    `connection`."""
    url = f"http://127.0.0.1:{port}/v1"
    work.mkdir()
    config = work / "experiment.yaml"
    config.write_text(LOAD_EXPERIMENT.format(name=NAME, url=url))
    cut = work / "cut"
    running = subprocess.Popen(
        cts_run(config, cut, work / "home-cut"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    third = None
    try:
        deadline = time.monotonic() + 900  # a hang guard, not a speed assumption
        while (held := in_flight(url)) < AT_LOAD:
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline, "never 32 requests in flight"
            time.sleep(0.2)
        print(f"killed with {held} requests in flight")
        kill(first)
        third = server(tiny_path, port, work / "server-3.log", batch=AT_LOAD, prefix_cache=True)
        out, err = running.communicate(timeout=1800)
    finally:
        if third is not None:
            third.stop()

    assert running.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    assert f"{AT_LOAD} records written, 0 already done" in out
    records = comparable(cut)
    assert len(records) == AT_LOAD  # every key recorded: none was cut by the dead server
    # A key may fail for its model's answer (the tiny model's JSON cut at 96 tokens), never
    # for the server: no request the dead server dropped became a key's error.
    failed = {record[0]["kind"] for record in records.values() if record[0] is not None}
    assert failed <= {"constrained_output_invalid"}, failed
    (line,) = [line for line in out.splitlines() if " attempts sent again over " in line]
    print(line)
    sent_again = int(line.split(": ", 1)[1].split()[0])
    assert sent_again >= AT_LOAD, line  # every request in flight was cut, and sent again
    assert line.endswith(f"(connection {sent_again})"), line  # no timeout: nothing else
