"""A role call as fine-tuning data: the prompt/completion row TRL's SFT trainer reads (the loss
on the completion only), and the JSONL `cts train ROLE --write-data` writes. Every role's
example class (cts/train/<role>_data.py) is a `RoleCall` with the fields of its own kind."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from cts.serving.types import Message


@dataclass(frozen=True)
class RoleCall:
    """One call of a role on a train instance: its chat messages and what it should answer."""

    #: The fields a written row keeps to say what it is about.
    ABOUT: ClassVar[tuple[str, ...]] = ("instance_id", "label")

    instance_id: str
    language: str
    #: The call's chat messages (system, user), in the role's own prompt.
    messages: list[dict[str, str]]
    completion: str


T = TypeVar("T")
E = TypeVar("E", bound=RoleCall)


def in_turn(
    instances: list[T], count: int, seed: int, example: Callable[[T, random.Random], E | None]
) -> list[E]:
    """`count` examples drawn with one `random.Random(seed)` from `instances` in turn, each
    pass in a new shuffled order (an instance that gives none, None, is passed over)."""
    rng = random.Random(seed)
    examples: list[E] = []
    while len(examples) < count:
        rng.shuffle(instances)
        drawn = (example(instance, rng) for instance in instances)
        examples += [e for e in drawn if e is not None]
    return examples[:count]


def chat(*messages: Message) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def as_json(completion: BaseModel | dict[str, Any]) -> str:
    """A structured completion as the compact JSON a model under its schema writes."""
    value = completion.model_dump() if isinstance(completion, BaseModel) else completion
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sft_row(call: RoleCall) -> dict[str, Any]:
    return {
        "prompt": call.messages,
        "completion": [{"role": "assistant", "content": call.completion}],
    }


def write_examples(calls: Sequence[RoleCall], path: Path) -> None:
    """One JSON line per call: what it is about (its `ABOUT` fields) and its SFT row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for call in calls:
            row = {name: getattr(call, name) for name in call.ABOUT} | sft_row(call)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
