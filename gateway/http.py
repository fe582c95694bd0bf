"""What every endpoint needs of a request: its JSON body, checked, and its query values, typed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from corral.contract.session import MAX_MESSAGE_BYTES
from gateway.errors import ApiError, invalid

MAX_BODY_BYTES = MAX_MESSAGE_BYTES + 1024 * 1024
"""A batch of events may carry `MAX_MESSAGE_BYTES` of content (corral/contract/session.py), and JSON adds a little;
a larger body is refused as it arrives, before it is all read."""

Handler = Callable[[Request, str], Awaitable[Response]]
"""An endpoint that is given the caller's workspace (see `gateway.app.Gateway.workspace`)."""
Authed = Callable[[Handler], Callable[[Request], Awaitable[Response]]]
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
        parsed = json.loads(raw)
    except ValueError as exc:
        raise invalid(f"the request body is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise invalid("the request body must be a JSON object")
    return parsed


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
