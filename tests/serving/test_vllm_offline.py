"""The vllm-offline engine with a real in-process `vllm.LLM` (the CPU build, in its venv)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
def test_vllm_offline_engine_answers_and_honours_constraints(tiny_path):
    python = os.environ.get("CTS_VLLM_PYTHON")
    if not python:
        if os.environ.get("CTS_REQUIRE_VLLM"):
            pytest.fail("CTS_REQUIRE_VLLM is set but CTS_VLLM_PYTHON is not")
        pytest.skip("CTS_VLLM_PYTHON unset: build the venv with scripts/vllm_cpu_venv.sh")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2"}
    # As a module from the root: as a script, tests/ would come first on sys.path and its
    # tests/serving/ would hide the package `serving`.
    done = subprocess.run(
        [python, "-m", "tests.vllm_offline_probe", tiny_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    plain, choice, regex, city, cut, summary = lines
    assert "Paris" in plain["text"] and plain["usage"]["completion_tokens"] > 0
    assert choice["parsed"] in ("yes", "no")
    assert regex["parsed"][:2] in ("19", "20") and len(regex["parsed"]) == 4
    assert isinstance(city["parsed"]["city"], str)
    assert cut["finish"] == "length" and cut["usage"]["completion_tokens"] == 7
    # The five concurrent requests were gathered into one vLLM call.
    assert summary == {"batches": 1, "requests": 5}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_without_vllm_the_engine_says_what_to_install():
    from cts.serving.errors import EngineError
    from cts.serving.types import ChatRequest
    from cts.serving.vllm_offline_engine import VllmOfflineEngine

    engine = VllmOfflineEngine("m", "/nowhere")
    with pytest.raises(
        EngineError, match=r"needs vLLM \(pip install 'clarify-then-search\[vllm\]'\)"
    ):
        asyncio.run(engine.chat(ChatRequest.of([{"role": "user", "content": "hi"}])))
    assert "vllm" not in sys.modules
