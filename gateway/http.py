"""What every endpoint needs of a request: its JSON body, checked, and its query values, typed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import ApiError, invalid

MAX_BODY_BYTES = 8 * 1024 * 1024

Handler = Callable[[Request, str], Awaitable[Response]]
"""An endpoint that is given the caller's workspace (see `gateway.app.Gateway.workspace`)."""
Authed = Callable[[Handler], Callable[[Request], Awaitable[Response]]]
"""Wraps a `Handler` into a Starlette endpoint that authenticates first."""


async def body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise invalid(f"the request body is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise invalid("the request body must be a JSON object")
    return parsed


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
