"""What `cts slurm submit` refuses or undoes, and what `cts slurm status` counts, without a
cluster: sbatch and scancel are stand-ins, job states a table. A resubmission in another shard
count while jobs are live is refused; a job sbatch refuses takes back what the submission had
already queued; negative counts never reach sbatch; status counts each shard's own keys (across
shard counts, under a lowered limit) and reads a relative dataset from the submit directory."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.dataset import SAMPLE_DIR
from cts.eval.data.golden import GOLDEN
from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.slurm import chain as chain_module
from cts.slurm.chain import SubmitError, submit, submit_chain
from cts.slurm.history import submissions
from cts.slurm.kinds import eval_job, golden_job, plan_job, train_job
from cts.slurm.plan import SlurmOptionError, SlurmOptions
from cts.slurm.status import JobState, shard_progress

SMALL = ["conditions=[blurred, clarify@1]", "seeds=[0]"]
FAILED = {"kind": "EngineError", "stage": "search", "message": "down"}


def _fake_sbatch(monkeypatch: pytest.MonkeyPatch, refuse: str | None = None) -> list[str]:
    """sbatch numbering jobs from 100 (the script names each takes), refusing the script whose
    name ends with `refuse`."""
    taken: list[str] = []

    def sbatch(args: list[str], script: Path) -> str:
        if refuse and script.name.endswith(refuse):
            raise SubmitError(f"sbatch {script.name} failed: Requested node configuration")
        taken.append(script.name)
        return str(99 + len(taken))

    monkeypatch.setattr(chain_module, "sbatch", sbatch)
    return taken


def _fake_scancel(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    cancelled: list[list[str]] = []
    monkeypatch.setattr(chain_module.subprocess, "run", lambda argv, **kw: cancelled.append(argv))
    return cancelled


# -- 1. another --shards while the latest submission's jobs are live ------------------------------


def test_another_shard_count_is_refused_while_jobs_run_the_same_keys(tmp_path, monkeypatch):
    taken = _fake_sbatch(monkeypatch)
    states = {"100": {"0": JobState("RUNNING"), "1": JobState("PENDING")}}
    states["101"] = {"": JobState("PENDING", "Dependency")}
    run_dir = tmp_path / "run"
    resolved = load_experiment(None, [*SMALL, "dataset.limit=4"])

    def submit_in(shards: int) -> None:
        options = SlurmOptions(shards=shards)
        job = eval_job(resolved, run_dir, options)
        submit(job, "q", options, job_states=lambda j: states.get(j, {}))

    submit_in(2)
    with pytest.raises(SlurmOptionError) as refused:
        submit_in(3)
    message = str(refused.value)
    assert "jobs 100_0, 100_1, 101 of the latest submission" in message
    assert "run it in 2 shard(s); --shards 3 would run the same keys again" in message
    assert "Wait for them to finish, or `scancel 100 101`" in message
    assert len(taken) == 2 and [s["shards"] for s in submissions(run_dir)] == [2]

    states.clear()  # once they have ended, the run may go on in 3 shards
    submit_in(3)
    assert [s["shards"] for s in submissions(run_dir)] == [2, 3]


# -- 2. status counts each shard's own keys ---------------------------------------------------


def _record(instance: str, condition: str, seed: int = 0, failed: bool = False) -> Record:
    return Record(
        instance_id=instance, condition=condition, seed=seed, error=FAILED if failed else None
    )


def _write_two_shards(run_dir: Path, instances: int, failed: str | None = None) -> None:
    """Every key of A-dev-01..N in 2 shards (odd instances in shard 0), `failed`'s blurred
    record a failure."""
    store = RecordStore(run_dir)
    for n in range(1, instances + 1):
        instance = f"A-dev-{n:02d}"
        for condition in ("blurred", "clarify@1"):
            bad = instance == failed and condition == "blurred"
            store.append(_record(instance, condition, failed=bad), Shard((n - 1) % 2, 2))


def _counts(run_dir: Path) -> list[tuple[str, int, int, int]]:
    progress = shard_progress(submissions(run_dir)[-1])
    assert all(p.records_error is None for p in progress)
    return [(p.shard.name, p.done, p.expected, p.failed) for p in progress]


def test_status_after_a_reshard_counts_the_records_of_the_other_shard_count(tmp_path, monkeypatch):
    """6 instances × 2 conditions recorded in 2 shards, then resubmitted in 3: the 3-shard
    tasks find every key done (in the -of-2 files) and write nothing; each shard of 3 has 2
    instances × 2 conditions = 4 done, A-dev-04's failure in shard 0 (instances 01 and 04)."""
    _fake_sbatch(monkeypatch)
    run_dir = tmp_path / "run"
    resolved = load_experiment(None, [*SMALL, "dataset.limit=6"])
    for shards in (2, 3):
        options = SlurmOptions(shards=shards)
        submit(eval_job(resolved, run_dir, options), "q", options, job_states=lambda j: {})
    _write_two_shards(run_dir, 6, failed="A-dev-04")
    assert _counts(run_dir) == [
        ("shard-0-of-3", 4, 4, 1),
        ("shard-1-of-3", 4, 4, 0),
        ("shard-2-of-3", 4, 4, 0),
    ]


def test_status_after_a_lowered_limit_counts_only_the_instances_it_covers(tmp_path, monkeypatch):
    """Records of 6 instances, resubmitted with dataset.limit=4: shard 0 of 2 covers A-dev-01
    and 03, shard 1 A-dev-02 and 04, 2 conditions each: 4/4 both (not 6/4), A-dev-05's failure
    counted nowhere."""
    _fake_sbatch(monkeypatch)
    run_dir = tmp_path / "run"
    options = SlurmOptions(shards=2)
    for limit in (6, 4):
        resolved = load_experiment(None, [*SMALL, f"dataset.limit={limit}"])
        submit(eval_job(resolved, run_dir, options), "q", options, job_states=lambda j: {})
    _write_two_shards(run_dir, 6, failed="A-dev-05")
    assert _counts(run_dir) == [("shard-0-of-2", 4, 4, 0), ("shard-1-of-2", 4, 4, 0)]


def test_status_of_a_golden_build_counts_its_one_record_per_instance(tmp_path, monkeypatch):
    """A golden build's key is (instance, golden, golden.seed): of 4 instances in 2 shards,
    A-dev-01 and 03 (shard 0) and A-dev-02 (shard 1) are built, 02's a failure."""
    _fake_sbatch(monkeypatch)
    run_dir = tmp_path / "golden"
    resolved = load_experiment(None, ["dataset.limit=4"])
    seed = resolved.experiment.golden.seed
    options = SlurmOptions(shards=2)
    submit(golden_job(resolved, run_dir, options), "q", options, job_states=lambda j: {})
    store = RecordStore(run_dir)
    for instance, shard in (("A-dev-01", 0), ("A-dev-03", 0), ("A-dev-02", 1)):
        failed = instance == "A-dev-02"
        store.append(_record(instance, GOLDEN, seed, failed), Shard(shard, 2))
    assert _counts(run_dir) == [("shard-0-of-2", 2, 2, 0), ("shard-1-of-2", 1, 2, 1)]


def test_status_reads_a_relative_dataset_from_the_submit_directory(tmp_path, monkeypatch):
    _fake_sbatch(monkeypatch)
    submitted_in = tmp_path / "wd"
    (submitted_in / "data").mkdir(parents=True)
    shutil.copy(SAMPLE_DIR / "dev.jsonl", submitted_in / "data" / "dev.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(submitted_in)
    dataset = ["dataset.path=data/dev.jsonl", "dataset.split=null", "dataset.limit=4"]
    resolved = load_experiment(None, [*SMALL, *dataset])
    options = SlurmOptions(shards=2)
    run_dir = tmp_path / "run"
    submit(eval_job(resolved, run_dir, options), "q", options, job_states=lambda j: {})
    RecordStore(run_dir).append(_record("A-dev-01", "blurred"), Shard(0, 2))

    monkeypatch.chdir(elsewhere)
    assert _counts(run_dir) == [("shard-0-of-2", 1, 4, 0), ("shard-1-of-2", 0, 4, 0)]
    # A submission recorded before `workdir` was: its jobs' --chdir says the same.
    latest = submissions(run_dir)[-1]
    assert latest["workdir"] == str(submitted_in.resolve())
    del latest["workdir"]
    assert [p.done for p in shard_progress(latest)] == [1, 0]


# -- 4. a refused job takes back what the submission had queued --------------------------------


def test_a_refused_final_job_cancels_the_array_and_the_servers_job(tmp_path, monkeypatch):
    """sbatch takes the servers job (100) and the array (101), then refuses the merge: both are
    cancelled, the error names them, and nothing is recorded."""
    _fake_sbatch(monkeypatch, refuse="_final.sbatch")
    cancelled = _fake_scancel(monkeypatch)
    resolved = load_experiment(None, ["roles.judge.model=qwen3-8b", "dataset.limit=2"])
    options = SlurmOptions(shards=2, shared_servers=["judge"])
    run_dir = tmp_path / "run"
    with pytest.raises(SubmitError) as refused:
        submit(eval_job(resolved, run_dir, options), "q", options, job_states=lambda j: {})
    assert cancelled == [["scancel", "100", "101"]]
    message = str(refused.value)
    assert "eval_final.sbatch failed: Requested node configuration" in message
    assert "cancelled job(s) 100, 101 (scancel): this submission had already submitted" in message
    assert not (run_dir / "slurm" / "jobs.json").exists()


def test_a_refused_stop_job_cancels_every_job_of_the_submission(tmp_path, monkeypatch):
    _fake_sbatch(monkeypatch, refuse="_stop.sbatch")
    cancelled = _fake_scancel(monkeypatch)
    resolved = load_experiment(None, ["roles.judge.model=qwen3-8b", "dataset.limit=2"])
    options = SlurmOptions(shards=2, shared_servers=["judge"])
    with pytest.raises(SubmitError, match=r"cancelled job\(s\) 100, 101, 102 \(scancel\)"):
        submit(eval_job(resolved, tmp_path / "run", options), "q", options, job_states=lambda j: {})
    assert cancelled == [["scancel", "100", "101", "102"]]


def test_a_refused_final_job_without_shared_servers_cancels_the_array(tmp_path, monkeypatch):
    _fake_sbatch(monkeypatch, refuse="_final.sbatch")
    cancelled = _fake_scancel(monkeypatch)
    options = SlurmOptions(shards=2, fit_gpus=8)
    job, name = train_job(None, ["limit=2"], tmp_path / "run", options)
    with pytest.raises(SubmitError, match=r"cancelled job\(s\) 100 \(scancel\)"):
        submit(job, name, options, job_states=lambda j: {})
    assert cancelled == [["scancel", "100"]]


def test_a_refused_step_of_a_chain_cancels_the_steps_before_it(tmp_path, monkeypatch):
    """A train loop of one iteration: eval 0 (100, 101) is submitted, then sample 1's array
    (102) and its fit is refused: 102, then 100 and 101 are cancelled."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _fake_sbatch(monkeypatch, refuse="loop-sample-1_final.sbatch")
    cancelled = _fake_scancel(monkeypatch)
    options = SlurmOptions(shards=2)
    run_dir = tmp_path / "loop"
    jobs, name = plan_job("train-loop", None, ["limit=2"], run_dir, options, iterations=1)
    with pytest.raises(SubmitError) as refused:
        submit_chain(jobs, name, options, job_states=lambda j: {})
    assert cancelled == [["scancel", "102"], ["scancel", "100", "101"]]
    assert "cancelled job(s) 100, 101 (scancel): the chain's earlier steps" in str(refused.value)


# -- 6. counts sbatch would refuse -------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "least"),
    [
        ("gpus_per_task", -1, 0),
        ("fit_gpus", -1, 0),
        ("shared_gpus", -2, 0),
        ("cpus_per_task", -4, 1),
        ("cpus_per_task", 0, 1),
        ("array_parallelism", 0, 1),
        ("array_parallelism", -1, 1),
    ],
)
def test_a_count_sbatch_would_refuse_is_an_error_naming_the_option(option, value, least):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(SlurmOptionError, match=f"^{flag} must be at least {least}, got {value}$"):
        SlurmOptions(shards=2, **{option: value})


@pytest.mark.parametrize(
    "args",
    [
        ["--cpus-per-task", "-4"],
        ["--gpus-per-task", "-1"],
        ["--array-parallelism", "0"],
        ["--fit-gpus", "-1"],
    ],
)
def test_the_command_line_refuses_those_counts_before_rendering(tmp_path, monkeypatch, args):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(
        app, ["slurm", "submit", "--dry-run", "--shards", "2", *args], catch_exceptions=False
    )
    assert result.exit_code == 2 and args[0] in result.output
    assert not list(tmp_path.glob("cts-slurm-dry-run-*"))
