"""In-process Hugging Face model; constraints through outlines; concurrent requests batched.

Requests from many coroutines go into one queue; a worker drains it, groups requests that share
sampling settings and runs each group as one left-padded `generate` call in a thread. Each row
carries its own outlines logits processor (so one batch can mix JSON, choice, regex and free
text) and its own stop rule (max_tokens, stop strings).
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any, Literal, Unpack

from serving.batching import BatchingEngine, Checkpoint, weights_fingerprint
from serving.errors import EngineError
from serving.types import (
    ChatRequest,
    ChatResponse,
    ChoiceOutput,
    JsonSchemaOutput,
    OutputSpec,
    RegexOutput,
    Sampling,
    Usage,
)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
#: Compiled output constraints an engine keeps (a run's roles use a few dozen schemas).
_MAX_INDEXES = 512


def native_bf16() -> bool:
    """Whether bfloat16 runs natively here: a CUDA GPU, or a CPU with AVX512-BF16 or AMX. A CPU
    without them emulates it: measured on a 2-core AVX2 EPYC, a 4 x 1,000-token prefill of the
    tiny model took 83 s in bfloat16 against 13 s in float32."""
    import torch

    if torch.cuda.is_available():
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = {flag for line in f if line.startswith("flags") for flag in line.split()}
    except OSError:  # not Linux: no way to tell, so the safe choice
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str) -> str:
    """`auto`: bfloat16 where it is native (`native_bf16`), float32 elsewhere."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16() else "float32"


#: A batch's padded prompt tokens may exceed its real ones by this factor (see `_buckets`).
PADDING_SLACK = 1.25


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
    against (here, and for the clarifier's rollouts in train/grpo.py)."""
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


def with_adapter(hf: Any, adapter: str) -> Any:
    """`hf` with the LoRA adapter at `adapter` merged into its weights (peft, the `train`
    extra, is needed only here)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise EngineError(
            f"adapter {adapter}: applying a LoRA adapter needs peft: "
            'pip install "clarify-then-search[train]"'
        ) from None
    with warnings.catch_warnings():
        # Two warnings on every load that say nothing to a user: peft asks transformers a
        # deprecated question, and merging unties the output head from the embeddings (which
        # no adapter here touches).
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        warnings.filterwarnings("ignore", "Input and output embeddings are no longer tied")
        return PeftModel.from_pretrained(hf, adapter).merge_and_unload()


class _LoadGate:
    """Loads one at a time and never beside a generation; generations together.

    `from_pretrained` and peft's merge set process-wide state while they run (torch's default
    dtype, the meta device a model is built on, patched module methods): in the quickstart,
    whose searcher, User Answerer and Rewriter are adapted copies of the tiny model, an engine
    loading in its worker thread while another loaded or generated failed those requests
    ("Cannot copy out of meta tensor", "float != BFloat16", "expected an instance of Token").
    A load waits for the generations running to end, and generations wait for a load; a load
    waiting goes first, so that a busy engine cannot hold another's load back forever.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generating = 0
        self._loading = False
        self._loads_waiting = 0

    @contextmanager
    def loading(self) -> Iterator[None]:
        with self._changed:
            self._loads_waiting += 1
            self._changed.wait_for(lambda: not self._loading and not self._generating)
            self._loads_waiting -= 1
            self._loading = True
        try:
            yield
        finally:
            with self._changed:
                self._loading = False
                self._changed.notify_all()

    @contextmanager
    def generating(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._loading and not self._loads_waiting)
            self._generating += 1
        try:
            yield
        finally:
            with self._changed:
                self._generating -= 1
                self._changed.notify_all()


_GATE = _LoadGate()


class TransformersEngine(BatchingEngine):
    kind = "transformers"

    def __init__(
        self,
        model: str,
        path: str,
        *,
        threads: int | None = None,
        adapter: str | None = None,
        **checkpoint: Unpack[Checkpoint],
    ) -> None:
        super().__init__(model, path, **checkpoint)
        self.threads = threads
        #: A peft LoRA adapter directory merged into the weights at load; it is part of the
        #: engine's identity, so the response cache never answers it with the base's replies.
        self.adapter = adapter
        if adapter is not None:
            self.identity += f"+lora:{weights_fingerprint(adapter)}"
        self._hf: Any = None
        self._tokenizer: Any = None
        self._backend: Any = None
        #: Compiled output constraints by regex. The engine's own, so that they go with it: a
        #: cache on the class (functools.lru_cache on the method) held every engine a process
        #: ever built, and its weights, until the process ended.
        self._indexes: dict[str, Any] = {}

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Load weights and tokenizer (idempotent; runs in the worker thread on first use)."""
        if self._hf is not None:
            return  # loaded: no lock, so that a batch never waits on another model's load
        with _GATE.loading(), self._load_lock:
            if self._hf is not None:
                return
            import outlines
            import torch
            from outlines.backends.outlines_core import OutlinesCoreBackend
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.threads:
                torch.set_num_threads(self.threads)
            tokenizer: Any = AutoTokenizer.from_pretrained(self.path, revision=self.revision)
            tokenizer.padding_side = "left"
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            dtype = getattr(torch, _DTYPES.get(resolve_dtype(self.dtype), "float32"))
            hf = AutoModelForCausalLM.from_pretrained(
                self.path, revision=self.revision, dtype=dtype
            )
            if self.adapter is not None:
                hf = with_adapter(hf, self.adapter)
            hf.eval()
            self._backend = OutlinesCoreBackend(outlines.from_transformers(hf, tokenizer))
            self._backend.vocabulary = vocabulary(tokenizer)
            self._tokenizer = tokenizer
            self._hf = hf

    def _index(self, regex: str) -> Any:
        from outlines_core import Index

        if regex not in self._indexes:
            if len(self._indexes) >= _MAX_INDEXES:  # the oldest goes first
                del self._indexes[next(iter(self._indexes))]
            self._indexes[regex] = Index(regex, self._backend.vocabulary)
        return self._indexes[regex]

    def _processor(self, spec: OutputSpec | None) -> Any:
        if spec is None:
            return None
        from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor

        try:
            index = self._index(output_regex(spec))
        except Exception as e:  # outlines_core raises plain ValueErrors for unsupported regex
            raise EngineError(f"{self.model}: cannot compile output constraint: {e}") from e
        return OutlinesCoreLogitsProcessor(index, "torch")

    def _run_batch(self, requests: list[ChatRequest]) -> list[ChatResponse | EngineError]:
        self.load()
        results: list[ChatResponse | EngineError | None] = [None] * len(requests)
        # A constraint that does not compile fails its own request, not the batch.
        processors: dict[int, Any] = {}
        for i, r in enumerate(requests):
            try:
                processors[i] = self._processor(r.output)
            except EngineError as e:
                results[i] = e
        # One generate() call can only use one sampling setting: group by it.
        groups: dict[tuple[object, ...], list[int]] = {}
        for i in processors:
            s = requests[i].sampling
            groups.setdefault((s.temperature, s.top_p, s.repetition_penalty, s.seed), []).append(i)
        for indices in groups.values():
            for bucket in self._buckets(requests, indices):
                rows = [(requests[i], processors[i]) for i in bucket]
                for i, response in zip(bucket, self._generate(rows), strict=True):
                    results[i] = response
        return [r for r in results if r is not None]  # every slot is filled by now

    def _buckets(self, requests: list[ChatRequest], indices: list[int]) -> list[list[int]]:
        """`indices` split into generate() calls of similar prompt lengths. A batch is padded to
        its longest prompt, and on a CPU the prefill of padding costs as much as real tokens: a
        searcher turn of 2,300 tokens batched with a 125-token clarifier question made that
        question cost 2,300. Longest first; a bucket takes the next prompt while its padded
        tokens stay within PADDING_SLACK of its real ones."""
        if len(indices) < 2:
            return [indices]
        lengths = {i: len(self._prompt_ids(requests[i])) for i in indices}
        buckets: list[list[int]] = []
        for i in sorted(indices, key=lambda i: -lengths[i]):
            if buckets:
                bucket = buckets[-1]
                longest = lengths[bucket[0]]
                real = sum(lengths[j] for j in bucket) + lengths[i]
                if longest * (len(bucket) + 1) <= PADDING_SLACK * real:
                    bucket.append(i)
                    continue
            buckets.append([i])
        return buckets

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        tok = self._tokenizer
        text = tok.apply_chat_template(
            [m.model_dump() for m in request.messages],
            tokenize=False,
            add_generation_prompt=True,
            **self.chat_template_kwargs,
        )
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # -- the batched generate call ---------------------------------------------------------------

    def _generate(self, batch: list[tuple[ChatRequest, Any]]) -> list[ChatResponse]:
        """One left-padded generate() over requests that share sampling settings."""
        import torch
        from transformers import LogitsProcessorList

        tok = self._tokenizer
        rows = [request for request, _ in batch]
        started = time.perf_counter()
        enc = self._encode(rows)
        prompt_len = enc["input_ids"].shape[1]
        limits = [p.sampling.max_tokens for p in rows]
        constraints, stops = row_rules(
            tok,
            [processor for _, processor in batch],
            prompt_len,
            limits,
            [p.sampling.stop for p in rows],
            self.closing,
        )
        s = rows[0].sampling
        kwargs: dict[str, Any] = {
            "max_new_tokens": max(limits),
            "logits_processor": LogitsProcessorList([constraints]),
            "stopping_criteria": [stops],
            "pad_token_id": tok.pad_token_id,
            **_sampling_kwargs(s),
        }
        with _GATE.generating(), torch.inference_mode():
            if s.seed is not None:
                torch.manual_seed(s.seed)
            out = self._hf.generate(**enc, **kwargs)
        latency = time.perf_counter() - started
        return [
            self._response(
                out[i, prompt_len:].tolist(),
                int(enc["attention_mask"][i].sum()),
                limits[i],
                p.sampling.stop,
                latency,
            )
            for i, p in enumerate(rows)
        ]

    def _encode(self, rows: list[ChatRequest]) -> Any:
        """The requests' chat prompts, tokenized and left-padded to one length."""
        tok = self._tokenizer
        prompts = [
            tok.apply_chat_template(
                [m.model_dump() for m in p.messages],
                tokenize=False,
                add_generation_prompt=True,
                **self.chat_template_kwargs,
            )
            for p in rows
        ]
        return tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

    def _response(
        self, ids: list[int], n_prompt: int, limit: int, stop: tuple[str, ...], latency: float
    ) -> ChatResponse:
        """One row's generated ids as a response: cut at its end of sequence, its max_tokens
        and its first stop string."""
        tok = self._tokenizer
        eos = {tok.eos_token_id, tok.pad_token_id}
        # Rows stopped early by RowStops are padded (pad may equal eos) up to the batch end.
        ended = next((j for j, t in enumerate(ids[:limit]) if t in eos), None)
        body = ids[:limit] if ended is None else ids[:ended]
        text = tok.decode(body, skip_special_tokens=True)
        finish: Literal["stop", "length"] = "length" if ended is None else "stop"
        cuts = [text.index(s) for s in stop if s in text]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        completion = len(body) + (1 if ended is not None else 0)
        return ChatResponse(
            text=text,
            finish_reason=finish,
            usage=Usage(prompt_tokens=n_prompt, completion_tokens=completion),
            latency_s=latency,
        )


def _sampling_kwargs(s: Sampling) -> dict[str, Any]:
    """generate()'s sampling arguments: greedy at temperature 0, else nucleus sampling."""
    kwargs: dict[str, Any] = {"do_sample": s.temperature > 0}
    if s.temperature > 0:
        top_k = 0 if s.top_k in (None, -1) else s.top_k  # 0: off, in generate()'s terms
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=top_k)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if s.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = s.repetition_penalty
    return kwargs


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
        """One outlines processor per row; finished rows are left alone."""

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
