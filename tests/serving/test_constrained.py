"""Constrained decoding's parts without a model: the vocabulary's bytes, the row mask, and the
turns every in-process model call takes."""

from __future__ import annotations

import threading

import pytest
import torch

from cts.serving.constrained import RowGuide, token_bytes


def test_token_bytes_of_byte_level_and_sentencepiece_vocabularies():
    # Byte-level BPE: "Ġ" is a space; "ä¸" and "Ń" are the bytes of "中" (e4 b8 ad) split; a
    # token added to the tokenizer is plain text and does not make the rest SentencePiece.
    byte_level = {"Ġthe": 0, "ä¸": 1, "Ń": 2, "<|endoftext|>": 3, "你好": 4}
    assert token_bytes(byte_level, {"<|endoftext|>"}, {"你好"}) == {
        b" the": [0],
        b"\xe4\xb8": [1],
        b"\xad": [2],
        "你好".encode(): [4],
    }
    # SentencePiece: "▁" is a space, <0xNN> a raw byte.
    sentencepiece = {"▁the": 0, "<0xE4>": 1, "中": 2, "</s>": 3}
    assert token_bytes(sentencepiece, {"</s>"}) == {
        b" the": [0],
        b"\xe4": [1],
        "中".encode(): [2],
    }


EOS = 3
#: More logits than tokens, as a model whose embedding is padded past its vocabulary has.
WIDTH = 40


def allowed(scores: torch.Tensor) -> list[int]:
    return [i for i, s in enumerate(scores[0].tolist()) if s != float("-inf")]


def test_a_row_guide_allows_exactly_what_the_regex_allows_next_and_then_only_the_end():
    from outlines_core import Index, Vocabulary

    vocab = Vocabulary(EOS, {b"a": [0], b"b": [1], b"ab": [2], b"c": [4], b"zz": [35]})
    guide = RowGuide(Index("ab?c", vocab))
    ids = torch.tensor([[7, 7]])  # the prompt: nothing generated yet
    seen = []
    for chosen in (0, 4, EOS):  # "a", then "c", then the end
        scores = torch.zeros(1, WIDTH)
        assert guide(ids, scores) is scores  # in place
        seen.append(allowed(scores))
        ids = torch.cat([ids, torch.tensor([[chosen]])], dim=1)
    assert seen == [[0, 2], [1, 4], [EOS]]
    # A finished row padded with more ends stays finished: only the end is allowed.
    scores = torch.zeros(1, WIDTH)
    assert allowed(guide(ids, scores)) == [EOS]


def test_a_row_guide_never_compiles(monkeypatch: pytest.MonkeyPatch):
    """outlines' own processor masks through a torch.compile'd kernel; while it compiled,
    `torch.compiler.is_compiling()` was true in every thread and broke the forwards of two
    engines generating in other threads ("expected an instance of Token")."""
    from outlines_core import Index, Vocabulary

    def no_compile():
        raise AssertionError("a compile session was opened")

    monkeypatch.setattr(torch.compiler, "_compile_session_context", no_compile)
    vocab = Vocabulary(EOS, {b"yes": [0], b"no": [1], b"y": [2], b"e": [4], b"s": [5]})
    guide = RowGuide(Index("(yes|no)", vocab))
    scores = torch.zeros(1, WIDTH)
    assert allowed(guide(torch.tensor([[9]]), scores)) == [0, 1, 2]
    assert not torch.compiler.is_compiling()


def test_model_calls_take_turns_one_at_a_time_first_come_first_served():
    """By the turns' state, not by timing: while one call runs, two more that asked in order
    wait; they then run one after the other, in the order they asked."""
    from cts.serving.transformers_engine import _Turns

    turns, order, inside = _Turns(), [], []

    def call(name: str) -> None:
        with turns.turn():
            inside.append(name)
            order.append((name, len(inside)))  # how many calls were inside at once
            inside.remove(name)

    with turns.turn():
        first = threading.Thread(target=call, args=("first",))
        first.start()
        while turns.waiting < 2:  # "first" has asked (a point of progress)
            threading.Event().wait(0.01)
        second = threading.Thread(target=call, args=("second",))
        second.start()
        while turns.waiting < 3:
            threading.Event().wait(0.01)
        assert order == []  # neither ran beside the call holding its turn
    first.join(timeout=60)
    second.join(timeout=60)
    assert order == [("first", 1), ("second", 1)]
    assert turns.waiting == 0
