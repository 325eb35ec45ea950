"""Engines that run a local checkpoint in-process gather requests from many coroutines into
batches.

Requests go into one queue; a worker drains whatever has accumulated (generation of the previous
batch takes long enough for the next one to build up) and runs it as one call in a thread, so the
event loop stays free for the rest of the pipeline.

Batching moves greedy decoding: a prompt padded beside others, in a matrix of another shape, gets
logits that differ in the last bits, and now and then another token wins (the tiny judge changed
2 of 48 labels between two readings of the same answers). `Unbatched` is a view of an engine
whose requests each run alone, in a generate call of their own, so that an answer depends on its
request only: what `judge.deterministic` gives the judge.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import json
import threading
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypedDict, Unpack

from cts.serving.engine import Engine, Wrapped
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, ChatResponse


def weights_fingerprint(path: str) -> str:
    """Cheap identity of a local checkpoint (config + weight file names, sizes, mtimes)."""
    root = Path(path)
    if not root.is_dir():
        return path  # a hub id: the revision in the model config pins it
    h = hashlib.sha256()
    for p in sorted(root.iterdir()):
        if p.suffix in {".json", ".safetensors", ".bin", ".jinja", ".model"}:
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def settings_digest(settings: Mapping[str, Any]) -> str:
    """A short digest of settings that change a model's answers (the chat template's options,
    a server's flags), for engine identities: the same settings give the same digest in every
    process and run; keys in any order."""
    text = json.dumps(settings, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Set while `Unbatched` sends a request: the request is queued to run alone.
_ALONE: ContextVar[bool] = ContextVar("cts_unbatched", default=False)

_Queued = tuple[ChatRequest, "asyncio.Future[ChatResponse]", bool]


class Checkpoint(TypedDict, total=False):
    """How a local checkpoint is loaded and prompted: what every in-process engine takes beside
    its model name and path (an engine kind's own defaults fill what is left out)."""

    dtype: str
    revision: str | None
    chat_template_kwargs: dict[str, Any] | None
    #: Most requests handed to one `_run_batch` call.
    max_batch_size: int


class BatchingEngine(Engine):
    #: Names the engine kind in cache identities.
    kind: str
    #: The engine kind's defaults for what `Checkpoint` leaves out.
    default_dtype: str = "float32"
    default_max_batch_size: int = 8

    def __init__(self, model: str, path: str, **checkpoint: Unpack[Checkpoint]) -> None:
        super().__init__()
        self.model = model
        self.path = path
        self.dtype = dtype = checkpoint.get("dtype", self.default_dtype)
        self.revision = revision = checkpoint.get("revision")
        self.chat_template_kwargs = checkpoint.get("chat_template_kwargs") or {}
        self.max_batch_size = checkpoint.get("max_batch_size", self.default_max_batch_size)
        self.identity = (
            f"{self.kind}:{model}:{path}@{revision or weights_fingerprint(path)}:{dtype}"
        )
        if self.chat_template_kwargs:
            # Options such as Qwen3's enable_thinking change the prompt, hence the answer; an
            # engine without them keeps the identity it always had.
            self.identity += f"+template:{settings_digest(self.chat_template_kwargs)}"
        self._load_lock = threading.Lock()
        #: Set by `aclose`: a batch still generating in the worker thread stops at its next
        #: step (its results are dropped), so a stopped run does not wait minutes for it
        #: before the process can exit.
        self.closing = threading.Event()
        self._queue: asyncio.Queue[_Queued] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Number of batch calls and the requests they carried (batching diagnostics).
        self.batches = 0
        self.batched_requests = 0
        #: Of those, the requests `Unbatched` sent, each in a batch of its own.
        self.unbatched_requests = 0

    @abc.abstractmethod
    def _run_batch(self, requests: list[ChatRequest]) -> list[ChatResponse | EngineError]:
        """Run a batch (called in a worker thread): one response, or the error that concerns
        only that request, per request, in order. Raising fails the whole batch."""

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            # A worker belongs to one event loop; a new loop (a new asyncio.run) gets its own.
            self._loop = loop
            self.closing.clear()
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._drain(self._queue))
        future: asyncio.Future[ChatResponse] = loop.create_future()
        await self._queue.put((request, future, _ALONE.get()))
        return await future

    async def _drain(self, queue: asyncio.Queue[_Queued]) -> None:
        while True:
            batch = [await queue.get()]
            await asyncio.sleep(0)  # let coroutines scheduled in the same tick enqueue too
            while not queue.empty() and len(batch) < self.max_batch_size:
                batch.append(queue.get_nowait())
            live = [(r, f, alone) for r, f, alone in batch if not f.cancelled()]
            # The requests sent unbatched run one by one, the others together.
            together = [(r, f) for r, f, alone in live if not alone]
            parts = [[(r, f)] for r, f, alone in live if alone]
            for part in [together, *parts] if together else parts:
                await self._run(part, alone=part is not together)

    async def _run(
        self, live: list[tuple[ChatRequest, asyncio.Future[ChatResponse]]], alone: bool
    ) -> None:
        """One `_run_batch` call in the worker thread; each request's future gets its result."""
        try:
            results = await asyncio.to_thread(self._run_batch, [r for r, _ in live])
        except Exception as e:
            error = (
                e
                if isinstance(e, EngineError)
                else EngineError(f"{self.model}: generation failed: {type(e).__name__}: {e}")
            )
            for _, f in live:
                if not f.done():
                    f.set_exception(error)
            return
        self.batches += 1
        self.batched_requests += len(live)
        self.unbatched_requests += len(live) if alone else 0
        for (_, f), result in zip(live, results, strict=True):
            if f.done():
                continue
            if isinstance(result, EngineError):
                f.set_exception(result)
            else:
                f.set_result(result)

    async def aclose(self) -> None:
        self.closing.set()
        if self._worker is not None:
            self._worker.cancel()
        self._worker = self._queue = self._loop = None


class Unbatched(Wrapped):
    """`engine` with every request run alone: its answer then depends on the request only, not
    on what else was queued with it (see the module's docstring). Its identity is the engine's
    marked `+unbatched`, so that the response cache never mixes its answers with batched ones;
    calls count in the engine's stats."""

    def __init__(self, engine: BatchingEngine) -> None:
        super().__init__(engine)
        self.identity = f"{engine.identity}+unbatched"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        token = _ALONE.set(True)
        try:
            return await self.inner.chat(request)
        finally:
            _ALONE.reset(token)

    async def aclose(self) -> None:
        """Nothing of its own: the engine is closed by whoever built it."""
