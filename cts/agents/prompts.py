"""Prompt templates live as YAML beside this loader (cts/agents/prompts/<role>.yaml), one entry
per language; instances in other languages use the English prompts."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from cts.serving.types import Message


@cache
def _templates(role: str) -> dict[str, dict[str, str]]:
    text = resources.files("cts.agents").joinpath("prompts", f"{role}.yaml").read_text("utf-8")
    return yaml.safe_load(text)


def prompt_language(language: str) -> str:
    return "zh" if language.lower().startswith("zh") else "en"


def render(
    role: str, language: str, variant: str = "user", **fields: Any
) -> tuple[Message, Message]:
    """The system and user messages of `role` in the instance's language; `variant` names
    the user template when a role has several (the judge with or without the query)."""
    template = _templates(role)[prompt_language(language)]
    return (
        Message(role="system", content=template["system"].format(**fields)),
        Message(role="user", content=template[variant].format(**fields)),
    )
