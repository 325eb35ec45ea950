"""Rendered sbatch scripts with hostile values: quotes, `$()`, `;`, spaces and newlines in
paths, overrides and options run nothing unintended and reach `cts` intact. The scripts are
rendered with `--dry-run`, which writes them and the frozen configs they read into a fresh
temporary directory (never into the run directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from cts.eval.run.config import load_experiment
from cts.slurm import render as render_module
from cts.slurm.chain import submit, submit_chain
from cts.slurm.kinds import eval_job, golden_job, plan_job, train_job
from cts.slurm.plan import SlurmOptionError, SlurmOptions
from cts.train.config import load_train_config
from cts.train.sample import sampling_experiment

HOSTILE = 'it\'s "x" $(touch PWNED) `touch PWNED`; touch PWNED & $HOME\nline2'

ARGV_DUMPER = """import json, os, sys
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd()}, f)
"""


@pytest.fixture(autouse=True)
def dry_runs_in_tmp_path(tmp_path, monkeypatch) -> None:
    """Dry runs render into tmp_path (so the PWNED checks cover them), not the system /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def rendered_in(done) -> Path:
    where = Path(done.scripts["array"]).parent
    assert where.name.startswith("cts-slurm-dry-run-")
    return where


@pytest.fixture
def fake_cts(tmp_path, monkeypatch) -> Path:
    """`cts` replaced by a script that records its argv (the rendered scripts exec it)."""
    dumper = tmp_path / "dump argv.py"
    dumper.write_text(ARGV_DUMPER)
    monkeypatch.setattr(render_module, "cts_command", lambda: [sys.executable, str(dumper)])
    return dumper


def test_hostile_values_reach_cts_intact_and_run_nothing(tmp_path, fake_cts):
    workdir = tmp_path / f"work {HOSTILE}"
    workdir.mkdir()
    run_dir = tmp_path / f"run {HOSTILE}"
    resolved = load_experiment(None, [f"description={HOSTILE}", "dataset.limit=2"])
    options = SlurmOptions(shards=3, vllm_python=f"/venv {HOSTILE}/python", cpu=True)
    done = submit(eval_job(resolved, run_dir, options), "q", options, True, workdir)
    assert done.array_job is None  # nothing submitted
    assert not run_dir.exists()  # nothing written into the run directory
    where = rendered_in(done)

    out = tmp_path / "argv.json"
    env = {
        **os.environ,
        "ARGV_OUT": str(out),
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_ARRAY_TASK_COUNT": "3",
        "SLURM_ARRAY_JOB_ID": "7",
    }
    subprocess.run(["bash", done.scripts["array"]], env=env, cwd=tmp_path, check=True)
    seen = json.loads(out.read_text())
    assert seen["cwd"] == str(workdir)
    assert seen["argv"] == [
        "run",
        "--config",
        str(where / "experiment.yaml"),
        "--output-dir",
        str(run_dir),
        "--serve",
        "--cpu",
        "--vllm-python",
        f"/venv {HOSTILE}/python",
        "--shard",
        "1/3",
    ]
    subprocess.run(["bash", done.scripts["final"]], env=env, cwd=tmp_path, check=True)
    assert json.loads(out.read_text())["argv"] == ["merge", str(run_dir)]
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()

    assert done.experiment == str(where / "experiment.yaml")
    frozen = yaml.safe_load(Path(done.experiment).read_text())
    assert frozen["description"] == resolved.experiment.description
    assert "$(touch PWNED)" in frozen["description"] and frozen["dataset"]["limit"] == 2
    assert frozen["output_dir"] == str(run_dir)
    assert frozen["models"]["smollm2-135m-instruct"]["path"] == "tiny:smollm2-135m-instruct"


def test_sbatch_options_are_separate_arguments():
    options = SlurmOptions(
        shards=4, partition="gpu; rm -rf /", gpus_per_task=8, time="1-00:00:00", array_parallelism=2
    )
    args = options.array_args()
    assert "--partition=gpu; rm -rf /" in args  # one argv entry; no shell ever parses it
    assert "--array=0-3%2" in args and "--gpus-per-task=8" in args and "--requeue" in args
    assert "--signal=B:TERM@120" in args
    with pytest.raises(ValueError, match="--partition"):
        SlurmOptions(shards=1, partition="gpu\n#SBATCH --wrap=x")
    with pytest.raises(ValueError, match="--shards"):
        SlurmOptions(shards=0)


def test_frozen_experiment_loads_back_as_the_same_experiment(tmp_path):
    resolved = load_experiment(
        None, ["dataset.limit=2", "dataset.split=null", "roles.judge.sampling.temperature=0.3"]
    )
    assert resolved.experiment.dataset.split is None
    options = SlurmOptions(shards=2)
    done = submit(eval_job(resolved, tmp_path / "run", options), "q", options, dry_run=True)
    again = load_experiment(rendered_in(done) / "experiment.yaml")
    assert again.experiment.dataset == resolved.experiment.dataset
    assert again.experiment.roles == resolved.experiment.roles
    assert again.model_configs == resolved.model_configs


def test_golden_construction_job_builds_shards_then_merges(tmp_path, fake_cts):
    run_dir = tmp_path / f"golden {HOSTILE}"
    resolved = load_experiment(None, ["dataset.limit=2"])
    options = SlurmOptions(shards=2, gpus_per_task=4, partition="gpu")
    job = golden_job(resolved, run_dir, options)
    done = submit(job, "quickstart", options, dry_run=True, workdir=tmp_path)
    assert done.kind == "golden" and done.keys_per_instance == 1
    assert "--gpus-per-task=4" in done.commands["array"]
    assert not any(a.startswith("--gpus") for a in done.commands["final"])  # a merge, no GPU
    assert "--dependency=afterok:<array job>" in done.commands["final"]

    out = tmp_path / "argv.json"
    env = {**os.environ, "ARGV_OUT": str(out), "SLURM_ARRAY_TASK_ID": "0"}
    env.update(SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_JOB_ID="9")
    subprocess.run(["bash", done.scripts["array"]], env=env, check=True, capture_output=True)
    frozen = str(rendered_in(done) / "experiment.yaml")
    assert json.loads(out.read_text())["argv"] == [
        *("golden", "build", "--config", frozen, "--output-dir", str(run_dir), "--serve"),
        *("--shard", "0/2"),
    ]
    subprocess.run(["bash", done.scripts["final"]], env=env, check=True)
    assert json.loads(out.read_text())["argv"] == ["golden", "merge", str(run_dir)]
    assert not list(tmp_path.rglob("PWNED"))


def test_training_job_samples_in_shards_then_pairs_and_fits_on_gpus(tmp_path, fake_cts):
    run_dir = tmp_path / f"train {HOSTILE}"
    options = SlurmOptions(shards=3, gpus_per_task=8, fit_gpus=2, mem="64G")
    job, name = train_job(None, ["limit=2", "candidates=4"], run_dir, options)
    done = submit(job, name, options, dry_run=True, workdir=tmp_path)
    assert (done.kind, done.keys_per_instance, name) == ("train", 4, "quickstart")
    # With the blurred baseline each instance also gets a blurred record per candidate seed.
    with_baseline, _ = train_job(
        None, ["limit=2", "candidates=4", "reward.baseline=blurred"], run_dir, options
    )
    assert with_baseline.keys_per_instance == 8
    assert "--gpus-per-task=2" in done.commands["final"] and "--mem=64G" in done.commands["final"]
    assert "--signal=B:TERM@120" in done.commands["final"]

    assert not run_dir.exists()
    frozen = rendered_in(done) / "train.yaml"
    train = load_train_config(frozen)
    assert (train.limit, train.candidates) == (2, 4)
    assert train.resolved_output_dir() == run_dir.resolve()
    # The frozen experiment has every model inlined; sampling derives clarify@1 from it.
    sampling = sampling_experiment(train)
    assert sampling.experiment.conditions == ["clarify@1"]
    assert sampling.experiment.seeds == [0, 1, 2, 3]
    assert sampling.experiment.dataset.split == "train"

    out = tmp_path / "argv.json"
    env = {**os.environ, "ARGV_OUT": str(out), "SLURM_ARRAY_TASK_ID": "2"}
    env.update(SLURM_ARRAY_TASK_COUNT="3", SLURM_ARRAY_JOB_ID="9", SLURM_JOB_ID="10")
    subprocess.run(["bash", done.scripts["array"]], env=env, check=True, capture_output=True)
    assert json.loads(out.read_text())["argv"] == [
        *("train", "sample", "--config", str(frozen), "--serve", "--shard", "2/3")
    ]
    # The final script runs merge, pairs and fit in order; the stand-in records the last.
    text = Path(done.scripts["final"]).read_text()
    assert text.index(" merge ") < text.index(" pairs ") < text.index("exec ") < text.index(" fit ")
    subprocess.run(["bash", done.scripts["final"]], env=env, check=True, capture_output=True)
    assert json.loads(out.read_text())["argv"] == ["train", "fit", "--config", str(frozen)]
    assert not list(tmp_path.rglob("PWNED"))


def test_train_loop_is_a_chain_each_job_after_the_one_before(tmp_path, fake_cts):
    """`--job train-loop`: eval 0 → table 0, then per iteration sample → fit (GPUs) and
    eval → table, every array after the previous final job; each step is `cts train
    loop-step` on the frozen train config."""
    run_dir = tmp_path / f"loop {HOSTILE}"
    options = SlurmOptions(shards=3, gpus_per_task=8, fit_gpus=2)
    jobs, name = plan_job("train-loop", None, ["limit=2"], run_dir, options, iterations=2)
    assert [j.name for j in jobs] == [
        "loop-eval-0", "loop-sample-1", "loop-eval-1", "loop-sample-2", "loop-eval-2",
    ]  # fmt: skip
    chain = submit_chain(jobs, name, options, dry_run=True, workdir=tmp_path)
    assert not run_dir.exists()
    assert not any("--dependency" in " ".join(c.commands["array"]) for c in chain[:1])
    assert all(
        "--dependency=afterok:<previous final job>" in c.commands["array"] for c in chain[1:]
    )
    fits = [c for c in chain if c.stage and c.stage.startswith("loop-sample")]
    assert all("--gpus-per-task=2" in c.commands["final"] for c in fits)
    assert all("--gpus-per-task=2" not in c.commands["final"] for c in chain if c not in fits)
    frozen = rendered_in(chain[0]) / "train.yaml"
    train = load_train_config(frozen)
    assert train.resolved_output_dir() == run_dir.resolve() and train.limit == 2

    out = tmp_path / "argv.json"
    env = {**os.environ, "ARGV_OUT": str(out), "SLURM_ARRAY_TASK_ID": "1"}
    env.update(SLURM_ARRAY_TASK_COUNT="3", SLURM_ARRAY_JOB_ID="9", SLURM_JOB_ID="10")
    where = ["--config", str(frozen), "--iterations", "2"]
    expected = {
        ("loop-eval-0", "array"): ["eval", "--iteration", "0", *where, "--serve", "--shard", "1/3"],
        ("loop-eval-0", "final"): ["table", "--iteration", "0", *where],
        ("loop-sample-2", "array"): [
            "sample", "--iteration", "2", *where, "--serve", "--shard", "1/3",
        ],
        ("loop-sample-2", "final"): ["fit", "--iteration", "2", *where],
    }  # fmt: skip
    by_stage = {c.stage: c for c in chain}
    for (stage, which), argv in expected.items():
        script = by_stage[stage].scripts[which]
        subprocess.run(["bash", script], env=env, check=True, capture_output=True)
        assert json.loads(out.read_text())["argv"] == ["train", "loop-step", *argv]
    assert not list(tmp_path.rglob("PWNED"))


def test_shared_servers_are_one_job_the_tasks_wait_for_and_a_last_job_cancels(tmp_path, fake_cts):
    """`--shared-servers judge`: a servers job runs `cts serve --models` of the judge's model
    on every interface and writes the endpoints file; the array's tasks start after it
    (`after`), wait for that file and serve only their other models; a stop job cancels it once
    every task has ended (afterany)."""
    shared = ["roles.judge.model=qwen3-8b", "roles.searcher.model=smollm2-135m-instruct-vllm"]
    resolved = load_experiment(None, shared)
    options = SlurmOptions(shards=2, gpus_per_task=1, shared_servers=["judge"], shared_gpus=2)
    run_dir = tmp_path / "run"
    done = submit(eval_job(resolved, run_dir, options), "q", options, True, tmp_path)
    where = rendered_in(done)
    argv = _run_script(Path(done.scripts["servers"]), tmp_path)
    endpoints = str(run_dir / "slurm" / "shared-endpoints.json")
    assert argv[:1] == ["serve"] and argv[argv.index("--models") + 1] == "qwen3-8b"
    assert argv[argv.index("--endpoints") + 1] == endpoints and "--host" in argv
    task = _run_script(Path(done.scripts["array"]), tmp_path, SLURM_ARRAY_TASK_ID="0")
    assert task[task.index("--endpoints") + 1] == endpoints and "--serve" in task
    assert float(task[task.index("--endpoints-wait") + 1]) == 1800 + 300
    servers, array, stop = (done.commands[k] for k in ("servers", "array", "stop"))
    assert "--nodes=1" in servers and "--gpus-per-task=2" in servers
    assert "--dependency=after:<servers job>" in array
    assert "--dependency=afterany:<array job>" in stop and "--time=5" in stop
    assert (where / "eval_stop.sbatch").read_text().count("scancel") == 2


def test_shared_servers_refuse_what_cannot_be_shared(tmp_path):
    resolved = load_experiment(None, [])
    for roles, why in (
        (["umpire"], "the experiment has no role 'umpire'"),
        (["judge"], r"its model lexical-judge is not served by vLLM \(engine lexical\)"),
    ):
        options = SlurmOptions(shards=2, shared_servers=roles)
        with pytest.raises(SlurmOptionError, match=why):
            eval_job(resolved, tmp_path / "run", options)
    options = SlurmOptions(shards=2, shared_servers=["judge"])
    with pytest.raises(SlurmOptionError, match="for --job eval, golden or rejudge"):
        plan_job("train", None, [], tmp_path / "run", options)


def _run_script(script: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run a rendered script with `cts` the argv dumper; the argv it got."""
    out = tmp_path / "argv.json"
    slurm = {"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7"}
    variables = {**os.environ, "ARGV_OUT": str(out), **slurm, **env}
    subprocess.run(["bash", str(script)], env=variables, check=True, cwd=tmp_path)
    return json.loads(out.read_text())["argv"]
