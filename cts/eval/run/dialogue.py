"""The clarification dialogue of one (instance, seed): Clarifier question → User Answerer answer
→ question types, turn after turn.

In `sequential` mode (the study's protocol) one dialogue of k_max turns is run per (instance,
seed) and clarify@j takes its first j turns, so clarify@k extends clarify@(k−1) by
construction: "one more question" is never confounded with re-sampling the earlier ones, with
or without the response cache. The dialogue is appended to RUN_DIR/dialogues/ as soon as it
ends, so a resumed run (or a retried failure) continues it rather than asking again; a dialogue
asked by other models, sampling or options is never re-used. Each line also keeps the model
calls asked since the dialogue's line before it (`LineUsage`), so that every call of a
dialogue is on exactly one line, whichever key took its turns and whether or not that key was
ever recorded: `cts estimate` counts a dialogue's cost from here.
`all_at_once` asks the k questions of each clarify@k in one call, a dialogue of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ValidationError

from cts.agents import clarifier, user_answerer
from cts.agents.question_type import classify, classify_with_model
from cts.agents.types import QA
from cts.agents.user_answerer import SpanLimits, unsupported_words
from cts.eval.data.schema import Instance
from cts.eval.run.config_sections import ClarificationConfig
from cts.eval.run.slots import released
from cts.eval.run.usage import KeyUsage, charge, charged_to_key
from cts.foundation.disk import append_line
from cts.foundation.secrets import redact
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.types import Sampling
from cts.webdancer.tool_cache import ToolCacheMiss


class Turn(BaseModel):
    question: str
    answer: str
    #: Every type the question asks about (diagnostics).
    question_types: list[str] = []
    #: Abstractive User Answerer only: content words of the answer not in the fused query.
    unsupported_words: list[str] | None = None

    @property
    def qa(self) -> QA:
        return QA(question=self.question, answer=self.answer)


class Asked(NamedTuple):
    """clarify@k's view of a dialogue."""

    turns: list[Turn]
    #: The Clarifier stopped before k questions (only with `allow_stop`) ...
    stopped: bool
    #: ... writing this question beside its stop (what a fine-tuned clarifier learns to output).
    stop_question: str
    #: What kept the dialogue from k turns (None when turns k and below all succeeded).
    error: dict[str, str] | None


class LineUsage(BaseModel):
    """The model calls one dialogue line stands for: those asked since the dialogue's line
    before it, in the process that wrote it."""

    #: The turn they were asked for: n on a line that saves turn n; the turn being asked on a
    #: line that ends the dialogue short of it (a stop, a failure) or that the run's stop cut.
    turn: int
    #: Per role, as a record's `usage` keeps them (cts/eval/run/usage.py `KeyUsage.fields`).
    roles: dict[str, int] = {}


class Dialogue(BaseModel):
    instance_id: str
    seed: int
    #: What asked and answered (models, sampling, options): a dialogue is continued only by
    #: the same, never mixed into a run with another clarifier.
    fingerprint: str = ""
    turns: list[Turn] = []
    #: The Clarifier chose to stop after these turns (only with `allow_stop`) ...
    stopped: bool = False
    #: ... and wrote this question beside its `stop: true` (sequential mode).
    stop_question: str = ""
    #: {kind, stage, message} when the turn after the last one failed.
    error: dict[str, str] | None = None
    #: What this line asked (None: a line written before dialogues recorded it).
    usage: LineUsage | None = None

    def done(self, k: int) -> bool:
        """Whether nothing more can be asked for a k-turn condition."""
        return self.stopped or len(self.turns) >= k

    def first(self, k: int) -> Asked:
        """clarify@k's view: its turns, whether (and with what question) the Clarifier stopped
        before k questions, and the error that kept it from k turns."""
        stopped = self.stopped and len(self.turns) < k
        failed = self.error if not self.done(k) else None
        return Asked(self.turns[:k], stopped, self.stop_question if stopped else "", failed)


def _progress(dialogue: Dialogue) -> tuple[int, bool]:
    return len(dialogue.turns), dialogue.stopped or dialogue.error is None


class DialogueFileError(ValueError):
    """A complete line of a dialogues file is not a dialogue (file:line: why)."""


def read_lines(root: Path) -> Iterator[Dialogue]:
    """Every complete line of the dialogue files in `root` (RUN_DIR/dialogues), file by file
    in name order; a torn last line is skipped, any other bad line is a DialogueFileError."""
    for path in sorted(root.glob("*.jsonl")):
        for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            if not line.endswith(b"\n"):
                break
            try:
                yield Dialogue.model_validate_json(line)
            except ValidationError as e:
                # Worded as records.parse_jsonl words a bad records line (the runner imports this
                # module through the pipeline: it cannot be imported here).
                problem = e.errors()[0]
                where = ".".join(str(x) for x in problem["loc"])
                raise DialogueFileError(
                    f"{path}:{n}: {where + ': ' if where else ''}{problem['msg']} — not a "
                    "dialogue; fix or remove the line, then run again"
                ) from None


def asked_per_dialogue(root: Path) -> dict[tuple[str, int], list[LineUsage | None]]:
    """Per (instance, seed), what each line of its dialogue in `root` asked (None for a line
    written before lines recorded it). Each call is on one line only, so the lines' sum is all
    the dialogue cost in that run directory, resumes and cut turns included."""
    found: dict[tuple[str, int], list[LineUsage | None]] = {}
    for dialogue in read_lines(root):
        found.setdefault((dialogue.instance_id, dialogue.seed), []).append(dialogue.usage)
    return found


class DialogueStore:
    """RUN_DIR/dialogues/<shard>.jsonl, appended with fsync as each dialogue ends. A torn last
    line (a crash mid-write) is ignored on reading and cut off before the next append."""

    def __init__(self, root: Path, shard_name: str) -> None:
        self.root = root
        self.path = root / f"{shard_name}.jsonl"
        self._lock = threading.Lock()
        self._appended = False

    def load(self, fingerprint: str) -> dict[tuple[str, int], Dialogue]:
        """The furthest dialogue of each (instance, seed) asked with `fingerprint`: most turns,
        then one that ended (stopped, or without an error), then the later line."""
        found: dict[tuple[str, int], Dialogue] = {}
        for dialogue in read_lines(self.root):
            if dialogue.fingerprint != fingerprint:
                continue
            key = (dialogue.instance_id, dialogue.seed)
            if key not in found or _progress(dialogue) >= _progress(found[key]):
                found[key] = dialogue
        return found

    def append(self, dialogue: Dialogue) -> None:
        line = dialogue.model_dump_json() + "\n"
        with self._lock:
            if not self._appended and self.path.is_file():
                # Only a crash before this process can have left a torn last line: cut it off,
                # so that the next line does not complete it into a corrupt one.
                data = self.path.read_bytes()
                if data and not data.endswith(b"\n"):
                    with self.path.open("r+b") as f:
                        f.truncate(data.rfind(b"\n") + 1)
            self._appended = True
            # A full disk raises StorageFull (the run stops) and leaves no torn line.
            append_line(self.path, line.encode())


class _Shared:
    """A sequential dialogue being asked for the clarify@k keys of one (instance, seed)."""

    def __init__(self, dialogue: Dialogue) -> None:
        #: Grows turn by turn; a clarify@j key reads its first j turns once they are there.
        self.dialogue = dialogue
        self.task: asyncio.Task[Dialogue] | None = None
        #: Set (and replaced) at each new turn and at the end.
        self.changed = asyncio.Event()
        #: What each turn asked in this process cost, by turn number, until a key takes it.
        self.usage: dict[int, KeyUsage] = {}
        #: The turn being asked and its cost, until a line of the dialogue file keeps them.
        self.unsaved: tuple[int, KeyUsage] | None = None

    def ready(self, k: int) -> bool:
        return self.dialogue.done(k) or (self.task is not None and self.task.done())

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    finished = wake

    def take_usage(self, k: int) -> KeyUsage:
        """The cost of turns 1..k not yet charged to a key (the failed turn after them too):
        the first key to use a turn pays for it."""
        taken = KeyUsage()
        for turn in sorted(t for t in self.usage if t <= k):
            taken.add(self.usage.pop(turn))
        return taken


class Clarification:
    """Runs (and, in sequential mode, shares and persists) the clarification dialogues of a run.

    `roles` holds the clarifier, user_answerer and (for `question_types: llm`) the
    question_classifier; `sampling` their sampling; each request is seeded with the key's seed.
    """

    def __init__(
        self,
        roles: dict[str, ChatModel],
        sampling: dict[str, Sampling],
        options: ClarificationConfig | None = None,
        k_max: int = 3,
        store: DialogueStore | None = None,
    ) -> None:
        self.roles = roles
        self.sampling = sampling
        self.options = options or ClarificationConfig()
        self.k_max = k_max
        self.store = store
        self.limits = SpanLimits(**self.options.answer_span.model_dump())
        self.fingerprint = _fingerprint(roles, sampling, self.options)
        # Read now, so that a corrupt file stops the run before any model call.
        self._saved = store.load(self.fingerprint) if store else {}
        self._running: dict[tuple[str, int], _Shared] = {}

    async def turns(self, instance: Instance, k: int, seed: int) -> Asked:
        """clarify@k's turns, whether the Clarifier stopped early, and a failure if any."""
        if self.options.mode == "all_at_once":
            return (await self._all_at_once(instance, k, seed)).first(k)
        key = (instance.id, seed)
        shared = self._running.get(key)
        if shared is None:
            saved = self._saved.get(key) or Dialogue(
                instance_id=instance.id, seed=seed, fingerprint=self.fingerprint
            )
            # Continued from where it stopped; a failed turn is asked again.
            shared = self._running[key] = _Shared(saved.model_copy(deep=True))
            # One task per (instance, seed) that every clarify@j of it waits on: a waiter
            # that is cancelled does not cancel the others' dialogue.
            shared.task = asyncio.ensure_future(self._sequential(instance, shared))
            # Its error reaches the keys that wait (task.result() below); when none is left
            # (the run stopped on a dead server), asyncio would log it as never retrieved.
            shared.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if not shared.ready(k):
            # clarify@j goes on as soon as its j turns are there, not when all k_max are;
            # meanwhile this key gives its slot to a key with requests to send.
            async with released():
                while not shared.ready(k):
                    await shared.changed.wait()
        if not shared.dialogue.done(k) and shared.task is not None and shared.task.done():
            shared.task.result()  # what stopped the dialogue short of k turns, re-raised
        charge(shared.take_usage(k))
        return shared.dialogue.first(k)

    async def aclose(self) -> None:
        """Cancel dialogues still running (the run was interrupted): nothing half-asked is
        written, and nothing runs on after the engines close."""
        pending = [s.task for s in self._running.values() if s.task and not s.task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _sequential(self, instance: Instance, shared: _Shared) -> Dialogue:
        try:
            dialogue = shared.dialogue
            if dialogue.done(self.k_max):
                return dialogue
            dialogue.error = None
            await self._extend(instance, dialogue, shared)
            if dialogue.stopped or dialogue.error:
                # How it ended (each turn was saved as it came).
                self._save(dialogue, shared)
            return dialogue
        finally:
            if shared.unsaved is not None and shared.unsaved[1].roles:
                # Cut mid-turn (the run was cancelled, a server died): the calls made are done
                # and cached, so the turn asked again on resume finds them answered for no
                # work; this line keeps them counted.
                with suppress(OSError):
                    self._save(dialogue, shared)
            shared.finished()

    def _save(self, dialogue: Dialogue, shared: _Shared) -> None:
        """Append `dialogue` to the store with the calls asked since its line before."""
        asked, shared.unsaved = shared.unsaved, None
        if self.store is None:
            return
        turn, used = asked if asked is not None else (len(dialogue.turns), KeyUsage())
        line = dialogue.model_copy(update={"usage": LineUsage(turn=turn, roles=used.fields())})
        self.store.append(line)

    async def _extend(
        self, instance: Instance, dialogue: Dialogue, shared: _Shared | None = None
    ) -> Dialogue:
        """Ask and answer turn after turn up to k_max (or a stop); a failing turn ends the
        dialogue with its error, keeping the turns before it. With `shared`, each turn is
        saved and its waiters woken as soon as it is there, and metered on its own."""
        stage = "clarify"
        try:
            while len(dialogue.turns) < self.k_max:
                with charged_to_key() as used:
                    if shared is not None:
                        shared.usage[len(dialogue.turns) + 1] = used
                        shared.unsaved = (len(dialogue.turns) + 1, used)
                    stage = "clarify"
                    asked = await clarifier.ask(
                        self.roles["clarifier"],
                        instance.blurred_query,
                        [t.qa for t in dialogue.turns],
                        instance.language,
                        self._seeded("clarifier", dialogue.seed),
                        allow_stop=self.options.allow_stop,
                    )
                    if asked.stop:
                        dialogue.stopped, dialogue.stop_question = True, asked.question
                        break
                    stage = "answer"
                    turn = await self._answer(instance, asked.question, dialogue.seed)
                    stage = "classify"
                    turn.question_types = await self._types(instance, turn.question)
                dialogue.turns.append(turn)
                if shared is not None:
                    # On disk before any record uses it: a resumed clarify@(j+1) continues
                    # these turns rather than asking them again.
                    self._save(dialogue, shared)
                    shared.wake()
        except (EngineError, ToolCacheMiss) as e:
            dialogue.error = failure(e, stage)
        return dialogue

    async def _all_at_once(self, instance: Instance, k: int, seed: int) -> Dialogue:
        dialogue = Dialogue(instance_id=instance.id, seed=seed)
        stage = "clarify"
        try:
            questions = await clarifier.ask_all(
                self.roles["clarifier"],
                instance.blurred_query,
                k,
                instance.language,
                self._seeded("clarifier", seed),
                allow_stop=self.options.allow_stop,
            )
            dialogue.stopped = len(questions) < k
            for question in questions:
                stage = "answer"
                turn = await self._answer(instance, question, seed)
                stage = "classify"
                turn.question_types = await self._types(instance, question)
                dialogue.turns.append(turn)
        except (EngineError, ToolCacheMiss) as e:
            dialogue.error = failure(e, stage)
        return dialogue

    def _seeded(self, role: str, seed: int) -> Sampling:
        return self.sampling[role].with_seed(seed)

    async def _answer(self, instance: Instance, question: str, seed: int) -> Turn:
        options = self.options
        reply = await user_answerer.answer(
            self.roles["user_answerer"],
            instance.fused_query,
            question,
            instance.language,
            self._seeded("user_answerer", seed),
            mode=options.answerer,
            limits=self.limits,
        )
        unsupported = (
            unsupported_words(reply, instance.fused_query)
            if options.answerer == "abstractive"
            else None
        )
        return Turn(question=question, answer=reply, unsupported_words=unsupported)

    async def _types(self, instance: Instance, question: str) -> list[str]:
        if self.options.question_types == "llm":
            return list(
                await classify_with_model(
                    self.roles["question_classifier"],
                    question,
                    instance.language,
                    self.sampling["question_classifier"],
                )
            )
        return list(classify(question))


def _fingerprint(
    roles: dict[str, ChatModel], sampling: dict[str, Sampling], options: ClarificationConfig
) -> str:
    """What a dialogue depends on: each dialogue role's model (its served name, not the engine
    identity, which for a local checkpoint changes when a requeued job copies the weights) and
    sampling, and the options."""
    parts = {
        role: [roles[role].model, sampling[role].model_dump(mode="json")]
        for role in ("clarifier", "user_answerer", "question_classifier")
        if role in roles and role in sampling
    }
    # Unset options (None) are left out, so that adding one keeps the dialogues saved before.
    blob = json.dumps([parts, options.model_dump(mode="json", exclude_none=True)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def failure(error: EngineError | ToolCacheMiss, stage: str) -> dict[str, str]:
    """The {kind, stage, message} a record or dialogue keeps of a failed stage."""
    kind = error.kind if isinstance(error, EngineError) else "tool_cache_miss"
    return {"kind": kind, "stage": stage, "message": redact(str(error))[:2000]}
