from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cts.serving.tiny_model import prepare_tiny


@pytest.fixture(scope="session")
def tiny_path() -> str:
    """The converted tiny real model (prepared once per machine under $CTS_HOME)."""
    return str(prepare_tiny(log=False))


@pytest.fixture(scope="session")
def tiny_engine(tiny_path: str):
    from cts.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine("smollm2-135m-instruct", tiny_path, dtype="auto")
    engine.load()
    return engine


#: How the CPU build serves the tiny model: fp32 (bf16 gave wrong text on CPU), eager (ready in
#: ~50 s instead of ~160 s), and compact JSON (the tiny model otherwise fills JSON with newlines
#: until max_tokens; xgrammar's whitespace switch is server-wide).
VLLM_CPU_ARGS = [
    "--dtype",
    "float32",
    "--enforce-eager",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]


def vllm_python() -> str:
    """The interpreter of the vllm-cpu venv; skips (or fails under CTS_REQUIRE_VLLM) without."""
    python = os.environ.get("CTS_VLLM_PYTHON")
    if not python:
        if os.environ.get("CTS_REQUIRE_VLLM"):
            pytest.fail("CTS_REQUIRE_VLLM is set but CTS_VLLM_PYTHON is not (see Makefile)")
        pytest.skip("CTS_VLLM_PYTHON unset: build the venv with scripts/vllm_cpu_venv.sh")
    return python


#: The one vLLM server the tests that take `vllm_server` share (started by the first of them).
_SHARED_SERVER: dict[str, Any] = {}


@pytest.fixture
def vllm_server(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real vLLM server (the vllm-cpu build in its own venv) on the tiny model; its base URL.

    Started once for all the tests that take it: they run one after another (see
    `pytest_collection_modifyitems`) and it stops after the last of them
    (`pytest_runtest_teardown`), since the CPU build keeps both cores busy while it runs."""
    from cts.serving.vllm_server import VllmServer

    server = _SHARED_SERVER.get("server")
    if server is None:
        python = vllm_python()
        log = Path(tmp_path_factory.mktemp("vllm")) / "server.log"
        server = VllmServer(
            model_path=tiny_path,
            served_name="smollm2-135m-instruct",
            log_path=log,
            python=python,
            args=[*VLLM_CPU_ARGS, "--max-model-len", "2048"],
            env={"VLLM_CPU_KVCACHE_SPACE": "2"},
        ).start()
        try:
            server.wait_ready(deadline_s=600)
        except BaseException:
            server.stop()
            raise
        _SHARED_SERVER["server"] = server
    return str(server.base_url)


def _uses_server(item: pytest.Item | None) -> bool:
    return item is not None and "vllm_server" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that take `vllm_server` run together, where the first of them stood."""
    using = [i for i in items if _uses_server(i)]
    if using:
        at = items.index(using[0])
        rest = [i for i in items if not _uses_server(i)]
        items[:] = rest[:at] + using + rest[at:]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared server stops once no test after this one takes it."""
    if _uses_server(item) and not _uses_server(nextitem):
        server = _SHARED_SERVER.pop("server", None)
        if server is not None:
            server.stop()


@pytest.fixture
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 columns: rich wraps tables at 80 columns otherwise, cutting the lines tests look for."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The real local BM25 search over the sample corpus (its index built once per module)."""
    from cts.eval.data.dataset import corpus_path
    from cts.webdancer.backends.local import LocalSearch

    return LocalSearch(corpus_path("sample"), tmp_path_factory.mktemp("index"))
