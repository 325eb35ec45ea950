"""The one config loader: a YAML file (plus overrides) into a pydantic model, with where each
key came from, and errors that name the file, line and key.

Model configs, experiment configs (cts/eval/) and train configs (cts/train/) all load through
`load_config`. Overrides (`--set a.b.c=value`, or typed ones a program derives) are applied to
the raw mapping before validation, so they are checked exactly like file content, and an error
about an overridden key names the override instead of a line.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
#: A dotted key as a path: `roles.clarifier.model` → ("roles", "clarifier", "model").
Key = tuple[str, ...]


class ConfigError(ValueError):
    """A config problem; the message names the file (and line) and the dotted key."""


#: libyaml's parser where PyYAML was built with it (several times faster than the pure-Python one,
#: same events and marks); the constructors stay Python, so _Loader's checks apply to both.
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _key_lines(node: yaml.Node, prefix: Key = ()) -> dict[Key, int]:
    """Map each dotted key path to its 1-based line in the YAML source."""
    lines: dict[Key, int] = {}
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


def _refuse_aliases(text: str, path: Path) -> None:
    """ConfigError at the first alias (`*name`). Configs never need anchors, and an alias
    "bomb" (anchors referenced many times per level) makes the composed tree exponential to
    walk; the event stream is scanned before anything is composed, so it stays linear."""
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark else "?"
            raise ConfigError(
                f"{path}:{line}: YAML aliases (*{event.anchor}) are not allowed in configs"
            )


def _refuse_duplicate_keys(node: yaml.Node, path: Path) -> None:
    """ConfigError at a key a mapping gives twice: YAML keeps the last silently, so `seeds:
    [0]` then, further down, `seeds: [1]` ran seed 1 with nothing said."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in current.value:
                key, line = str(key_node.value), key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(
                        f"{path}:{line}: key {key!r} given twice (first at line {seen[key]}); "
                        "YAML would keep the last silently: remove one"
                    )
                seen[key] = line
                stack.append(value_node)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)


class _Loader(_Base):  # type: ignore[valid-type,misc]
    """SafeLoader whose scalars that are no value of their type (`2026-13-45`, `!!int abc`,
    `!!bool maybe`, an integer too long for int()) raise a YAMLError at their line: PyYAML's
    constructors raise a bare ValueError, KeyError or AttributeError, with no line at all."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, LookupError, AttributeError, TypeError) as e:
            value = str(node.value)
            shown = repr(value if len(value) <= 40 else f"{value[:40]}…")
            # A ValueError says why (`month must be in 1..12`); the others only say how.
            why = f" ({str(e).split(';')[0]})" if isinstance(e, ValueError) else ""
            message = f"{shown} is not a valid {node.tag.rsplit(':', 1)[-1]}{why}"
            raise yaml.constructor.ConstructorError(None, None, message, node.start_mark) from e


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[Key, int]]:
    try:
        raw = path.read_bytes() if path.is_file() else None
    except OSError as e:  # a name too long for the file system, permission denied
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    if raw is None:
        raise ConfigError(f"{path}: config file not found")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        # A traceback would not say which config file, nor where in it.
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x})") from e
    try:
        _refuse_aliases(text, path)
        loader = _Loader(text)
        try:  # composed once: the tree gives both the data and each key's line
            node = loader.get_single_node()
            if node is not None:
                _refuse_duplicate_keys(node, path)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    except RecursionError as e:
        # PyYAML composes nested collections recursively (a few hundred levels is the limit).
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data, _key_lines(node) if node is not None else {}


@dataclass(frozen=True)
class Override:
    """A key set over a config file's content."""

    keys: Key
    value: Any
    #: How an error about this key names where it came from.
    label: str = "--set"


#: The deepest dotted key an override may name (no config nests anywhere near this).
MAX_KEY_DEPTH = 50


def parse_override(override: str) -> Override:
    """`a.b.c=value` → the keys and the value parsed as a YAML scalar or flow collection."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"--set {_short(override)}: expected KEY=VALUE, e.g. roles.clarifier.model=x"
        )
    keys = _split_key(key.strip(), override)
    if len(keys) > MAX_KEY_DEPTH:
        raise ConfigError(
            f"--set {_short(override)}: key nested too deeply "
            f"({len(keys)} levels; at most {MAX_KEY_DEPTH})"
        )
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {_short(override)}: value is not valid YAML: {e}") from e
    except (ValueError, RecursionError) as e:
        # A value nested too deeply for PyYAML (a scalar that is no value of its type, such as
        # 2026-13-45, is a YAMLError already: see _Loader).
        raise ConfigError(f"--set {_short(override)}: value is not valid YAML: {e}") from e
    if isinstance(value, datetime.date):
        value = raw.strip()  # configs keep dates as text (`search.date=2026-11-30`)
    return Override(keys, value)


#: One key of a dotted path: a name in double or single quotes (which may hold dots, as model
#: names do: `models."ernie-4.5-21b-a3b".vllm`), or a bare name up to the next dot.
_SEGMENT = r"""(?:"[^"]+"|'[^']+'|[^."']*)"""
_QUOTED_KEY = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*")


def _split_key(key: str, override: str) -> Key:
    """`a.b.c` → ("a", "b", "c"); a quoted segment is one key, dots and all."""
    if not any(q in key for q in "\"'"):
        return tuple(key.split("."))
    if not _QUOTED_KEY.fullmatch(key):
        raise ConfigError(
            f"--set {_short(override)}: a quoted key must be a whole segment between dots, "
            'e.g. models."ernie-4.5-21b-a3b".vllm.gpu_memory_utilization=0.5'
        )
    keys, rest = [], key
    while True:
        segment = re.match(_SEGMENT, rest)
        assert segment is not None  # the whole key matched _QUOTED_KEY
        text = segment.group()
        keys.append(text[1:-1] if text[:1] in "\"'" else text)
        rest = rest[segment.end() :]
        if not rest:
            return tuple(keys)
        rest = rest[1:]  # the dot


def _short(override: str, limit: int = 80) -> str:
    """An override as errors quote it, cut to `limit` characters."""
    return repr(override if len(override) <= limit else f"{override[:limit]}…")


def mapping_overrides(data: dict[str, Any], label: str, prefix: Key = ()) -> list[Override]:
    """A nested mapping laid over a file key by key (an experiment's inline `models.<name>`
    over the model file), like a deep merge. An empty mapping changes nothing."""
    overrides = []
    for key, value in data.items():
        keys = (*prefix, str(key))
        if isinstance(value, dict):
            overrides += mapping_overrides(value, label, keys)
        else:
            overrides.append(Override(keys, value, label))
    return overrides


def _apply(data: dict[str, Any], override: Override, text: str) -> None:
    node = data
    for i, key in enumerate(override.keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{text}: {'.'.join(override.keys[: i + 1])} is not a mapping")
        node = child
    node[override.keys[-1]] = override.value


@dataclass(frozen=True)
class Origins:
    """Where each key of a loaded config came from: a line of its file, or an override."""

    #: The YAML file; None for a config that is only overrides (an inline model).
    path: Path | None
    lines: dict[Key, int] = field(default_factory=dict)
    #: Overridden key → the override's label (`--set`, or where a derived override came from).
    overridden: dict[Key, str] = field(default_factory=dict)

    def where(self, *key: str) -> str:
        """`file:line: key`, or `--set key` when an override set it (or a key above it)."""
        dotted = ".".join(key) or "<root>"
        label = next(
            (label for keys, label in self.overridden.items() if key[: len(keys)] == keys), None
        )
        if label is None and key and key not in self.lines:
            # A key above an override that is not in the file (`--set typo.x=1`).
            label = next(
                (label for keys, label in self.overridden.items() if keys[: len(key)] == key),
                None,
            )
        if label is not None:
            return f"{label} {dotted}"
        # The innermost key that exists in the file gives the line.
        line = next(
            (self.lines[key[:n]] for n in range(len(key), 0, -1) if key[:n] in self.lines), None
        )
        place = str(self.path or "<config>")
        return f"{place}:{line}: {dotted}" if line else f"{place}: {dotted}"

    def error(self, error: ValidationError) -> ConfigError:
        """One line per problem: `file:line: key: message` or `--set key: message`."""
        problems = []
        for err in error.errors():
            # pydantic appends "[key]" when a mapping key (not its value) is invalid.
            loc = tuple(str(p) for p in err["loc"] if p != "[key]")
            message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{self.where(*loc)}: {message}")
        return ConfigError("\n".join(problems))


@dataclass(frozen=True)
class Loaded(Generic[M]):
    config: M
    origins: Origins


def load_config(
    cls: type[M], path: Path | None, overrides: Sequence[str | Override] = ()
) -> Loaded[M]:
    """Read `path`, apply the overrides in order (text ones are `--set KEY=VALUE`), validate as
    `cls`; ConfigError names the file, line or override of every problem."""
    data, lines = read_yaml(path) if path is not None else ({}, {})
    overridden: dict[Key, str] = {}
    for item in overrides:
        override = parse_override(item) if isinstance(item, str) else item
        _apply(data, override, f"--set {item!r}" if isinstance(item, str) else override.label)
        overridden[override.keys] = override.label
    origins = Origins(path, lines, overridden)
    try:
        return Loaded(cls.model_validate(data), origins)
    except ValidationError as e:
        raise origins.error(e) from None
