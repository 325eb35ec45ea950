"""Loading YAML configs into pydantic models with errors that name the file, line and key.

Shared by model configs (here) and experiment configs (eval/). `--set a.b.c=value` overrides are
applied to the raw mapping before validation, so they are checked exactly like file content.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config problem; the message names the file (and line) and the dotted key."""


def _key_lines(node: yaml.Node, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Map each dotted key path to its 1-based line in the YAML source."""
    lines: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            lines[path] = item.start_mark.line + 1
            lines.update(_key_lines(item, path))
    return lines


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data, _key_lines(node) if node is not None else {}


def parse_override(override: str) -> tuple[list[str], Any]:
    """`a.b.c=value` → (["a", "b", "c"], value parsed as a YAML scalar or flow collection)."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: expected KEY=VALUE, e.g. roles.clarifier.model=x")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {override!r}: value is not valid YAML: {e}") from e
    if isinstance(value, datetime.date):
        value = raw.strip()  # configs keep dates as text (`search.date=2026-11-30`)
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> set[tuple[str, ...]]:
    """Apply `--set` overrides in place; return the key paths they touched."""
    touched: set[tuple[str, ...]] = set()
    for override in overrides:
        keys, value = parse_override(override)
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(keys[: i + 1])
                raise ConfigError(f"--set {override!r}: {where} is not a mapping")
            node = child
        node[keys[-1]] = value
        touched.add(tuple(keys))
    return touched


def format_validation_error(
    error: ValidationError,
    path: Path,
    lines: dict[tuple[str, ...], int],
    overridden: set[tuple[str, ...]] | None = None,
    override_label: str = "--set",
    prefix: tuple[str, ...] = (),
) -> str:
    """One line per problem: `file:line: key: message`, or `--set key: message` for keys that
    came from an override. `prefix` is prepended to keys (a model validated inside another
    file's section)."""
    problems = []
    for err in error.errors():
        # pydantic appends "[key]" when a mapping key (not its value) is invalid.
        loc = tuple(str(p) for p in err["loc"] if p != "[key]")
        key = ".".join(prefix + loc) or "<root>"
        message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        if any(loc[: len(o)] == o for o in overridden or ()):
            problems.append(f"{override_label} {key}: {message}")
            continue
        # The innermost key that exists in the file gives the line.
        line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
        where = f"{path}:{line}" if line else str(path)
        problems.append(f"{where}: {key}: {message}")
    return "\n".join(problems)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, recursing into mappings present in both."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def key_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf key path of a nested mapping."""
    paths: set[tuple[str, ...]] = set()
    for key, value in data.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and value:
            paths |= key_paths(value, path)
        else:
            paths.add(path)
    return paths


def load_config(cls: type[M], path: Path, overrides: list[str] | None = None, **context: Any) -> M:
    """Read, override and validate one YAML file as `cls`; raise ConfigError on any problem."""
    data, lines = read_yaml(path)
    overridden = apply_overrides(data, overrides or [])
    try:
        return cls.model_validate(data, context={"config_path": path, **context})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, path, lines, overridden)) from None
