"""Engine `lexical`: no model at all. It holds the judge role's place for the lexical judge
(cts/agents/lexical_judge.py), which labels nuggets by the numbers and terms an answer repeats:
`cts.agents.judge.judge` labels a batch itself when the judge's engine is one of these, and a
chat request to it is an error. A config naming it for another role is refused when the
experiment loads (cts.eval.run.config.check_lexical_roles)."""

from __future__ import annotations

from cts.serving.engine import ChatModel, Engine
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, ChatResponse


class LexicalEngine(Engine):
    """The lexical judge's place among the engines: a name, and stats that stay at 0 (a run's
    "model calls" count models); no weights and no response cache to key."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.model = name
        self.identity = f"lexical:{name}"

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        raise EngineError(
            f"model {self.model}: engine 'lexical' labels nuggets for the judge role only; "
            "it answers no chat request"
        )


def is_lexical(engine: ChatModel) -> bool:
    """Whether `engine`, under any wrappers (cache, metering, unbatched), is a LexicalEngine."""
    while not isinstance(engine, LexicalEngine):
        inner = getattr(engine, "inner", None)
        if inner is None:
            return False
        engine = inner
    return True
