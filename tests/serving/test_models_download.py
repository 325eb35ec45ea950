"""`cts models download`: every hub model of an experiment fetched once, a manifest, and the
experiment that runs on the local copies. No model hub is reachable here: the one stand-in is
huggingface_hub's snapshot function, which lays files out as the real one does (a cache folder
models--org--name with blobs/ and snapshots/<commit>/ linking to them)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

import cts.serving.download
from cts.cli import app
from cts.eval.run.config import load_experiment
from cts.serving.download import IGNORE_PATTERNS
from cts.serving.model_config import build_engine

HARD518_MODELS = {
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "webdancer-32b": "Alibaba-NLP/WebDancer-32B",
    "qwen3-30b-a3b-instruct-2507": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "ernie-4.5-21b-a3b": "baidu/ERNIE-4.5-21B-A3B-PT",
}


class FakeHub:
    """snapshot_download on a hub that has every repo, each with a config, a tokenizer and one
    weights file whose size depends on the repo, at commit sha1(repo@revision)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[dict] = []
        self.fail = fail

    def __call__(self, repo_id: str, revision: str | None, cache_dir: Path, **kw) -> str:
        self.calls.append({"repo_id": repo_id, "revision": revision, **kw})
        if repo_id == self.fail:
            raise OSError(f"401 Client Error: gated repo {repo_id}")
        commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        files = {
            "config.json": json.dumps({"model_type": "qwen3"}).encode(),
            "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
            "model.safetensors": b"\0" * (1000 + len(repo_id)),
        }
        for name, data in files.items():
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = snapshot / name
            if not link.exists():
                link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
        return str(snapshot)


def test_download_writes_a_manifest_and_the_experiment_on_local_copies(tmp_path, monkeypatch):
    hub = FakeHub()
    monkeypatch.setattr(cts.serving.download, "_default_snapshot", lambda: hub)
    to = tmp_path / "weights"
    pinned = "0123456789abcdef0123456789abcdef01234567"
    result = CliRunner().invoke(
        app,
        [
            "models",
            "download",
            "-c",
            "hard518",
            "--to",
            str(to),
            "--set",
            f"models.qwen3-8b.revision={pinned}",
        ],
    )
    assert result.exit_code == 0, result.output
    assert {c["repo_id"] for c in hub.calls} == set(HARD518_MODELS.values())
    assert all(c["ignore_patterns"] == IGNORE_PATTERNS for c in hub.calls)
    assert next(c for c in hub.calls if c["repo_id"] == "Qwen/Qwen3-8B")["revision"] == pinned

    manifest = json.loads((to / "manifest.json").read_text())
    assert set(manifest["models"]) == set(HARD518_MODELS)
    for key, entry in manifest["models"].items():
        repo = HARD518_MODELS[key]
        assert entry["repo"] == repo
        assert entry["revision"] == Path(entry["path"]).name  # the commit fetched
        assert len(entry["revision"]) == 40
        assert entry["files"] == 3
        assert entry["bytes"] == 1000 + len(repo) + len('{"model_type": "qwen3"}') + 35
    assert manifest["models"]["qwen3-8b"]["requested_revision"] == pinned
    assert manifest["bytes"] == sum(e["bytes"] for e in manifest["models"].values())

    # The experiment that runs on the copies: each model's path is its snapshot; everything
    # else (served name, revision, so every engine identity and cache key) is as before.
    local = load_experiment(to / "hard518.yaml")
    original = load_experiment("hard518", [f"models.qwen3-8b.revision={pinned}"])
    assert local.experiment.roles == original.experiment.roles
    for key, model in local.model_configs.items():
        assert model.path == manifest["models"][key]["path"]
        assert (Path(model.path) / "config.json").is_file()
        assert (
            model.model_copy(update={"path": original.model_configs[key].path})
            == (original.model_configs[key])
        )
        engine = build_engine(model.model_copy(update={"endpoint": "http://h:1/v1"}))
        assert (
            engine.identity
            == build_engine(
                original.model_configs[key].model_copy(update={"endpoint": "http://h:1/v1"})
            ).identity
        )
    assert f"cts slurm submit -c {to / 'hard518.yaml'}" in result.output


def test_nothing_to_fetch_for_local_and_tiny_models(tmp_path, monkeypatch):
    """The quickstart's tiny model is converted locally; a model already on disk is kept."""
    hub = FakeHub()
    monkeypatch.setattr(cts.serving.download, "_default_snapshot", lambda: hub)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    args = ["models", "download", "--to", str(tmp_path / "w"), "--set"]
    result = CliRunner().invoke(
        app, [*args, "roles.judge.model=qwen3-8b", "--set", f"models.qwen3-8b.path={ckpt}"]
    )
    assert result.exit_code == 0, result.output
    assert hub.calls == []
    assert json.loads((tmp_path / "w" / "manifest.json").read_text())["models"] == {}


def test_a_repo_the_hub_refuses_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(
        cts.serving.download, "_default_snapshot", lambda: FakeHub(fail="Qwen/Qwen3-32B")
    )
    result = CliRunner().invoke(app, ["models", "download", "-c", "hard518", "--to", str(tmp_path)])
    assert result.exit_code == 1
    assert "download failed: model qwen3-32b (Qwen/Qwen3-32B): OSError: 401" in result.output
