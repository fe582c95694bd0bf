"""What every endpoint needs of a request: its JSON body, checked, and its query values, typed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from corral.contract.session import MAX_MESSAGE_BYTES
from gateway.errors import ApiError, invalid

MAX_BODY_BYTES = MAX_MESSAGE_BYTES + 1024 * 1024
"""A batch of events may carry `MAX_MESSAGE_BYTES` of content (corral/contract/session.py), and JSON adds a little;
a larger body is refused as it arrives, before it is all read."""
MAX_JSON_DEPTH = 64
"""How deep a request body may nest (a tool's input schema is the deepest thing a client sends: a few levels)."""
DEFAULT_STREAMS_PER_KEY = 16
"""Event streams one API key may hold open at once on one gateway (`CORRAL_GATEWAY_MAX_STREAMS_PER_KEY`)."""
STREAM_RETRY_AFTER_SECONDS = 5
"""The `retry-after` of a stream refused for the bound: a slot frees when one of the key's streams closes."""

Handler = Callable[[Request, str], Awaitable[Response]]
"""An endpoint that is given the caller's workspace (see `gateway.auth.ApiKeys.workspace`)."""
Authed = Callable[[Handler], Callable[[Request], Awaitable[Response]]]
Tell = Callable[..., Awaitable[None]]
"""`Gateway.tell(type, subject_id, workspace, **extra)`: emit a webhook event for what a route just changed."""
"""Wraps a `Handler` into a Starlette endpoint that authenticates first."""


async def body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:  # the parser's own depth limit, far past ours
        raise invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        raise invalid(f"the request body is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise invalid("the request body must be a JSON object")
    _check_json(parsed)
    return parsed


def _no_constant(name: str) -> Any:
    """NaN and Infinity are Python's extension of JSON, not JSON: refused, as no response could carry them back."""
    raise ValueError(f"{name} is not a JSON value")


def _check_json(document: dict[str, Any]) -> None:
    """A body every later step can hold: at most `MAX_JSON_DEPTH` levels deep (each step may recurse through it),
    and every string valid Unicode (a `\\ud800` escape decodes to a lone surrogate that no UTF-8 encoder takes)."""
    pending: list[tuple[Any, str, int]] = [(document, "", 1)]
    while pending:
        value, where, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels (at {where or 'the top'})")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            path = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
            for text in (key, item):
                if isinstance(text, str) and not _encodable(text):
                    raise invalid(f"{_printable(path)}: a string holds a lone surrogate (\\ud800-\\udfff escape), "
                                  "which is not Unicode text")  # fmt: skip
            if isinstance(item, dict | list):
                pending.append((item, path, depth + 1))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:200]


def _too_large() -> ApiError:
    return ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes (a batch of events may carry "
                         f"{MAX_MESSAGE_BYTES} bytes of content)")  # fmt: skip


def whole(value: str | None, where: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise invalid(f"{where} must be a whole number") from exc
    if number < 1:
        raise invalid(f"{where} must be at least 1")
    return number


def flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class StreamSlots:
    """How many event streams each API key holds open on this gateway, bounded, so that one key's flood of streams
    (each a long poll on Temporal) cannot starve the others: past the bound, 429 with `retry-after`. A stream's
    slot is given back when its response ends, however it ends (closed by the client, the session, or an error)."""

    def __init__(self, per_key: int = DEFAULT_STREAMS_PER_KEY) -> None:
        if per_key < 1:
            raise ValueError(f"a key's stream bound must be at least 1, not {per_key}")
        self.per_key = per_key
        self._open: dict[str, int] = {}

    def held(self, key: str) -> int:
        return self._open.get(key, 0)

    async def open(self, key: str, make: Callable[[], Awaitable[Response]]) -> Response:
        """The response `make` builds, holding one of `key`'s slots until it has been sent whole."""
        if self.held(key) >= self.per_key:
            message = f"this API key has {self.per_key} event streams open on this gateway, its bound: close one first"
            raise ApiError(429, message, headers={"retry-after": str(STREAM_RETRY_AFTER_SECONDS)})
        self._open[key] = self.held(key) + 1
        try:
            response = await make()
        except BaseException:
            self._release(key)
            raise
        return _Holding(response, lambda: self._release(key))

    def _release(self, key: str) -> None:
        left = self.held(key) - 1
        if left > 0:
            self._open[key] = left
        else:
            self._open.pop(key, None)


class _Holding(Response):
    """A response that runs `release` once it has been sent (or abandoned): the ASGI call is the stream's life."""

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        self.response, self.release = response, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.release()
