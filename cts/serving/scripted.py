"""Scripted engines: answers written by rules instead of a model, for testing configs, pipelines
and fault handling without weights (never for model behaviour). `ScriptedEngine` answers each
request with a function of it; `scripted_roles()` gives a deterministic stand-in for every role
of the pipeline (answers depend only on the request), used by the tests and by bench/. A model
config names one with `engine: scripted` and `script: <role>` (those rules) or `replay: FILE`
(canned answers), to test configs and pipelines without weights
(docs/configs-and-checkpoints.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cts.foundation.yaml_config import ConfigError
from cts.serving.engine import Engine
from cts.serving.errors import EngineError, ServerUnreachable
from cts.serving.types import ChatRequest, ChatResponse, Usage

Script = Callable[[ChatRequest], str | Exception]


class ScriptedEngine(Engine):
    """Answers each request with `script(request)`; an Exception result is raised instead."""

    def __init__(self, script: Script, name: str = "scripted", delay_s: float = 0.0) -> None:
        super().__init__()
        self.model = name
        self.identity = f"scripted:{name}"
        self.script = script
        self.delay_s = delay_s
        self.requests: list[ChatRequest] = []

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        result = self.script(request)
        if isinstance(result, (EngineError, ServerUnreachable)):
            raise result
        if isinstance(result, Exception):
            raise EngineError(str(result))
        # Plausible token counts (about 4 characters a token) for budget logic.
        prompt = sum(len(m.content) for m in request.messages) // 4 + 1
        return ChatResponse(
            text=result, usage=Usage(prompt_tokens=prompt, completion_tokens=len(result) // 4 + 1)
        )


def fused_query(request: ChatRequest) -> str:
    """The fused query in a User Answerer prompt (cts/agents/prompts/user_answerer.yaml)."""
    found = re.search(
        r'(?:intent is: "|完整意图是：“)(.*?)(?:"\.\n|”。)', request.messages[0].content
    )
    assert found, request.messages[0].content
    return found.group(1)


def judge_rule(request: ChatRequest) -> str:
    """The scripted judge: full, partial, none in turn over the nugget ids it is asked about;
    asked yes or no (a blurred query's check), yes for a query of four words or more."""
    if request.output is not None and request.output.kind == "choice":
        query = request.messages[-1].content.splitlines()[-1].split(": ", 1)[-1]
        return "yes" if len(query.split()) >= 4 else "no"
    assert request.output is not None and request.output.kind == "json"
    ids = request.output.json_schema["required"]
    return json.dumps(
        {
            i: {"evidence": "e", "label": ["full", "partial", "none"][n % 3]}
            for n, i in enumerate(ids)
        }
    )


def nugget_builder_rule(request: ChatRequest) -> str:
    """The scripted nugget builder: three nuggets citing the evidence ids offered, one of them a
    near-duplicate of the first."""
    assert request.output is not None and request.output.kind == "json"
    item = request.output.json_schema["properties"]["nuggets"]["items"]
    ids = item["properties"]["source_ids"]["items"]["enum"]
    nuggets = [
        {"text": "The first fact.", "weight": 3, "source_ids": ids[:1]},
        {"text": " the first   FACT. ", "weight": 1, "source_ids": ids[:1]},  # a duplicate
        {"text": "A second fact.", "weight": 2, "source_ids": [ids[-1], ids[-1]]},
    ]
    return json.dumps({"nuggets": nuggets})


_YEAR = re.compile(r"(?<!\d)(?:19|20)\d\d(?:年)?(?!\d)")
_NAME = re.compile(r"\b[A-Z][\w-]+(?: [A-Z][\w-]+)+")


def fuser_rule(request: ChatRequest) -> str:
    """The scripted fuser: the longest raw query, a year in it as its `time` constraint and a
    run of capitalised words as its `entity` one (cts/agents/prompts/fuser.yaml lists the queries
    as `- ` lines)."""
    raw = [line[2:] for line in request.messages[-1].content.splitlines() if line.startswith("- ")]
    query = max(raw, key=len)
    constraints = [{"type": "time", "span": m.group()} for m in _YEAR.finditer(query)][:1]
    constraints += [{"type": "entity", "span": m.group()} for m in _NAME.finditer(query)][:1]
    return json.dumps({"query": query, "constraints": constraints}, ensure_ascii=False)


def blurrer_rule(request: ChatRequest) -> str:
    """The scripted blurrer: the fused query without every constraint it is given, and without
    a preposition that stood right before one (cts/agents/prompts/blurrer.yaml: the query on the
    first line, the constraints as `- type: span` lines)."""
    lines = request.messages[-1].content.splitlines()
    fused = re.split(r": |：", lines[0], maxsplit=1)[-1]
    targets = [line[2:].split(": ", 1) for line in lines if line.startswith("- ")]
    blurred = fused
    for _, span in targets:
        blurred = re.sub(rf"(?:\b(?:in|during|of|for) )?{re.escape(span)}", "", blurred)
    blurred = re.sub(r"\s+([?,.])", r"\1", " ".join(blurred.split()))
    removed = [{"type": t, "span": span} for t, span in targets]
    return json.dumps({"blurred_query": blurred, "removed": removed}, ensure_ascii=False)


def scripted_roles() -> dict[str, ScriptedEngine]:
    """Deterministic stand-ins for every role of the pipeline (answers depend only on the
    request), for logic tests of the pipeline and runner."""
    questions = ["Which year?", "Which city?", "Which model?"]

    def clarifier(request: ChatRequest) -> str:
        assert request.output is not None and request.output.kind == "json"
        if "questions" in request.output.json_schema["properties"]:  # all at once
            k = request.output.json_schema["properties"]["questions"]["maxItems"]
            return json.dumps({"questions": questions[:k]})
        turn = request.messages[-1].content.count("\nQ")
        return json.dumps({"question": questions[turn % 3]})

    def user_answerer(request: ChatRequest) -> str:
        """Real spans of the fused query: a year for "Which year?", its first two words for
        "Which city?", `unknown` otherwise; never text from its end."""
        if request.output is not None and request.output.kind == "json":  # abstractive
            return json.dumps({"answer": "probably Sweden"})
        fused = fused_query(request)
        question = request.messages[-1].content
        if "year" in question or "time or date" in question or "时间" in question:
            year = re.search(r"(?<!\d)(19|20)\d\d(?!\d)", fused)
            return year.group(0) if year else "unknown"
        if "city" in question:
            if re.match(r"[\u4e00-\u9fff]{2}", fused):
                return fused[:2]
            return " ".join(w.strip(".,;:!?\"'()") for w in fused.split()[:2])
        return "unknown"

    def question_classifier(request: ChatRequest) -> str:
        return json.dumps({"types": ["numeric"]})

    def rewriter(request: ChatRequest) -> str:
        """A query of its own for each number of answers, so that clarify@k keys never share a
        search (whether a tool-cache entry is reused would depend on which key ran first)."""
        content = request.messages[-1].content
        turns = content.count("\nQ") + content.count("\n问")
        return json.dumps({"query": f"rewritten ({turns}) " + content.split("\n")[0]})

    def searcher(request: ChatRequest) -> str:
        if len(request.messages) == 2:
            question = request.messages[1].content.rsplit("User: ", 1)[1]
            call = {"name": "search", "arguments": {"query": [question[:60]]}}
            return f"<think>\nsearch\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return "<think>\ndone\n</think>\n<answer>\nan answer\n</answer>"

    def summarizer(request: ChatRequest) -> str:
        return json.dumps({"evidence": "e", "summary": "s"})

    scripts = {
        "clarifier": clarifier,
        "user_answerer": user_answerer,
        "rewriter": rewriter,
        "searcher": searcher,
        "judge": judge_rule,
        "summarizer": summarizer,
        "question_classifier": question_classifier,
        "nugget_builder": nugget_builder_rule,
        "fuser": fuser_rule,
        "blurrer": blurrer_rule,
    }
    return {role: ScriptedEngine(script, name=role) for role, script in scripts.items()}


#: The roles `scripted_roles()` has rules for: what a model config's `script:` may name.
SCRIPTED_ROLES = (
    "clarifier",
    "user_answerer",
    "rewriter",
    "searcher",
    "judge",
    "summarizer",
    "question_classifier",
    "nugget_builder",
    "fuser",
    "blurrer",
)


@dataclass(frozen=True)
class ReplayLine:
    #: The answer.
    text: str
    #: Text the request's messages must hold for this answer (None: any request).
    contains: str | None = None


def read_replay(path: Path) -> list[ReplayLine]:
    """A replay file: one JSON object a line, `{"text": ..., "contains": ...}` (`contains`
    optional). ConfigError naming `file:line` for a line that is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: replay file unreadable: {e}") from e
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}:{number}: not JSON: {e}") from e
        shape = '{"text": str, "contains": str (optional)}'
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: a line is {shape}")
        text, contains = row.get("text"), row.get("contains")
        if not isinstance(text, str) or not (contains is None or isinstance(contains, str)):
            raise ConfigError(f"{path}:{number}: a line is {shape}")
        extra = set(row) - {"text", "contains"}
        if extra:
            raise ConfigError(f"{path}:{number}: unknown key(s) {', '.join(sorted(extra))}")
        found.append(ReplayLine(text, contains))
    if not found:
        raise ConfigError(f"{path}: replay file has no line")
    return found


def replay_script(lines: list[ReplayLine], source: str) -> Script:
    """Answers a request with the text of the first line whose `contains` occurs in one of its
    messages; a request no line matches is an EngineError (a failed key, as a model's error)."""

    def script(request: ChatRequest) -> str | Exception:
        contents = [m.content for m in request.messages]
        for line in lines:
            if line.contains is None or any(line.contains in c for c in contents):
                return line.text
        return EngineError(f"{source}: no replay line matches the request")

    return script


def scripted_engine(
    name: str, script: str | None = None, replay: str | None = None
) -> ScriptedEngine:
    """The engine of a model config with `engine: scripted`: the built-in rules of the role
    `script`, or the answers of the replay file `replay` (read now; its digest is part of the
    engine's identity, so an edited file answers nothing from the response cache)."""
    if script is not None:
        engine = ScriptedEngine(scripted_roles()[script].script, name=name)
        engine.identity = f"scripted:rules:{script}"
        return engine
    if replay is None:
        raise ConfigError(f"model {name}: engine 'scripted' needs `script` or `replay`")
    path = Path(replay).expanduser()
    lines = read_replay(path)
    engine = ScriptedEngine(replay_script(lines, replay), name=name)
    engine.identity = f"scripted:replay:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    return engine
