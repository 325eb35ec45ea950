"""How the transformers engine splits a batch and picks its dtype, without loading a model."""

from __future__ import annotations

import pytest

import cts.serving.transformers_engine as te
from cts.serving.transformers_engine import TransformersEngine, resolve_dtype
from cts.serving.types import ChatRequest, Message, Sampling


def request(tokens: int) -> ChatRequest:
    return ChatRequest(messages=(Message(role="user", content="x" * tokens),), sampling=Sampling())


def buckets(lengths: list[int]) -> list[list[int]]:
    engine = TransformersEngine("tiny", "/nowhere")
    engine._prompt_ids = lambda r: [0] * len(r.messages[0].content)  # type: ignore[method-assign]
    requests = [request(n) for n in lengths]
    return engine._buckets(requests, list(range(len(lengths))))


def test_prompts_of_similar_length_share_one_generate_call():
    assert buckets([1000, 1010, 990, 1005]) == [[1, 3, 0, 2]]


def test_a_short_prompt_is_not_padded_to_a_long_one():
    # 2,308 / 1,238 / 125 tokens, as three quickstart roles arrived together: padded to 2,308
    # each, the 125-token question cost 2,308; split, the padding stays within the slack.
    assert buckets([125, 2308, 1238]) == [[1], [2], [0]]
    assert buckets([1507, 1013, 975, 1101, 138, 132]) == [[0, 3, 1], [2], [4, 5]]
    for bucket in buckets([1507, 1013, 975, 1101, 138, 132, 700, 20]):
        lengths = [[1507, 1013, 975, 1101, 138, 132, 700, 20][i] for i in bucket]
        assert max(lengths) * len(lengths) <= te.PADDING_SLACK * sum(lengths)


def test_one_request_is_one_bucket():
    assert buckets([50]) == [[0]]


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_is_bfloat16_only_where_it_is_native(monkeypatch, native, expected):
    monkeypatch.setattr(te, "native_bf16", lambda: native)
    assert resolve_dtype("auto") == expected
    assert resolve_dtype("float16") == "float16"  # an explicit dtype is kept
