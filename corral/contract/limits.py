"""What every value a producer hands the contract must be, so that a model that validates can also be sent.

JSON is UTF-8 text, objects have string keys, numbers are finite, and parsers and pydantic's serializer stop near 255
levels of nesting. Python values need none of that: an argument that is not valid UTF-8 reaches Python as a lone
surrogate (`\\udcff`), and so does `json.loads('"\\\\ud800"')`; a dict may nest as deep as memory allows. pydantic
accepts many of those (a lone surrogate in an optional string or a dict key, nesting inside `dict[str, Any]`), and the
failure came later, when the model was serialised: a traceback in the CLI, a change on the way (NaN became null, a
surrogate key a replacement character), or a workflow task failing on its own output when a deep value was wrapped
once more (a continue-as-new carry). The models users send (start input, agent, signal and update inputs, queries)
check their raw input here instead, and the problem is a ValidationError that names where it is.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator

MAX_JSON_DEPTH = 64
"""Levels of nesting (objects and arrays) an input may have, counted from its top: far above any real tool schema or
document source, and far below the ~255 that JSON parsers and pydantic's serializer take."""


def check_sendable(data: Any, skip: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming the first place where `data` could not be sent as JSON (top-level keys in `skip` are
    not looked at: state the session itself writes)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{_at(where)}JSON numbers are finite; got {value}")
        elif isinstance(value, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"{_at(where)}nested more than {MAX_JSON_DEPTH} levels deep")
            if isinstance(value, dict):
                for key, child in value.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{_at(where)}JSON object keys are strings; got {type(key).__name__} {key!r}")
                    _check_text(key, where)
                    if not (depth == 0 and key in skip):
                        stack.append((child, f"{where}.{_part(key)}" if where else _part(key), depth + 1))
            else:
                stack.extend((child, f"{where}[{index}]", depth + 1) for index, child in enumerate(value))


def _check_text(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("unicode_escape").decode()
        raise ValueError(f"{_at(where)}text must be valid Unicode; it holds a lone surrogate ({bad})") from None


def _part(key: str) -> str:
    """A key as a path names it: escaped, and short (a key may be megabytes long)."""
    escaped = key.encode("unicode_escape").decode()
    return escaped if len(escaped) <= 40 else escaped[:39] + "…"


def _at(where: str) -> str:
    return f"at {where}: " if where else ""


class SendableInput(BaseModel):
    """A model users send: its raw input passes `check_sendable` before pydantic validates it."""

    unchecked_fields: ClassVar[tuple[str, ...]] = ()
    """Top-level fields the check skips: state the session writes itself, already checked where it came from."""

    @model_validator(mode="before")
    @classmethod
    def _sendable(cls, data: Any) -> Any:
        check_sendable(data, skip=cls.unchecked_fields)
        return data
