"""What a new user trips on: a run without a terminal that prints nothing for minutes, a table
cut at 80 columns in a log, a foreign dataset that only a run could check, and no way to see
what a run would do before it does it. The runs are the real `cts` on scripted engines."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import cts.eval.experiment
import cts.eval.run.engines
import tests.scripted_cts
from cts.cli import app
from cts.cli.common import print_summary, progress_for
from cts.eval.run.progress import ProgressLines, ProgressLog
from cts.serving.scripted import ScriptedEngine, scripted_roles
from tests.scripted_cts import ROOT, scripted_engines, start

runner = CliRunner()

#: A system name longer than the 80 columns rich wraps at without a terminal.
LONG_NAME = "a-rather-long-experiment-name-for-the-newcomer-table-check"
LINE = re.compile(
    r"^(?P<name>\S+): (?P<done>\d+)/(?P<total>\d+) done \((?P<already>\d+) already\), "
    r"(?P<failed>\d+) failed, (?P<rate>\d+\.\d) keys/min, (?P<tail>.+)$"
)


def progress_lines(output: str) -> list[dict[str, str]]:
    return [m.groupdict() for m in map(LINE.match, output.splitlines()) if m]


def run_args(out: Path, *more: str) -> list[str]:
    return ["run", "--output-dir", str(out), "--set", f"name={LONG_NAME}", *more]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` and its digest (empty when `root` is absent)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The quickstart on scripted engines, its stdout a pipe: a first run of 2 instances, then
    the whole run (3 instances) resuming it, a line per key ($CTS_PROGRESS_EVERY_S=0)."""
    root = tmp_path_factory.mktemp("piped")
    out = root / "run"
    # 80 columns, as rich assumes without a terminal.
    env = {"CTS_PROGRESS_EVERY_S": "0", "CTS_SCRIPTED_DELAY_S": "0.02", "COLUMNS": "80"}
    # Held at its first record until released (cts/eval/run/runner.py ProgressHold), so the first
    # run cannot end before its first progress line is read, however fast the machine.
    hold = {"CTS_HOLD_AT_RECORDS": f"1:{root}"}
    first = start(run_args(out, "--limit", "2"), root / "home", **env, **hold)
    assert first.stdout is not None
    # Flushed as it is printed: the first progress line is read while the keys still run.
    head = ""
    while not LINE.match(head.rstrip("\n").split("\n")[-1]):
        line = first.stdout.readline()
        assert line, "no progress line"
        head += line
    still_running = first.poll() is None
    (root / "release").touch()
    rest, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    second = start(run_args(out), root / "home", **env)
    resumed, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    return {
        "out": out,
        "first": head + rest,
        "head": head,
        "still_running": still_running,
        "resumed": resumed,
    }


# -- progress lines without a terminal --------------------------------------------------------


def test_a_run_into_a_pipe_prints_progress_lines_with_its_counts(piped):
    assert piped["still_running"], "the first progress line came only when the run had ended"
    lines = progress_lines(str(piped["first"]))
    assert lines[0] == {
        "name": LONG_NAME,
        "done": "0",
        "total": "10",
        "already": "0",
        "failed": "0",
        "rate": "0.0",
        "tail": lines[0]["tail"],
    }
    assert re.fullmatch(r"ETA \?, no key finished in \d+ s", lines[0]["tail"])
    # One line per key (every 0 s), then the last one.
    assert [int(line["done"]) for line in lines] == [*range(11), 10]
    assert lines[-1]["tail"].endswith("elapsed")
    assert all(line["total"] == "10" and line["failed"] == "0" for line in lines)
    assert "10/10 failed" not in str(piped["first"])  # no bar drawn once at the end


def test_a_resumed_run_counts_the_keys_already_done(piped):
    lines = progress_lines(str(piped["resumed"]))
    assert (lines[0]["done"], lines[0]["total"], lines[0]["already"]) == ("10", "15", "10")
    assert (lines[-1]["done"], lines[-1]["already"]) == ("15", "10")
    assert "5 records written, 10 already done" in str(piped["resumed"])


def hourly_counts(args: list[str], home: Path) -> list[tuple[str, str]]:
    """`cts ARGS` into a pipe with an hour between progress lines, run to its end: each line's
    (done, total)."""
    process = start(args, home, CTS_PROGRESS_EVERY_S="3600")
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return [(line["done"], line["total"]) for line in progress_lines(out)]


def test_lines_are_at_most_one_every_interval(tmp_path):
    """A run shorter than the interval prints its first and its last line only."""
    args = ["run", "--output-dir", str(tmp_path / "run"), "--limit", "1"]
    assert hourly_counts(args, tmp_path / "home") == [("0", "5"), ("5", "5")]


def test_golden_build_in_a_log_prints_the_lines_too(tmp_path):
    args = ["golden", "build", "--output-dir", str(tmp_path / "golden"), "--limit", "2"]
    assert hourly_counts(args, tmp_path / "home") == [("0", "2"), ("2", "2")]


def test_failures_are_counted_in_the_lines(tmp_path, monkeypatch):
    lines = progress_lines(failing_run(tmp_path, monkeypatch, limit=2)[1])
    # Every clarify@k record fails at the rewrite: 3 conditions × 2 instances.
    assert (lines[-1]["done"], lines[-1]["total"], lines[-1]["failed"]) == ("10", "10", "6")
    failed = [int(line["failed"]) for line in lines]
    assert failed == sorted(failed) and failed[0] == 0


def test_progress_lines_are_throttled_and_give_rate_and_eta():
    now = [100.0]
    printed: list[str] = []
    lines = ProgressLines("exp", 12, 2, ProgressLog(printed.append, 30, clock=lambda: now[0]))
    lines.emit()
    for t in (110.0, 125.0):  # within 30 s of the first line: nothing printed
        now[0] = t
        lines.advance()
    now[0] = 130.0
    lines.advance(failed=True)
    now[0] = 150.0
    lines.advance()
    now[0] = 160.0
    lines.emit(final=True)
    assert printed == [
        "exp: 2/12 done (2 already), 0 failed, 0.0 keys/min, ETA ?, no key finished in 0 s",
        # 3 keys in 30 s: 6 keys/min; 7 left: 70 s.
        "exp: 5/12 done (2 already), 1 failed, 6.0 keys/min, ETA 70 s",
        "exp: 6/12 done (2 already), 1 failed, 4.0 keys/min, 60 s elapsed",
    ]


def test_a_terminal_gets_the_bar_and_a_log_gets_lines(monkeypatch):
    assert progress_for(Console(force_terminal=True)) is True
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "5")
    log = progress_for(Console(file=StringIO()))
    assert isinstance(log, ProgressLog) and log.every_s == 5
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "soon")
    result = runner.invoke(app, ["run", "--output-dir", "/nonexistent/never"])
    assert result.exit_code == 2 and "CTS_PROGRESS_EVERY_S='soon'" in result.output


def test_a_run_at_a_terminal_draws_the_bar_not_lines(tmp_path):
    """`cts run` with its output on a pseudo-terminal, as a user at a shell sees it."""
    leader, follower = pty.openpty()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CTS_HOME": str(tmp_path / "home"),
        "CTS_PROGRESS_EVERY_S": "0",
        "TERM": "xterm",
        "COLUMNS": "120",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.scripted_cts", *run_args(tmp_path / "r", "--limit", "1")],
        cwd=ROOT,
        env=env,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=300) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "5/5" in screen and "failed 0" in screen and "━" in screen
    assert "keys/min" not in screen


# -- the table at its natural width ----------------------------------------------------------


def test_the_table_in_a_log_is_printed_whole(piped):
    out = str(piped["resumed"])
    rows = [line for line in out.splitlines() if line.startswith("│")]
    # One line per system: no cell wrapped onto a second line, none cut with "…".
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("│").split("│")]
    assert cells[0] == f"{LONG_NAME} (smollm2-135m-instruct)"
    cell = re.compile(r"[\d.]+ \[[\d.]+, [\d.]+\] \(n=3\)")
    assert len(cells) == 6 and all(cell.fullmatch(c) for c in cells[1:]), cells
    assert "…" not in out
    assert f"report: {piped['out']}/report.html" in out  # the path is not wrapped either


def test_print_summary_on_a_plain_console_is_not_wrapped(piped):
    """Other commands (`cts report`, `cts train sample`) print with a plain Console()."""
    buffer = StringIO()
    print_summary(Console(file=buffer, width=80), Path(str(piped["out"])) / "summary.json")
    rows = [line for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert len(rows) == 1 and f"{LONG_NAME} (smollm2-135m-instruct)" in rows[0]


# -- a failing run, in process ----------------------------------------------------------------


def failing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int) -> tuple[Path, str]:
    """The quickstart on scripted engines whose rewriter always fails (every clarify@k record
    is a failure), into tmp_path/run; the run directory and what the run printed."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")

    def roles() -> dict[str, ScriptedEngine]:
        scripted = scripted_roles()
        scripted["rewriter"].script = lambda request: RuntimeError("rewriter down")
        return scripted

    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", roles)
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--output-dir", str(out), "--limit", str(limit)])
    assert result.exit_code == 0, result.output
    return out, result.output


def forbid_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building any engine fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dry run built an engine")

    monkeypatch.setattr(cts.eval.run.engines, "build_engine", refuse)
    monkeypatch.setattr(cts.eval.experiment, "open_engines", refuse)


# -- cts run --dry-run -----------------------------------------------------------------------


def dry(*args: str):
    return runner.invoke(app, ["run", "--dry-run", *args], catch_exceptions=False)


def test_dry_run_on_a_fresh_directory_writes_nothing(tmp_path, monkeypatch):
    forbid_engines(monkeypatch)
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    # A model that could not even be loaded: only its config is read.
    result = dry(
        "--output-dir",
        str(out),
        "--set",
        "models.smollm2-135m-instruct.path=/nonexistent/checkpoint",
    )
    assert result.exit_code == 0, result.output
    assert not out.exists() and not (tmp_path / "home").exists()
    text = result.output
    assert f"output dir: {out} (new)" in text
    assert "  all        15 keys: 0 done, 15 to run" in text
    assert "in-process (transformers), weights /nonexistent/checkpoint" in text
    assert "search: local BM25 over corpus sample, top 3" in text
    assert f"resume: nothing to resume; {out}/config.yaml would be written" in text


def test_dry_run_of_a_half_done_run_counts_its_keys(tmp_path, monkeypatch):
    out = failing_run(tmp_path, monkeypatch, limit=2)[0]
    before = snapshot(out)
    home = snapshot(tmp_path / "home")
    forbid_engines(monkeypatch)
    result = dry("--output-dir", str(out))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "  blurred    3 keys: 2 done, 1 to run" in lines
    assert (
        "  clarify@1  3 keys: 2 done, 1 to run (2 of them failed; --retry-failed runs them again)"
        in lines
    )
    assert "  all        15 keys: 10 done, 5 to run" in lines
    assert f"resume: {out}/config.yaml matches this config; the run resumes" in lines
    # Failures run again with --retry-failed; a shard counts the records of any shard file.
    retry = dry("--output-dir", str(out), "--retry-failed").output.splitlines()
    assert "  clarify@2  3 keys: 0 done, 3 to run" in retry
    assert any(line.startswith("  all        15 keys: 4 done, 11 to run") for line in retry)
    shard = dry("--output-dir", str(out), "--shard", "1/2").output.splitlines()
    assert "shard: 1/2, 1 instance(s); seeds 0" in shard
    assert "  oracle     1 keys: 1 done, 0 to run" in shard
    assert snapshot(out) == before and snapshot(tmp_path / "home") == home


def test_dry_run_reports_the_refusal_of_a_changed_config(tmp_path, monkeypatch):
    out = failing_run(tmp_path, monkeypatch, limit=1)[0]
    before = snapshot(out)
    forbid_engines(monkeypatch)
    result = dry("--output-dir", str(out), "--set", "search.top_k=4")
    assert result.exit_code == 2
    assert f"output dir: {out} (holds another run)" in result.output
    assert "resume: refused (exit 2) — " in result.output
    assert "search.top_k: 3 → 4" in result.output
    assert snapshot(out) == before
    # What may change between starts is no refusal: a larger limit extends the run.
    assert dry("--output-dir", str(out), "--limit", "3").exit_code == 0


def test_dry_run_says_where_served_models_run(tmp_path, monkeypatch):
    forbid_engines(monkeypatch)
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--set", "roles.judge.model=smollm2-135m-instruct-vllm"]
    plain = dry(*args).output
    assert (
        "for judge: openai endpoint http://127.0.0.1:8000/v1; --serve would start vLLM for it"
        in plain
    )
    served = dry(*args, "--serve").output
    assert "for judge: vLLM server started for the run (--serve)" in served
    assert "--serve starts 1 vLLM server(s)" in served
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps({"models": {"smollm2-135m-instruct-vllm": {"base_url": "http://h:8000/v1"}}})
    )
    given = dry(*args, "--endpoints", str(endpoints)).output
    assert "for judge: openai endpoint http://h:8000/v1" in given
    assert not out.exists()


# -- cts data validate|stats --config --------------------------------------------------------


def foreign(tmp_path: Path, bad: bool = False) -> Path:
    """A dataset in the original release's shape (a queries CSV, a gold JSONL with its own
    nugget fields and importance words) and the experiment that reads it."""
    queries = tmp_path / "queries.csv"
    third = "103,Same words,Same words,en\n" if bad else ""
    queries.write_text(
        "qid,fused_query,blurred_query,lang\n"
        "101,What did the Valmora council decide in March 2024?,What did the council decide?,en\n"
        "102,Ticket price of the Esker night train in 2023,Ticket price of the night train,en\n"
        + third
    )
    gold = tmp_path / "gold.jsonl"
    rows = [
        {"qid": 101, "facts": [{"n": 1, "fact": "It approved the budget.", "importance": "vital"}]},
        {
            "qid": 102,
            "facts": [
                {"n": 1, "fact": "It cost 40 euros.", "importance": "heavy" if bad else "vital"},
                {"n": 2, "fact": "It runs nightly.", "importance": "okay"},
            ],
        },
    ]
    if bad:
        rows.append({"qid": 103, "facts": [{"n": 1, "fact": "x", "importance": "okay"}]})
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    roles = ("clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge")
    experiment = {
        "name": "foreign",
        "roles": {role: {"model": "smollm2-135m-instruct"} for role in roles},
        "dataset": {
            "path": str(queries),
            "split": None,
            "field_map": {"id": "qid", "language": "lang"},
            "gold": {
                "path": str(gold),
                "id_field": "qid",
                "nuggets_field": "facts",
                "nugget_field_map": {"id": "n", "text": "fact", "weight": "importance"},
                "weight_map": {"vital": 2, "okay": 1},
            },
        },
        "conditions": ["blurred", "oracle"],
        "output_dir": str(tmp_path / "runs" / "{name}"),
    }
    config = tmp_path / "experiment.yaml"
    config.write_text(yaml.safe_dump(experiment))
    return config


def test_data_validate_reads_the_dataset_an_experiment_describes(tmp_path):
    config = foreign(tmp_path)
    result = runner.invoke(app, ["data", "validate", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert result.output == f"{tmp_path}/queries.csv (the dataset of {config}): OK (2 instances)\n"
    # The same file as a plain PATH has none of the experiment's maps.
    alone = runner.invoke(app, ["data", "validate", str(tmp_path / "queries.csv")])
    assert alone.exit_code == 1 and f"{tmp_path}/queries.csv:2: id: missing" in alone.output
    # --set changes the experiment's dataset as for `cts run`.
    limited = runner.invoke(
        app, ["data", "validate", "-c", str(config), "--set", "dataset.weight_map=null"]
    )
    assert limited.exit_code == 2 and "dataset.weight_map" in limited.output


def test_data_validate_through_a_config_names_file_line_and_field(tmp_path):
    config = foreign(tmp_path, bad=True)
    result = runner.invoke(app, ["data", "validate", "--config", str(config)])
    assert result.exit_code == 1
    queries = tmp_path / "queries.csv"
    assert result.output.splitlines()[:2] == [
        f"{queries}:3: golden.nuggets[0].weight: must be a number > 0 and at most 1e6, got 'heavy'",
        f"{queries}:4: blurred_query: equal to fused_query",
    ]
    assert f"2 problem(s) in {queries} (the dataset of {config})" in result.output
    # `cts run -c` refuses the same rows, before any model.
    run = runner.invoke(app, ["run", "-c", str(config), "--dry-run"])
    assert run.exit_code == 2
    assert f"{queries}:3: golden.nuggets[0].weight: must be a number > 0" in run.output


def test_data_stats_through_a_config(tmp_path):
    config = foreign(tmp_path)
    result = runner.invoke(app, ["data", "stats", "-c", str(config), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)["foreign"]
    assert stats["instances"] == 2 and stats["with_golden"] == 2
    assert stats["weight_mix"] == {"1": 1, "2": 2}
    limited = runner.invoke(
        app, ["data", "stats", "-c", str(config), "--set", "dataset.limit=1", "--json"]
    )
    assert json.loads(limited.output)["foreign (the first 1 of 2)"]["instances"] == 1
    bad = runner.invoke(app, ["data", "stats", "-c", str(foreign(tmp_path, bad=True))])
    assert bad.exit_code == 1 and "2 invalid row(s)" in bad.output


def test_data_commands_refuse_a_path_and_a_config_together(tmp_path):
    config = foreign(tmp_path)
    both = runner.invoke(app, ["data", "validate", "sample", "-c", str(config)])
    assert both.exit_code == 2 and "not both" in both.output
    mixed = runner.invoke(app, ["data", "stats", "-c", str(config), "--split", "dev"])
    assert mixed.exit_code == 2 and "--split" in mixed.output and "--set dataset." in mixed.output
    neither = runner.invoke(app, ["data", "validate"])
    assert neither.exit_code == 2 and "--config" in neither.output
