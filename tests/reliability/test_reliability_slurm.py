"""`cts slurm submit` never changes the frozen experiment queued or requeued tasks read: a dry
run writes nothing into the run directory, and a changed experiment is refused while the latest
submission still has live jobs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.cli.common import exit_for
from cts.eval.run.config import load_experiment
from cts.slurm import chain as chain_module
from cts.slurm.chain import SubmitError, submit
from cts.slurm.kinds import eval_job, train_job
from cts.slurm.plan import SlurmOptionError, SlurmOptions
from cts.slurm.status import JobState


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def _existing_run(tmp_path: Path) -> Path:
    """A run directory whose queued tasks read its frozen configs and scripts."""
    run_dir = tmp_path / "run"
    slurm = run_dir / "slurm"
    (slurm / "logs").mkdir(parents=True)
    for name in (
        "experiment.yaml",
        "train.yaml",
        "samples_experiment.yaml",
        "eval_array.sbatch",
        "eval_final.sbatch",
        "train_array.sbatch",
        "train_final.sbatch",
        "jobs.json",
    ):
        (slurm / name).write_text(f"what the queued tasks read: {name}\n")
    return run_dir


def test_dry_run_writes_nothing_into_an_existing_run_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_dir = _existing_run(tmp_path)
    before = _snapshot(run_dir)
    options = SlurmOptions(shards=2)
    resolved = load_experiment(None, ["dataset.limit=2"])
    done = submit(eval_job(resolved, run_dir, options), "q", options, dry_run=True)
    job, name = train_job(None, ["limit=2"], run_dir, options)
    trained = submit(job, name, options, dry_run=True)
    assert _snapshot(run_dir) == before
    for rendered in (done, trained):
        where = Path(rendered.scripts["array"]).parent
        assert where.name.startswith("cts-slurm-dry-run-")
        assert where.parent == tmp_path
        assert Path(rendered.experiment).is_relative_to(where)


def test_dry_run_through_the_cli_says_where_it_rendered(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_dir = _existing_run(tmp_path)
    before = _snapshot(run_dir)
    result = CliRunner().invoke(
        app,
        [
            *("slurm", "submit", "--dry-run", "--shards", "2"),
            *("--output-dir", str(run_dir), "--set", "dataset.limit=2"),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert _snapshot(run_dir) == before
    assert "cts-slurm-dry-run-" in result.output and "nothing submitted" in result.output


def _fake_slurm(monkeypatch, states: dict[str, dict[str, JobState]]):
    ids = iter(["100", "101", "200", "201", "300", "301"])
    calls: list[Path] = []

    def fake_sbatch(args, script):
        calls.append(script)
        return next(ids)

    monkeypatch.setattr(chain_module, "sbatch", fake_sbatch)
    return calls, lambda job_id: states.get(job_id, {})


def test_a_changed_experiment_is_refused_while_jobs_are_live(tmp_path, monkeypatch):
    states = {"100": {"0": JobState("RUNNING"), "1": JobState("REQUEUED")}}
    states["101"] = {"": JobState("PENDING", "Dependency")}
    calls, lookup = _fake_slurm(monkeypatch, states)
    run_dir = tmp_path / "run"
    options = SlurmOptions(shards=2)
    first = load_experiment(None, ["dataset.limit=2"])
    submit(eval_job(first, run_dir, options), "q", options, job_states=lookup)
    frozen = run_dir / "slurm" / "experiment.yaml"
    queued = frozen.read_text()

    changed = load_experiment(None, ["dataset.limit=3"])
    with pytest.raises(SlurmOptionError) as refused:
        submit(eval_job(changed, run_dir, options), "q", options, job_states=lookup)
    message = str(refused.value)
    assert "100_0" in message and "100_1" in message and "101" in message
    assert "scancel" in message and "wait" in message.lower()
    assert exit_for(refused.value) is not None and exit_for(refused.value)[1] == 2
    assert frozen.read_text() == queued and len(calls) == 2

    # The same experiment again (to run what is missing) is allowed.
    submit(eval_job(first, run_dir, options), "q", options, job_states=lookup)
    assert frozen.read_text() == queued and len(calls) == 4

    # Once the jobs have finished, a changed experiment may be submitted.
    states.clear()
    states["200"] = {"0": JobState("COMPLETED"), "1": JobState("FAILED")}
    states["201"] = {"": JobState("CANCELLED")}
    submit(eval_job(changed, run_dir, options), "q", options, job_states=lookup)
    assert frozen.read_text() != queued and len(calls) == 6


def test_a_refused_array_cancels_the_shared_servers_job_it_was_for(tmp_path, monkeypatch):
    """sbatch takes the servers job and then refuses the array: nothing would ever end the
    servers job (its stop job follows the array), so it is cancelled, and the error stands."""
    submitted: list[str] = []
    cancelled: list[list[str]] = []

    def fake_sbatch(args, script):
        if script.name.endswith("_array.sbatch"):
            raise SubmitError("sbatch: error: Batch job submission failed: Invalid qos")
        submitted.append(script.name)
        return "500"

    monkeypatch.setattr(chain_module, "sbatch", fake_sbatch)
    monkeypatch.setattr(chain_module.subprocess, "run", lambda argv, **kw: cancelled.append(argv))
    resolved = load_experiment(None, ["roles.judge.model=qwen3-8b", "dataset.limit=2"])
    options = SlurmOptions(shards=2, shared_servers=["judge"])
    with pytest.raises(SubmitError, match="Invalid qos"):
        submit(eval_job(resolved, tmp_path / "run", options), "q", options, job_states=lambda j: {})
    assert submitted == ["eval_servers.sbatch"] and cancelled == [["scancel", "500"]]
