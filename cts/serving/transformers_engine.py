"""In-process Hugging Face model; constraints through outlines_core; concurrent requests batched.

Requests from many coroutines go into one queue; a worker drains it, groups requests that share
sampling settings and runs each group as one left-padded `generate` call in a thread. Each row
carries its own constraint (cts/serving/constrained.py: so one batch can mix JSON, choice, regex and
free text) and its own stop rule (max_tokens, stop strings). Every engine of the process takes
its turn for a load or a generate (`_Turns`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, Unpack

from cts.serving.batching import BatchingEngine, Checkpoint, weights_fingerprint
from cts.serving.constrained import RowGuide, output_regex, row_rules, vocabulary
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, ChatResponse, OutputSpec, Sampling, Usage

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
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


class _Turns:
    """One in-process model call at a time in the whole process — a load or a generate() — in
    the order they were asked for.

    Three kinds of process-wide state make calls from several threads at once unsafe:
    - `from_pretrained` and peft's merge set torch's default dtype, the meta device a model is
      built on and patched module methods while they run: loads that overlapped another load
      or a generation failed ("Cannot copy out of meta tensor", "float != BFloat16");
    - transformers' Llama attention keeps per-forward state (through the `kernels` package)
      in a variable that turns process-wide while any thread compiles (cts/serving/constrained.py):
      two forwards in two threads then corrupt it;
    - a seeded request seeds torch's one global generator and samples from it: another
      thread's seed or draw in between would make a sampled answer depend on timing.
    Turns are handed out first come, first served, so a busy engine cannot hold another back.
    On a CPU, generations side by side only shared the same cores.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._changed:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._changed.wait_for(lambda: self._serving == ticket)
        try:
            yield
        finally:
            with self._changed:
                self._serving += 1
                self._changed.notify_all()

    @property
    def waiting(self) -> int:
        """Calls asked for and not yet finished (the one running included)."""
        with self._changed:
            return self._next_ticket - self._serving


_TURNS = _Turns()


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
        self._vocabulary: Any = None
        #: Compiled output constraints by regex. The engine's own, so that they go with it: a
        #: cache on the class (functools.lru_cache on the method) held every engine a process
        #: ever built, and its weights, until the process ended.
        self._indexes: dict[str, Any] = {}

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Load weights and tokenizer (idempotent; runs in the worker thread on first use)."""
        if self._hf is not None:
            return  # loaded: no lock, so that a batch never waits on another model's load
        with _TURNS.turn(), self._load_lock:
            if self._hf is not None:
                return
            import torch
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
            self._vocabulary = vocabulary(tokenizer)
            self._tokenizer = tokenizer
            self._hf = hf

    def _index(self, regex: str) -> Any:
        from outlines_core import Index

        if regex not in self._indexes:
            if len(self._indexes) >= _MAX_INDEXES:  # the oldest goes first
                del self._indexes[next(iter(self._indexes))]
            self._indexes[regex] = Index(regex, self._vocabulary)
        return self._indexes[regex]

    def _processor(self, spec: OutputSpec | None) -> Any:
        if spec is None:
            return None
        try:
            index = self._index(output_regex(spec))
        except Exception as e:  # outlines_core raises plain ValueErrors for unsupported regex
            raise EngineError(f"{self.model}: cannot compile output constraint: {e}") from e
        return RowGuide(index)

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
        with _TURNS.turn(), torch.inference_mode():
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
