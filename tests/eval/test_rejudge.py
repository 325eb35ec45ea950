"""`cts rejudge` end to end with scripted engines: a run, then its answers judged again by
another (scripted) judge. Only the judge is asked; records, summary and report land in the new
directory with the source named; failures before the judge stay failures; resume, shards and
a changed config behave as in `cts run`; the source run's cached judge answers are never
replayed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import cts.eval.experiment
import cts.eval.rejudge
from cts.cli import app
from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Record
from cts.eval.experiment import merge_run, run_experiment
from cts.eval.rejudge import SourceRunError, rejudge_experiment, rejudge_run
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.eval.run.fingerprint import changes
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.score.metrics import restore_score
from cts.foundation.yaml_config import ConfigError
from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest
from cts.slurm import render as render_module
from cts.slurm.chain import submit
from cts.slurm.kinds import plan_job
from cts.slurm.plan import SlurmOptionError, SlurmOptions

#: Search fails on this instance's blurred query (before the judge): a copied failure.
FAILS_SEARCH = "monthly commuter pass cost on regional rail"
#: The source's judge fails on this nugget text (at the judge): judged again by a rejudge.
FAILS_JUDGE = "Korvex Aura Pro earbuds play for about 7.5 hours"
CONDITIONS = "[blurred, clarify@1, clarify@2, oracle]"


def other_judge(request: ChatRequest) -> str:
    """The rejudge's judge: `full` for a nugget whose id ends in an odd digit, else `none`."""
    assert request.output is not None and request.output.kind == "json"
    ids = request.output.json_schema["required"]
    labels = {i: "full" if int(i[-1]) % 2 else "none" for i in ids}
    return json.dumps({i: {"evidence": "e", "label": labels[i]} for i in ids})


def source_roles() -> dict[str, ScriptedEngine]:
    """The scripted roles, with a searcher that fails on one query and a judge that fails on
    one instance's nuggets."""
    roles = scripted_roles()
    search, judge = roles["searcher"].script, roles["judge"].script

    def searcher(request: ChatRequest) -> str | Exception:
        if FAILS_SEARCH in request.messages[-1].content:
            return EngineError("search backend down")
        return search(request)

    def flaky_judge(request: ChatRequest) -> str | Exception:
        if FAILS_JUDGE in request.messages[-1].content:
            return EngineError("judge timed out")
        return judge(request)

    roles["searcher"].script = searcher
    roles["judge"].script = flaky_judge
    return roles


def engines_of(
    roles: dict[str, ScriptedEngine], asked: list[list[Role]] | None = None
) -> Callable[..., object]:
    """A stand-in for open_engines: `roles` behind the real response cache of the config;
    which roles each call asked for goes to `asked`."""

    @asynccontextmanager
    async def open_engines(
        resolved: ResolvedExperiment, wanted: list[Role] | None = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        wanted = list(wanted or resolved.experiment.roles)
        if asked is not None:
            asked.append(wanted)
        config = resolved.experiment.cache
        cache = ResponseCache(config.resolved_path()) if use_cache and config.enabled else None
        by_role: dict[Role, ChatModel] = {
            role: CachedEngine(roles[role], cache) if cache is not None else roles[role]
            for role in wanted
        }
        try:
            yield Engines({str(r): e for r, e in by_role.items()}, by_role, cache)
        finally:
            if cache is not None:
                cache.close()

    return open_engines


def requests(roles: dict[str, ScriptedEngine]) -> dict[str, int]:
    return {role: len(e.requests) for role, e in roles.items() if e.requests}


def make_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> Path:
    """A finished run of 3 instances × 4 conditions with scripted roles, its judge answers in
    the shared cache tmp_path/responses.sqlite."""
    resolved = load_experiment(
        None,
        [
            "dataset.limit=3",
            f"conditions={CONDITIONS}",
            "search.date=2026-11-30",
            # A model judge (scripted here), whose answers a rejudge may replay or not.
            "roles.judge.model=smollm2-135m-instruct",
            f"cache.path={tmp_path}/responses.sqlite",
            f"search.tool_cache={tmp_path}/tools.sqlite",
            *overrides,
        ],
    )
    monkeypatch.setattr(cts.eval.experiment, "open_engines", engines_of(source_roles()))
    result = run_experiment(resolved, tmp_path / "source", show_progress=False)
    assert not result.outcome.interrupted and result.report is not None
    return tmp_path / "source"


def records(run_dir: Path) -> dict[tuple[str, str, int], Record]:
    return RecordStore(run_dir).completed()


def rejudge(
    source: Path,
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    judge: Callable[[ChatRequest], str | Exception] = other_judge,
    shard: Shard | None = None,
) -> tuple[cts.eval.rejudge.RejudgeResult, dict[str, ScriptedEngine], list[list[Role]]]:
    roles = scripted_roles()
    roles["judge"].script = judge
    asked: list[list[Role]] = []
    monkeypatch.setattr(cts.eval.rejudge, "open_engines", engines_of(roles, asked))
    resolved = rejudge_experiment(source, out, None, overrides)
    result = rejudge_run(resolved, source, out, shard=shard, show_progress=False)
    return result, roles, asked


NEW_JUDGE = ["roles.judge.model=qwen3-8b"]


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    return make_source(tmp_path, monkeypatch)


def test_a_rejudge_asks_only_the_judge_and_writes_a_run(source, tmp_path, monkeypatch):
    out = tmp_path / "new"
    result, roles, asked = rejudge(source, out, monkeypatch, NEW_JUDGE)
    old, new = records(source), records(out)

    # Only the judge is built and asked; no other role receives a request.
    assert asked == [["judge"]]
    assert set(requests(roles)) == {"judge"}
    assert result.model_calls == len(roles["judge"].requests) > 0

    # Every key of the source, once.
    assert set(new) == set(old) and len(old) == 3 * 4
    searched_failed = {k for k, r in old.items() if r.error and r.error["stage"] == "search"}
    judge_failed = {k for k, r in old.items() if r.error and r.error["stage"] == "judge"}
    assert searched_failed and judge_failed  # the fixture has both kinds
    for key in searched_failed:  # failed before the judge: copied with the error, counted
        assert new[key] == old[key]
    assert result.copied_failures == len(searched_failed)
    assert sum(result.outcome.failures.values()) == len(searched_failed)
    instances = {i.id: i for i in load_instances(load_experiment(None).experiment.dataset)}
    for key, record in new.items():
        if key in searched_failed:
            continue
        # Judged again (also where the source's judge failed), with the new judge's labels
        # and the scores `cts run` computes from them.
        assert record.error is None
        nuggets = instances[key[0]].golden.nuggets  # type: ignore[union-attr]
        expected = {n.id: "full" if int(n.id[-1]) % 2 else "none" for n in nuggets}
        assert {i: v["label"] for i, v in record.labels.items()} == expected
        weights = {n.id: n.weight for n in nuggets}
        assert record.scores["restore_score_100"] == restore_score(expected, weights)  # type: ignore[arg-type]
        assert record.scores["strict"] == restore_score(expected, weights, strict=True)  # type: ignore[arg-type]
        # What the source's other roles produced is kept.
        source_record = old[key]
        assert (record.answer, record.questions, record.answers, record.rewrite) == (
            source_record.answer,
            source_record.questions,
            source_record.answers,
            source_record.rewrite,
        )

    # A run directory like `cts run`'s: summary, report, and the source named.
    run = RunDir(out)
    assert run.summary.is_file() and run.report_md.is_file() and run.report_html.is_file()
    summary = json.loads(run.summary.read_text())
    assert list(summary["systems"]) == ["quickstart (smollm2-135m-instruct)"]
    provenance = json.loads(run.provenance.read_text())
    assert provenance["source"]["path"] == str(source.resolve())
    assert provenance["source"]["judge"]["model"] == "smollm2-135m-instruct"
    assert provenance["judge"]["model"] == "qwen3-8b"
    assert provenance["cache"] == str(run.own_cache.resolve())
    config = yaml.safe_load(run.config.read_text())
    assert config["experiment"]["roles"]["judge"]["model"] == "qwen3-8b"
    assert config["fingerprint"]["source"] == provenance["source"]["config_digest"]
    assert config["experiment"]["roles"]["clarifier"] == {"model": "smollm2-135m-instruct"} | {
        "sampling": config["experiment"]["roles"]["clarifier"]["sampling"]
    }


def test_a_rejudge_resumes_without_asking_again(source, tmp_path, monkeypatch):
    out = tmp_path / "new"
    first, _, _ = rejudge(source, out, monkeypatch, NEW_JUDGE)
    before = records(out)
    again, roles, _ = rejudge(source, out, monkeypatch, NEW_JUDGE)
    assert again.outcome.ran == 0 and again.outcome.skipped == first.outcome.ran == 12
    assert requests(roles) == {}
    assert records(out) == before


def test_shards_rejudge_their_instances_and_merge(source, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    rejudge(source, whole, monkeypatch, NEW_JUDGE)
    out = tmp_path / "sharded"
    first, _, _ = rejudge(source, out, monkeypatch, NEW_JUDGE, shard=Shard(0, 2))
    assert first.report is None and first.outcome.ran == 2 * 4  # instances 0 and 2
    assert {k[0] for k in records(out)} == {"A-dev-01", "A-dev-03"}
    second, _, _ = rejudge(source, out, monkeypatch, NEW_JUDGE, shard=Shard(1, 2))
    assert second.outcome.ran == 4
    merged = merge_run(out)
    assert merged.ok and RunDir(out).summary.is_file()

    def labels(run: Path) -> dict[object, object]:
        return {k: (r.labels, r.scores, r.error) for k, r in records(run).items()}

    assert labels(out) == labels(whole)


def test_a_changed_config_is_refused_on_resume(source, tmp_path, monkeypatch):
    out = tmp_path / "new"
    rejudge(source, out, monkeypatch, NEW_JUDGE)
    before = RunDir(out).config.read_bytes()
    with pytest.raises(ConfigError, match=r"resuming would mix the two[\s\S]*judge.show_query"):
        rejudge(source, out, monkeypatch, [*NEW_JUDGE, "judge.show_query=true"])
    with pytest.raises(ConfigError, match=r"roles\.judge\.model"):
        rejudge(source, out, monkeypatch, [])
    assert RunDir(out).config.read_bytes() == before


def test_a_resume_from_another_source_run_or_into_an_ordinary_run_is_refused(
    source, tmp_path, monkeypatch
):
    # B: the same config, other answers (as a sampled searcher would give).
    other_source = tmp_path / "B"
    shutil.copytree(source, other_source)
    for path in RecordStore(other_source).all_files():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r | {"answer": "Other answer."}) + "\n" for r in rows))
    out = tmp_path / "new"
    rejudge(source, out, monkeypatch, NEW_JUDGE)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SourceRunError, match="is a rejudge of") as refused:
        rejudge(other_source, out, monkeypatch, NEW_JUDGE)
    assert str(source.resolve()) in str(refused.value)
    assert str(other_source.resolve()) in str(refused.value)
    # rejudge_run checks it too, whoever built the experiment; nothing in NEW changed.
    resolved = rejudge_experiment(other_source, tmp_path / "fresh", None, NEW_JUDGE)
    with pytest.raises(SourceRunError, match="is a rejudge of"):
        rejudge_run(resolved, other_source, out, show_progress=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    # An ordinary run as the output directory: refused, no rejudge.json written into it.
    with pytest.raises(SourceRunError, match="not a rejudge"):
        rejudge(source, other_source, monkeypatch, NEW_JUDGE)
    assert not RunDir(other_source).provenance.exists()
    result = CliRunner().invoke(
        app, ["rejudge", str(source), "--output-dir", str(other_source), "--set", NEW_JUDGE[0]]
    )
    assert result.exit_code == 2 and "not a rejudge" in result.output, result.output


def test_a_rejudge_and_an_ordinary_run_differ_by_the_source_fingerprint():
    # One side only: a rejudge's source digest is compared; a digest added in a later version
    # (one per prompt file) is not, so that older run directories still resume.
    assert changes({"fingerprint.source": "abc"}, {}) == ['fingerprint.source: "abc" → "(unset)"']
    assert changes({}, {"fingerprint.prompt:agents/judge.yaml": "j"}) == []


def test_a_rejudge_changes_the_judge_only(source, tmp_path, monkeypatch):
    out = tmp_path / "new"
    for override, key in [
        ("search.top_k=5", "search.top_k: 3 → 5"),
        ("roles.clarifier.model=qwen3-8b", "roles.clarifier.model"),
        # The tiny model also serves the other roles: its config is theirs too.
        ("models.smollm2-135m-instruct.sampling.top_p=0.5", "sampling.top_p: 1.0 → 0.5"),
    ]:
        with pytest.raises(ConfigError, match="changes the judge only") as refused:
            rejudge(source, out, monkeypatch, [override])
        assert key in str(refused.value)
    with pytest.raises(ConfigError, match="never in a shared cache"):
        rejudge(source, out, monkeypatch, [f"cache.path={tmp_path}/responses.sqlite"])
    # rejudge_run guards the cache too, whoever built its experiment.
    resolved = rejudge_experiment(source, out, None, NEW_JUDGE)
    shared = resolved.experiment.cache.model_copy(update={"path": f"{tmp_path}/responses.sqlite"})
    experiment = resolved.experiment.model_copy(update={"cache": shared})
    with pytest.raises(ConfigError, match="caches its judge's answers in"):
        rejudge_run(resolved.model_copy(update={"experiment": experiment}), source, out)
    with pytest.raises(SourceRunError, match="is the source run itself"):
        rejudge(source, source, monkeypatch, NEW_JUDGE)
    # Keys the source does not have: refused with what is missing, nothing written.
    with pytest.raises(SourceRunError, match=r"12 of the 24 keys .* no record in the source"):
        rejudge(source, out, monkeypatch, [*NEW_JUDGE, "seeds=[0, 1]"])
    assert not out.exists()
    # Judge keys and a subset of the conditions may change.
    result, _, _ = rejudge(
        source, out, monkeypatch, ["judge.show_query=true", "conditions=[blurred, oracle]"]
    )
    assert result.outcome.ran == 3 * 2


def test_the_same_judge_is_asked_again_never_replayed_from_the_source_cache(
    source, tmp_path, monkeypatch
):
    """Same judge, same options: the judge's requests are the ones the source's judge was
    sent and are in the shared cache, yet every one is asked again."""
    shared = ResponseCache(tmp_path / "responses.sqlite")
    cached_before = len(shared)
    shared.close()
    same = scripted_roles()["judge"].script
    out = tmp_path / "again"
    # The canary's requests (judge.canary; no label depends on it) are not what is counted here.
    canary_off = ["judge.canary.enabled=false"]
    result, roles, _ = rejudge(source, out, monkeypatch, canary_off, judge=same)
    old = records(source)
    judged = [k for k, r in old.items() if not (r.error and r.error["stage"] != "judge")]
    # Every distinct judge request was sent to the judge once; the rest were the rejudge's own
    # cache (the scripted searcher answers every condition of an instance alike).
    distinct = {(k[0], old[k].answer) for k in judged}
    sent = roles["judge"].requests
    assert len(sent) == len({r.key("x") for r in sent}) == len(distinct) > 0
    assert result.cache is not None and result.cache["invalid"] == 0
    assert result.cache["hits"] + result.cache["misses"] == len(judged)
    assert result.outcome.ran - result.copied_failures == len(judged)
    # The shared cache already held these very requests (but those the source's judge failed
    # on), and was not written either.
    shared = ResponseCache(tmp_path / "responses.sqlite")
    in_shared = [shared.get(r.key("scripted:judge")) is not None for r in sent]
    assert in_shared == [FAILS_JUDGE not in r.messages[-1].content for r in sent]
    assert sum(in_shared) == len(distinct) - 1
    assert len(shared) == cached_before
    shared.close()
    own = ResponseCache(RunDir(out).own_cache)
    assert len(own) == len(distinct)
    own.close()
    # With the same judge the labels equal the source's where its judge did not fail.
    new = records(out)
    for key, record in old.items():
        if record.error is None:
            assert new[key].labels == record.labels and new[key].scores == record.scores


def test_the_command_line_rejudges(source, tmp_path, monkeypatch):
    roles = scripted_roles()
    roles["judge"].script = other_judge
    monkeypatch.setattr(cts.eval.rejudge, "open_engines", engines_of(roles))
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        app, ["rejudge", str(source), "--output-dir", str(out), "--set", NEW_JUDGE[0]]
    )
    assert result.exit_code == 0, result.output
    assert "12 records written" in result.output
    assert "3 of the failed records failed before the judge" in result.output
    assert set(requests(roles)) == {"judge"}
    assert RunDir(out).summary.is_file()
    # `cts report` reads it, but not as a second clarifier system: the judges differ.
    report = CliRunner().invoke(
        app, ["report", str(source), str(out), "--out", str(tmp_path / "r")]
    )
    assert report.exit_code == 2 and "judge.model.name" in report.output, report.output
    report = CliRunner().invoke(
        app, ["report", str(source), str(out), "--out", str(tmp_path / "r"), "--allow-unlike"]
    )
    assert report.exit_code == 0, report.output
    # Not a run directory: exit 2 with the path.
    bad = CliRunner().invoke(app, ["rejudge", str(tmp_path / "nowhere"), "--output-dir", str(out)])
    assert bad.exit_code == 2 and "no config.yaml" in bad.output


def test_a_slurm_rejudge_job_renders_and_its_frozen_config_rejudges(source, tmp_path, monkeypatch):
    """`cts slurm submit --job rejudge --source RUN`: each task runs `cts rejudge RUN` on the
    frozen experiment (the judge changed, the rest the source's), then `cts merge`."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # dry runs render here
    dumper = tmp_path / "dump argv.py"
    dumper.write_text(
        "import json, os, sys\nopen(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    monkeypatch.setattr(render_module, "cts_command", lambda: [sys.executable, str(dumper)])
    out = tmp_path / "new $(touch PWNED); it's"
    options = SlurmOptions(shards=2, gpus_per_task=1, cpu=True)
    (job,), name = plan_job("rejudge", None, NEW_JUDGE, out, options, source)
    assert (job.kind, job.keys_per_instance, name) == ("rejudge", 4, "quickstart")
    done = submit(job, name, options, dry_run=True, workdir=tmp_path)
    assert not out.exists()  # a dry run writes nothing into the run directory
    frozen = Path(done.experiment)
    argv = tmp_path / "argv.json"
    env = {**os.environ, "ARGV_OUT": str(argv), "SLURM_ARRAY_TASK_ID": "1"}
    env.update(SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_JOB_ID="9")
    subprocess.run(["bash", done.scripts["array"]], env=env, check=True, capture_output=True)
    assert json.loads(argv.read_text()) == [
        *("rejudge", str(source.resolve()), "--config", str(frozen)),
        *("--output-dir", str(out.resolve()), "--serve", "--cpu", "--shard", "1/2"),
    ]
    subprocess.run(["bash", done.scripts["final"]], env=env, check=True, capture_output=True)
    assert json.loads(argv.read_text()) == ["merge", str(out.resolve())]
    assert not list(tmp_path.rglob("PWNED"))

    # What a task does with the frozen config: a rejudge with the new judge, whose shards merge.
    roles = scripted_roles()
    roles["judge"].script = other_judge
    monkeypatch.setattr(cts.eval.rejudge, "open_engines", engines_of(roles))
    resolved = rejudge_experiment(source, out.resolve(), str(frozen), [])
    assert resolved.experiment.roles["judge"].model == "qwen3-8b"
    for index in (0, 1):
        rejudge_run(resolved, source, out.resolve(), shard=Shard(index, 2), show_progress=False)
    assert merge_run(out.resolve()).ok and set(requests(roles)) == {"judge"}

    with pytest.raises(SlurmOptionError, match="--output-dir"):
        plan_job("rejudge", None, NEW_JUDGE, None, options, source)
    with pytest.raises(SlurmOptionError, match="--job rejudge only"):
        plan_job("eval", None, [], out, options, source)
    with pytest.raises(SlurmOptionError, match="--job rejudge only"):
        plan_job("rejudge", None, [], out, options, None)
