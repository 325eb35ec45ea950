"""Client-side validation of constrained answers.

Servers can drop a constraint without saying so (vLLM >= 0.12 ignores the old `guided_*` fields
and still answers 200), so every constrained answer is checked here, whatever produced it.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema

from cts.serving.errors import ConstrainedOutputError
from cts.serving.types import ChoiceOutput, JsonSchemaOutput, OutputSpec, RegexOutput


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


_validators = lru_cache(maxsize=256)(_validator)


#: A UTF-16 surrogate: never a character on its own. A server's JSON may carry one as an escape
#: (`"\\ud800"`), and so may a model's JSON answer; no file, cache or request can encode it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(value: Any) -> Any:
    """`value` (a string, or JSON data) with every lone surrogate made U+FFFD, so that text
    from outside (a model's answer, a backend's JSON) can always be written and sent on."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [valid_unicode(v) for v in value]
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    return value


def validate_output(spec: OutputSpec, text: str) -> Any:
    """Return the parsed value of `text` under `spec`, or raise ConstrainedOutputError. A JSON
    answer's lone surrogate escapes are parsed as U+FFFD (see valid_unicode)."""
    if isinstance(spec, ChoiceOutput):
        if text not in spec.choices:
            raise ConstrainedOutputError(f"answer is not one of {list(spec.choices)}", text)
        return text
    if isinstance(spec, RegexOutput):
        if _compiled(spec.pattern).fullmatch(text) is None:
            raise ConstrainedOutputError(f"answer does not match /{spec.pattern}/", text)
        return text
    if isinstance(spec, JsonSchemaOutput):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConstrainedOutputError(f"answer is not JSON ({e.msg} at {e.pos})", text) from e
        except RecursionError as e:  # json.loads recurses per nesting level
            raise ConstrainedOutputError("answer is not JSON (nested too deeply)", text) from e
        except ValueError as e:  # an integer longer than int() converts (4300 digits)
            raise ConstrainedOutputError("answer is not JSON (a number too long)", text) from e
        try:
            value = valid_unicode(value)
        except RecursionError as e:  # as deep as json.loads allowed, with less stack left
            raise ConstrainedOutputError("answer is not JSON (nested too deeply)", text) from e
        validator = _validators(json.dumps(spec.json_schema, sort_keys=True))
        if validator.is_valid(value):  # the common case; best_match ranks errors
            return value
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "<root>"
            raise ConstrainedOutputError(
                f"answer violates schema {spec.name!r} at {where}: {error.message}", text
            )
        return value
    raise TypeError(f"unknown output spec {spec!r}")
