"""An engine's identity in the response cache holds what changes its answers, and only that: a
cached answer never answers for another chat-template setting, checkpoint, dtype, adapter or
set of vLLM flags, and still answers for the same model on another port, node or GPUs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cts.serving.batching import BatchingEngine
from cts.serving.cache import ResponseCache
from cts.serving.model_config import ModelConfig, build_engine
from cts.serving.types import ChatRequest, ChatResponse
from tests.fault_helpers import QuietHandler, loopback_server

ASK = ChatRequest.of([{"role": "user", "content": "capital of France?"}], seed=0)


class Counting(QuietHandler):
    requests = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests += 1
        self.send_json(200, {"choices": [{"message": {"content": "Paris"}}]})


@pytest.fixture
def asked(tmp_path):
    """`ask(**fields)`: whether a request to the model config with those fields (over the base
    one) reached the server, through one response cache."""
    cache = ResponseCache(tmp_path / "responses.sqlite")
    Counting.requests = 0
    with loopback_server(Counting) as url, loopback_server(Counting) as other:
        base: dict[str, Any] = {
            "name": "qwen3-8b",
            "path": "Qwen/Qwen3-8B",
            "engine": "openai",
            "endpoint": f"{url}/v1",
            "chat_template_kwargs": {"enable_thinking": False},
        }

        def ask(**fields: Any) -> bool:
            engine = build_engine(ModelConfig(**{**base, **fields}), cache)
            before = Counting.requests
            asyncio.run(engine.chat(ASK))
            asyncio.run(engine.aclose())
            return Counting.requests > before

        ask.other = f"{other}/v1"  # type: ignore[attr-defined]
        yield ask
    cache.close()


def test_the_same_model_elsewhere_is_answered_from_the_cache(asked):
    assert asked() is True
    assert asked() is False
    # Where and on what it runs changes nothing it answers: a cache shared by runs on other
    # ports, nodes and GPUs still hits.
    assert asked(endpoint=asked.other) is False
    assert asked(endpoint=[asked.other, "http://127.0.0.1:9/v1"]) is False
    assert asked(vllm={"port": 8123, "gpus": [3], "gpu_memory_utilization": 0.45}) is False
    assert asked(vllm={"replicas": 4, "tensor_parallel_size": 2}) is False
    assert asked(chat_template_kwargs={"enable_thinking": False}, max_concurrency=64) is False


@pytest.mark.parametrize(
    "fields",
    [
        {"chat_template_kwargs": {"enable_thinking": True}},
        {"chat_template_kwargs": {}},
        {"path": "/ckpt/qwen3-8b-finetuned-step2000"},
        {"dtype": "bfloat16"},
        {"revision": "0123456789abcdef0123456789abcdef01234567"},
        {"vllm": {"extra_args": ["--reasoning-parser", "qwen3"]}},
    ],
    ids=["enable-thinking", "no-template-kwargs", "path", "dtype", "revision", "extra-args"],
)
def test_each_setting_that_changes_answers_is_asked_again(asked, fields):
    assert asked() is True
    assert asked(**fields) is True
    assert asked(**fields) is False  # and that setting's own answer is cached in turn


def test_a_checkpoint_or_adapter_trained_again_in_place_is_asked_again(asked, tmp_path: Path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 10)
    assert asked(path=str(checkpoint)) is True
    assert asked(path=str(checkpoint)) is False
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 11)
    assert asked(path=str(checkpoint)) is True

    adapters = {}
    for name in ("a", "b"):
        adapters[name] = tmp_path / name
        adapters[name].mkdir()
        (adapters[name] / "adapter_config.json").write_text(json.dumps({"r": 8, "of": name}))
    lora = {"lora_of": "qwen3-8b-base", "name": "clarifier-ft"}
    assert asked(**lora, adapter=str(adapters["a"])) is True
    assert asked(**lora, adapter=str(adapters["a"])) is False
    assert asked(**lora, adapter=str(adapters["b"])) is True
    (adapters["a"] / "adapter_model.safetensors").write_bytes(b"\0" * 4)
    assert asked(**lora, adapter=str(adapters["a"])) is True


def test_a_hub_snapshot_is_the_hub_id_it_copies(asked, tmp_path: Path):
    """`cts models download` points the experiment at its copies: their answers are the hub
    model's (the test of the download checks every hard518 model's identity too)."""
    snapshot = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert asked() is True
    assert asked(path=str(snapshot)) is False


class Local(BatchingEngine):
    kind = "local"

    def _run_batch(self, requests: list[ChatRequest]) -> list[ChatResponse | Any]:
        return [ChatResponse(text="Paris") for _ in requests]


def test_an_in_process_engine_s_identity_holds_its_chat_template_options(tmp_path: Path):
    plain = Local("m", "/no/such/ckpt")
    # Without options it is what it always was: caches from before still answer.
    assert plain.identity == "local:m:/no/such/ckpt@/no/such/ckpt:float32"
    thinking = Local("m", "/no/such/ckpt", chat_template_kwargs={"enable_thinking": True})
    quiet = Local("m", "/no/such/ckpt", chat_template_kwargs={"enable_thinking": False})
    again = Local("m", "/no/such/ckpt", chat_template_kwargs={"enable_thinking": False})
    assert len({plain.identity, thinking.identity, quiet.identity}) == 3
    assert quiet.identity == again.identity
