from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="module")
def vllm_server(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM server (the vllm-cpu build in its own venv) on the tiny model; its base URL.

    Module-scoped: the CPU build keeps both cores busy while it runs, so it is stopped as soon
    as the module that needs it is done."""
    from cts.serving.vllm_server import VllmServer

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
        yield server.base_url
    finally:
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
