"""Small builders shared by test modules of several folders: the in-process `cts` command,
scripted engines in place of a command's models, and checks that several tests make alike."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

import cts.eval.construct.blur as blur_module
import cts.eval.construct.fuse as fuse_module
import cts.eval.experiment as experiment_module
import tests.scripted_cts
from cts.cli import app
from cts.configs import CONFIG_DIR
from cts.eval.data.readers import DatasetError
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.serving.model_config import ModelConfig
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest
from cts.train.sft import sft_row
from tests.scripted_cts import scripted_engines

Script = Callable[[ChatRequest], str | Exception]


def cts(*args: str) -> Result:
    """`cts ARGS` in this process, an exception raised as it is (not turned into an exit code)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def scripted_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roles: Callable[[], dict[str, Any]]
) -> Path:
    """The real command line in this process, every role on `roles()`'s scripted engines behind
    the real caches under $CTS_HOME (tmp_path/home), a progress line per key; tmp_path."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", roles)
    for module in (experiment_module, fuse_module, blur_module):
        monkeypatch.setattr(module, "open_engines", scripted_engines)
    return tmp_path


def scripted_role(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, role: Role, script: Script
) -> dict[str, object]:
    """`module`'s engines replaced by one scripted engine for `role`, so that a calibration
    command needs no model; what it was opened with (roles, use_cache, engine), empty until
    it is opened."""
    opened: dict[str, object] = {}
    engine = ScriptedEngine(script, name=role)

    @asynccontextmanager
    async def engines(
        resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        opened.update(roles=roles, use_cache=use_cache, engine=engine)
        yield Engines({role: engine}, {role: engine}, None)  # type: ignore[dict-item]

    monkeypatch.setattr(module, "open_engines", engines)
    return opened


def calibrate_cli(command: str, labels: Path, out: Path, cache: Path, *more: str) -> Result:
    """`cts COMMAND calibrate` on `labels`, its figures written to `out`, its response cache
    (which a calibration must not use) at `cache`."""
    args = ["--labels", str(labels), "--out", str(out), "--set", f"cache.path={cache}", *more]
    return CliRunner().invoke(app, [command, "calibrate", *args])


def calibration_requests(opened: dict[str, object], role: Role) -> list[ChatRequest]:
    """The requests a calibration sent to `role` (opened by scripted_role), checked to be that
    role's alone, never through the response cache, at its greedy sampling with the first seed."""
    assert opened["roles"] == [role] and opened["use_cache"] is False
    requests: list[ChatRequest] = opened["engine"].requests  # type: ignore[attr-defined]
    # The role's own sampling, as `cts run` sends it: temperature 0, fixed seed.
    assert {(r.sampling.temperature, r.sampling.seed) for r in requests} == {(0.0, 0)}
    return requests


def dataset_problems(read: Callable[[Path], object], path: Path, rows: Sequence[str]) -> set[str]:
    """`rows` written as the lines of `path`, and the problems `read` refuses it with: a bad
    labels file must name every bad row at once."""
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DatasetError) as caught:
        read(path)
    return {str(p) for p in caught.value.problems}


def labels_file_problems(
    read: Callable[[Path], object], path: Path, good: dict[str, Any], *bad: dict[str, Any]
) -> set[str]:
    """The problems `read` refuses a labels file at `path` with: `good` on line 1, malformed
    JSON on line 2, the `bad` rows from line 3 on. Checked here: line 2 is named as malformed
    JSON and the good line 1 not at all; the caller checks the `bad` rows'."""
    rows = [json.dumps(good), "{not json", *(json.dumps(row) for row in bad)]
    found = dataset_problems(read, path, rows)
    assert any(p.startswith(f"{path}:2: <row>: malformed JSON: ") for p in found)
    assert not any(p.startswith(f"{path}:1:") for p in found)
    return found


def assert_refuses_missing_and_empty(read: Callable[[Path], object], folder: Path) -> None:
    """`read` refuses a labels file that is missing and one that holds no row."""
    with pytest.raises(DatasetError, match="no such file"):
        read(folder / "none.jsonl")
    (folder / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no labelled rows"):
        read(folder / "empty.jsonl")


def sample_instances(beside: Path) -> dict[str, dict[str, Any]]:
    """Every instance of the sample benchmark's dev, test and train splits (the files beside
    `beside`) by id, as JSON: what labelled rows about them must agree with."""
    instances = {}
    for split in ("dev", "test", "train"):
        for line in beside.with_name(f"{split}.jsonl").read_text().splitlines():
            instance = json.loads(line)
            instances[instance["id"]] = instance
    return instances


def search_then_visit(request: ChatRequest, query: Callable[[ChatRequest], str]) -> str:
    """A scripted searcher's turn: search `query(request)`, visit the first hit (so that the
    summarizer and the tool cache's visits are used), then answer; every turn fits the
    constrained mode's grammar."""
    turn = sum(m.role == "assistant" for m in request.messages)
    if turn == 0:
        call = {"name": "search", "arguments": {"query": [query(request)]}}
    elif turn == 1 and (
        url := re.search(r"\]\((https?://[^)\s]+)\)", request.messages[-1].content)
    ):
        call = {"name": "visit", "arguments": {"url": [url.group(1)], "goal": "the facts"}}
    else:
        return "<think>\ndone\n</think>\n<answer>\nan answer\n</answer>"
    return f"<think>\nnext\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def assert_seeded(generate: Callable[..., Sequence[Any]], n: int) -> None:
    """`generate(n, seed=…)`'s rows are the same for a seed and differ for another: training
    data that a rerun reproduces."""
    first = [sft_row(e) for e in generate(n, seed=3)]
    assert first == [sft_row(e) for e in generate(n, seed=3)]
    assert first != [sft_row(e) for e in generate(n, seed=4)]


def shipped_adapter(config: ModelConfig, adapter_dir: Path, record: str) -> dict[str, Any]:
    """The adapter that `config` serves, checked to be where its fit writes it (`adapter_dir`)
    and a LoRA of a few MB; its training record (the file `record` beside it)."""
    shipped = CONFIG_DIR / str(config.adapter)
    assert shipped == adapter_dir
    assert (shipped / "adapter_config.json").is_file()
    assert (shipped / "adapter_model.safetensors").stat().st_size < 10_000_000  # a few MB
    return json.loads((shipped / record).read_text())


def scripted_experiment(
    path: Path,
    name: str,
    scripted: Sequence[str],
    models: dict[str, dict[str, Any]],
    roles: dict[str, str],
    **settings: Any,
) -> Path:
    """An experiment YAML at `path` on the sample dataset and corpus: each role of `scripted` on
    its own scripted engine (its built-in rules), `roles` on the given `models`, and
    `settings` (conditions, seeds, …) laid over it."""
    rules = {
        role: {"name": f"scripted-{role}", "path": "none", "engine": "scripted", "script": role}
        for role in scripted
    }
    document = {
        "name": name,
        "roles": {
            **{role: {"model": f"scripted-{role}"} for role in scripted},
            **{role: {"model": model} for role, model in roles.items()},
        },
        "models": {**{m["name"]: m for m in rules.values()}, **models},
        "dataset": {"path": "sample", "split": "dev", "limit": 2},
        "search": {"backend": "local", "corpus": "sample"},
        **settings,
    }
    path.write_text(yaml.safe_dump(document))
    return path
