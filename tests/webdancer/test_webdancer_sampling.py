"""WebDancer's sampling as its release sends it: top_k -1 (unsent, vLLM applied the checkpoint's
generation config, top_k 40) and max_tokens 32768 (clamped per turn to the window's room)."""

from __future__ import annotations

import hashlib
import json

from cts.eval.run.config import load_experiment
from cts.serving.openai_engine import OpenAIEngine
from cts.serving.types import ChatRequest, Sampling


def test_the_searcher_sends_the_releases_top_k_and_max_tokens():
    resolved = load_experiment("hard518")
    sampling = resolved.sampling_for("searcher")
    assert (sampling.top_k, sampling.max_tokens) == (-1, 32768)
    assert (sampling.temperature, sampling.top_p, sampling.repetition_penalty) == (0.6, 0.95, 1.1)
    engine = OpenAIEngine("Alibaba-NLP/WebDancer-32B", "http://127.0.0.1:9/v1")
    body = engine.body(ChatRequest.of([{"role": "user", "content": "q"}], **sampling.model_dump()))
    assert body["top_k"] == -1 and body["max_tokens"] == 32768
    # Other models send none: vLLM's default (the checkpoint's generation config) stays.
    judge = resolved.sampling_for("judge")
    assert "top_k" not in engine.body(
        ChatRequest.of([{"role": "user", "content": "q"}], **judge.model_dump())
    )
    # A role may set it.
    again = load_experiment("hard518", ["roles.judge.sampling.top_k=20"])
    assert again.sampling_for("judge").top_k == 20


def test_an_unset_top_k_leaves_every_cache_key_as_it_was():
    """Cache keys hash the request's sampling: an unset top_k is left out of it, so the answers
    cached before the field existed are still found."""
    request = ChatRequest.of([{"role": "user", "content": "q"}], temperature=0.7, seed=3)
    before = {  # the key as it was before top_k existed (the purpose came first)
        "purpose": "evaluation",
        "engine": "e",
        "request": {
            "messages": [{"role": "user", "content": "q"}],
            "sampling": {
                "temperature": 0.7,
                "top_p": 1.0,
                "max_tokens": 256,
                "seed": 3,
                "stop": [],
                "repetition_penalty": 1.0,
            },
            "output": None,
        },
    }
    blob = json.dumps(before, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert request.key("e") == hashlib.sha256(blob.encode()).hexdigest()
    assert ChatRequest.of([{"role": "user", "content": "q"}], top_k=-1).key("e") != request.key("e")
    assert Sampling.model_validate(Sampling(top_k=-1).model_dump()).top_k == -1
