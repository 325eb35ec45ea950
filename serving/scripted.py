"""Scripted engines: answers written by rules instead of a model, for testing configs, pipelines
and fault handling without weights (never for model behaviour). `ScriptedEngine` answers each
request with a function of it; `scripted_roles()` gives a deterministic stand-in for every role
of the pipeline (answers depend only on the request), used by the tests and by bench/."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

from serving.engine import Engine
from serving.errors import EngineError, ServerUnreachable
from serving.types import ChatRequest, ChatResponse, Usage

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
    """The fused query in a User Answerer prompt (agents/prompts/user_answerer.yaml)."""
    found = re.search(
        r'(?:intent is: "|完整意图是：“)(.*?)(?:"\.\n|”。)', request.messages[0].content
    )
    assert found, request.messages[0].content
    return found.group(1)


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
        if "year" in question:
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

    def judge(request: ChatRequest) -> str:
        assert request.output is not None and request.output.kind == "json"
        ids = request.output.json_schema["required"]
        return json.dumps(
            {
                i: {"evidence": "e", "label": ["full", "partial", "none"][n % 3]}
                for n, i in enumerate(ids)
            }
        )

    def nugget_builder(request: ChatRequest) -> str:
        assert request.output is not None and request.output.kind == "json"
        item = request.output.json_schema["properties"]["nuggets"]["items"]
        ids = item["properties"]["source_ids"]["items"]["enum"]
        nuggets = [
            {"text": "The first fact.", "weight": 3, "source_ids": ids[:1]},
            {"text": " the first   FACT. ", "weight": 1, "source_ids": ids[:1]},  # a duplicate
            {"text": "A second fact.", "weight": 2, "source_ids": [ids[-1], ids[-1]]},
        ]
        return json.dumps({"nuggets": nuggets})

    def summarizer(request: ChatRequest) -> str:
        return json.dumps({"evidence": "e", "summary": "s"})

    scripts = {
        "clarifier": clarifier,
        "user_answerer": user_answerer,
        "rewriter": rewriter,
        "searcher": searcher,
        "judge": judge,
        "summarizer": summarizer,
        "question_classifier": question_classifier,
        "nugget_builder": nugget_builder,
    }
    return {role: ScriptedEngine(script, name=role) for role, script in scripts.items()}
