"""Constrained decoding for in-process generation: an output spec as a regex, a tokenizer's
vocabulary as outlines_core sees it, and the per-row rules of one batched `generate()` call.

The mask is applied by `RowGuide`, in plain eager torch, and never by outlines' own logits
processor: that one masks through a `torch.compile`d kernel, compiled on the first constrained
token a process generates. While a compile runs, `torch.compiler.is_compiling()` is true in
*every* thread, and transformers' Llama attention (through the `kernels` package) then keeps its
per-forward state in a process-wide variable instead of a context variable: two engines
generating in other threads at that moment corrupted it, and their requests failed with
"TypeError: expected an instance of Token" (docs/architecture.md, "In-process engines").
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Collection
from typing import Any

from cts.serving.types import ChoiceOutput, JsonSchemaOutput, OutputSpec, RegexOutput

_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    shifted = 0
    alphabet = {chr(b): b for b in printable}
    for b in range(256):
        if b not in printable:
            alphabet[chr(256 + shifted)] = b
            shifted += 1
    return alphabet


def token_bytes(
    vocab: dict[str, int], special: Collection[str], added: Collection[str] = ()
) -> dict[bytes, list[int]]:
    """Each ordinary token's bytes → its ids. outlines turns tokens into *strings*, so every
    token holding part of a UTF-8 character becomes "�" and many CJK characters can then never
    be generated: a span grammar over a Chinese query with "，" between two characters fails
    to compile. Byte-level BPE (GPT-2, Qwen, Llama-3, SmolLM) maps through its byte alphabet;
    SentencePiece through `▁` and its `<0xNN>` byte tokens. Tokens added to the tokenizer are
    plain text; special tokens are left out: no constrained answer needs them."""
    alphabet = _byte_level_alphabet()
    ordinary = {t: i for t, i in vocab.items() if t not in special}
    byte_level = all(ch in alphabet for t in ordinary if t not in added for ch in t)
    found: dict[bytes, list[int]] = {}
    for token, token_id in ordinary.items():
        if token in added:
            data = token.encode()
        elif byte_level:
            data = bytes(alphabet[ch] for ch in token)
        elif match := _SENTENCEPIECE_BYTE.fullmatch(token):
            data = bytes([int(match.group(1), 16)])
        else:
            data = token.replace("▁", " ").encode()
        found.setdefault(data, []).append(token_id)
    return found


def vocabulary(tokenizer: Any) -> Any:
    """outlines_core's vocabulary of a Hugging Face tokenizer: what an `Index` compiles a regex
    against (in the transformers engine, and for the clarifier's rollouts in cts/train/grpo.py)."""
    from outlines_core import Vocabulary

    return Vocabulary(
        tokenizer.eos_token_id,
        token_bytes(
            tokenizer.get_vocab(),
            set(tokenizer.all_special_tokens),
            set(tokenizer.get_added_vocab()),
        ),
    )


def output_regex(spec: OutputSpec) -> str:
    """The regex outlines compiles for a spec (JSON schemas go through outlines_core)."""
    if isinstance(spec, RegexOutput):
        return spec.pattern
    if isinstance(spec, ChoiceOutput):
        return "(" + "|".join(re.escape(c) for c in spec.choices) + ")"
    if isinstance(spec, JsonSchemaOutput):
        from outlines_core.json_schema import build_regex_from_schema

        # Compact whitespace: the tiny model otherwise pads JSON with runs of newlines.
        regex = build_regex_from_schema(json.dumps(spec.json_schema), r"[ ]?")
        # outlines_core leaves digit runs unbounded and a small model can loop on digits until
        # max_tokens (invalid JSON). Capping them keeps every answer inside the schema.
        return regex.replace("[0-9]*", "[0-9]{0,15}").replace("[0-9]+", "[0-9]{1,15}")
    raise TypeError(f"unknown output spec {spec!r}")


class RowGuide:
    """One row's constraint: an outlines_core `Guide` over a compiled `Index`, advanced by the
    token the row chose last, masking every token the guide does not allow next. Called with
    the row's ids `(1, length)` and logits `(1, vocab)`; changes the logits in place."""

    def __init__(self, index: Any) -> None:
        from outlines_core import Guide

        self.guide = Guide(index)
        self._started = False
        self._bitmask: Any = None
        self._shifts: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if not self._started:  # the first token: nothing generated yet to advance by
            self._started = True
            words = (scores.shape[1] + 31) // 32
            self._bitmask = torch.zeros((1, words), dtype=torch.int32)
            self._shifts = torch.arange(32, dtype=torch.int32)
        else:
            last = int(input_ids[0, -1])
            # As outlines does: a finished guide advances only by a token it accepts (its
            # end of sequence), so that a row's trailing padding leaves it where it is.
            if not self.guide.is_finished() or self.guide.accepts_tokens([last]):
                self.guide.advance(token_id=last, return_tokens=False)
        mask = self._bitmask
        self.guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
        allowed = ((mask.unsqueeze(-1) >> self._shifts) & 1).bool().view(1, -1)
        allowed = allowed[:, : scores.shape[1]].to(scores.device)
        return scores.masked_fill_(~allowed, -torch.inf)


def row_rules(
    tok: Any,
    processors: list[Any],
    prompt_len: int,
    limits: list[int],
    stops: list[tuple[str, ...]],
    abandon: threading.Event | None = None,
) -> tuple[Any, Any]:
    """The per-row constraint (a logits processor) and stop rule (a stopping criterion) of one
    batched generate(). They share `done`: once RowStops finishes a row, RowConstraints leaves
    it alone. Once `abandon` is set, every row stops at the next token."""
    import torch
    from transformers import LogitsProcessor, StoppingCriteria

    done = [False] * len(limits)

    class RowConstraints(LogitsProcessor):
        """One processor (`RowGuide`) per row; finished rows are left alone."""

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            for i, proc in enumerate(processors):
                if proc is not None and not done[i]:
                    scores[i : i + 1] = proc(input_ids[i : i + 1], scores[i : i + 1])
            return scores

    class RowStops(StoppingCriteria):
        """Per-row max_tokens and stop strings (HF's own rules are batch-wide)."""

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            generated = input_ids[:, prompt_len:]
            if abandon is not None and abandon.is_set():
                # Nobody waits for these rows any more: the engine is closing.
                return torch.ones(len(limits), dtype=torch.bool, device=input_ids.device)
            flags = []
            for i in range(len(limits)):
                if not done[i]:
                    n = generated.shape[1]
                    hit_stop = bool(stops[i]) and any(
                        s in tok.decode(generated[i, -16:]) for s in stops[i]
                    )
                    done[i] = n >= limits[i] or hit_stop
                flags.append(done[i])
            return torch.tensor(flags, dtype=torch.bool, device=input_ids.device)

    return RowConstraints(), RowStops()
