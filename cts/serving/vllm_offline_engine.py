"""In-process `vllm.LLM` for GPU boxes. vLLM is imported only when this engine is built."""

from __future__ import annotations

import time
from typing import Any, Unpack

from cts.serving.batching import BatchingEngine, Checkpoint
from cts.serving.errors import EngineError
from cts.serving.types import (
    ChatRequest,
    ChatResponse,
    ChoiceOutput,
    JsonSchemaOutput,
    RegexOutput,
    Usage,
)


class VllmOfflineEngine(BatchingEngine):
    kind = "vllm-offline"
    default_dtype = "auto"
    default_max_batch_size = 256

    def __init__(
        self,
        model: str,
        path: str,
        *,
        llm_kwargs: dict[str, Any] | None = None,
        **checkpoint: Unpack[Checkpoint],
    ) -> None:
        super().__init__(model, path, **checkpoint)
        self.llm_kwargs = llm_kwargs or {}
        self._llm: Any = None

    def load(self) -> None:
        with self._load_lock:
            if self._llm is not None:
                return
            try:
                from vllm import LLM
            except ImportError as e:
                raise EngineError(
                    f"{self.model}: engine 'vllm-offline' needs vLLM "
                    "(pip install 'clarify-then-search[vllm]')"
                ) from e
            self._llm = LLM(
                model=self.path,
                served_model_name=self.model,
                dtype=self.dtype,
                revision=self.revision,
                **self.llm_kwargs,
            )

    def _sampling_params(self, request: ChatRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        s = request.sampling
        structured = None
        spec = request.output
        if isinstance(spec, JsonSchemaOutput):
            structured = StructuredOutputsParams(json=spec.json_schema)
        elif isinstance(spec, ChoiceOutput):
            structured = StructuredOutputsParams(choice=list(spec.choices))
        elif isinstance(spec, RegexOutput):
            structured = StructuredOutputsParams(regex=spec.pattern)
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            seed=s.seed,
            stop=list(s.stop) or None,
            repetition_penalty=s.repetition_penalty,
            structured_outputs=structured,
            **({"top_k": s.top_k} if s.top_k is not None else {}),
        )

    def _run_batch(self, requests: list[ChatRequest]) -> list[ChatResponse | EngineError]:
        self.load()
        started = time.perf_counter()
        outputs = self._llm.chat(
            [[m.model_dump() for m in r.messages] for r in requests],
            sampling_params=[self._sampling_params(r) for r in requests],
            use_tqdm=False,
            chat_template_kwargs=self.chat_template_kwargs or None,
        )
        latency = time.perf_counter() - started
        responses: list[ChatResponse | EngineError] = []
        for out in outputs:
            completion = out.outputs[0]
            responses.append(
                ChatResponse(
                    text=completion.text,
                    finish_reason="length" if completion.finish_reason == "length" else "stop",
                    usage=Usage(
                        prompt_tokens=len(out.prompt_token_ids or []),
                        completion_tokens=len(completion.token_ids),
                    ),
                    latency_s=latency,
                )
            )
        return responses
