"""The payload converter of every corral client and worker: pydantic models as JSON, and input that does not fit
its model as a typed, non-retryable failure that says what is wrong, instead of an exception Temporal retries.

Where this matters: a session started with a bad input (from the `temporal` CLI, say) fails at once with
`InvalidInput` listing the fields, rather than retrying its first workflow task forever while it shows Running.
A bad signal is still dropped with a warning and a bad update still rejected: the SDK handles those itself.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, EncodingPayloadConverter
from temporalio.exceptions import ApplicationError

from corral.blobs import MISSING_BLOB_ENCODING
from corral.errors import MissingBlobError

INVALID_INPUT = "InvalidInput"
MAX_PROBLEMS = 10


TYPE_ADAPTERS = functools.lru_cache(maxsize=1024)(TypeAdapter)
"""One cache of pydantic type adapters for the whole process. The SDK makes a payload converter per workflow run,
each with a cache of its own, so every new session built the adapter of its `SessionInput` again (schema
generation): about 6 ms of its first workflow task, which is on the path to its first token."""


class _JsonConverter(PydanticJSONPlainPayloadConverter):
    def __init__(self) -> None:
        super().__init__()
        self._type_adapter = TYPE_ADAPTERS  # the SDK's own lookup (an LRU cache of TypeAdapter), shared


@functools.cache
def _encoding_converters() -> tuple[EncodingPayloadConverter, ...]:
    """The SDK's pydantic encoding converters, with the JSON one sharing `TYPE_ADAPTERS`; made once per process."""
    json = _JsonConverter()
    default = PydanticPayloadConverter().converters
    return tuple(json if encoding == json.encoding.encode() else converter for encoding, converter in default.items())


class CorralPayloadConverter(PydanticPayloadConverter):
    """The SDK makes a payload converter for every data converter it makes, and it makes two for every workflow
    activation (its per-command serialization contexts), only to replace it at once. So this one is cheap to make:
    it shares one set of encoding converters (they hold no state but the shared type adapter cache), where building
    them anew showed in the harness's flame graph under `bench.load --profile`."""

    def __init__(self) -> None:
        CompositePayloadConverter.__init__(self, *_encoding_converters())  # what PydanticPayloadConverter sets

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        for payload in payloads:
            if payload.metadata.get("encoding") == MISSING_BLOB_ENCODING:
                raise MissingBlobError(payload.data.decode("utf-8", "replace"))
        try:
            values = super().from_payloads(payloads, type_hints)
        except ValidationError as exc:
            raise ApplicationError(describe(exc), type=INVALID_INPUT, non_retryable=True) from None
        except Exception as exc:  # an unknown encoding, a protobuf that does not parse, bytes that are not UTF-8
            raise ApplicationError(f"invalid input: {exc}", type=INVALID_INPUT, non_retryable=True) from None
        for index, (value, hint) in enumerate(zip(values, type_hints or [], strict=False)):
            # A `binary/null` or `binary/plain` payload decodes to None or bytes whatever the handler declares.
            expected = _model_types(hint)
            if expected and not isinstance(value, expected):
                encoding = payloads[index].metadata.get("encoding", b"").decode(errors="replace") or "no encoding"
                raise ApplicationError(
                    f"invalid {' or '.join(t.__name__ for t in expected)}: got a {encoding} payload",
                    type=INVALID_INPUT,
                    non_retryable=True,
                )
        return values


def _model_types(hint: Any) -> tuple[type, ...]:
    """The types a value decoded for `hint` may have, when `hint` is a model or an optional model; else ()."""
    options = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    if not all(
        option is type(None) or (isinstance(option, type) and issubclass(option, BaseModel)) for option in options
    ):
        return ()
    return tuple(options)


def describe(exc: ValidationError) -> str:
    """`field.path: what is wrong` for each problem (at most `MAX_PROBLEMS`), on one line."""
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'input'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    ]
    more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
    return f"invalid {_model_name(exc.title)}: " + "; ".join(problems[:MAX_PROBLEMS]) + more


def _model_name(title: str) -> str:
    """The model's name in a validation error's title: pydantic titles a model with an after-validator
    `function-after[_check(), SessionInput]`, which tells a user nothing."""
    wrapped = re.fullmatch(r"function-\w+\[.*, (\w+)\]", title)
    return wrapped[1] if wrapped else title
