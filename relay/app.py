"""HTTP face of the stream relay: NDJSON (or JSON array) in from model workers, Server-Sent Events out to clients.

All forwarding rules live in `StreamHub`; this module only parses bodies as they arrive, frames SSE, checks the
bearer token and keeps idle subscriber connections alive.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from relay.errors import InvalidRecordError, InvalidSinceError
from relay.hub import DEFAULT_RETAIN_SECONDS, StreamHub
from relay.protocol import PublishRecord, parse_event_id, parse_record, parse_record_array

logger = logging.getLogger("relay")

KEEPALIVE_SECONDS = 15.0
MAX_LINE_BYTES = 1024 * 1024  # one record; a delta is a few tokens, so this only stops abuse
MAX_BATCH_BYTES = 8 * 1024 * 1024  # a JSON array body, read whole before validation
MAX_ID_LENGTH = 256
_WHITESPACE = b" \t\r\n"


class _BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


class _Relay:
    """Route handlers bound to one hub and one (optional) token."""

    def __init__(self, hub: StreamHub, token: str | None, keepalive_seconds: float) -> None:
        self.hub = hub
        self._token = token.encode() if token else None
        self.keepalive_seconds = keepalive_seconds

    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), self._token)

    def _check(self, request: Request) -> tuple[str, Response | None]:
        session_id = request.path_params["session_id"]
        if not self._authorized(request):
            return session_id, _error(401, "missing or wrong bearer token")
        if len(session_id) > MAX_ID_LENGTH:
            return session_id, _error(400, f"session id longer than {MAX_ID_LENGTH} characters")
        return session_id, None

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def publish(self, request: Request) -> Response:
        """Apply records as their lines arrive, so a subscriber sees a delta while the attempt still runs."""
        session_id, problem = self._check(request)
        if problem is not None:
            return problem
        accepted = 0
        line_number = 0

        def apply(records: list[PublishRecord]) -> None:
            nonlocal accepted
            for record in records:
                self.hub.publish(session_id, record)
                accepted += 1

        try:
            buffer = bytearray()
            array_body: bool | None = None  # decided by the first non-blank byte: `[` is a batch
            async for chunk in request.stream():
                buffer += chunk
                if array_body is None:
                    stripped = buffer.lstrip(_WHITESPACE)
                    if not stripped:
                        continue
                    array_body = stripped.startswith(b"[")
                if array_body:
                    if len(buffer) > MAX_BATCH_BYTES:
                        raise _BadBody(413, f"a JSON array body may hold at most {MAX_BATCH_BYTES} bytes")
                    continue
                while (newline := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:newline])
                    del buffer[: newline + 1]
                    line_number += 1
                    if line.strip(_WHITESPACE):
                        apply([parse_record(line)])
                if len(buffer) > MAX_LINE_BYTES:
                    raise _BadBody(413, f"a record line may hold at most {MAX_LINE_BYTES} bytes")
            if array_body:
                apply(parse_record_array(bytes(buffer)))
            elif buffer.strip(_WHITESPACE):
                line_number += 1
                apply([parse_record(bytes(buffer))])
        except InvalidRecordError as exc:
            where = {"line": line_number} if line_number else {}
            return _error(400, f"invalid record: {exc}", accepted=accepted, **where)
        except _BadBody as exc:
            return _error(exc.status, str(exc), accepted=accepted)
        except ClientDisconnect:
            # The worker went away mid-attempt. No `end` is made up: a retry of the span may follow.
            logger.info("publisher for session %s disconnected after %d records", session_id, accepted)
            return Response(status_code=499)
        return JSONResponse({"accepted": accepted})

    async def subscribe(self, request: Request) -> Response:
        session_id, problem = self._check(request)
        if problem is not None:
            return problem
        since = request.query_params.get("since") or request.headers.get("last-event-id") or None
        if since is not None:
            try:
                parse_event_id(since)
            except InvalidSinceError as exc:
                return _error(400, str(exc))
        return StreamingResponse(
            self._events(session_id, since),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _events(self, session_id: str, since: str | None) -> AsyncIterator[bytes]:
        # Registering inside the generator ties unsubscribe to its `finally`: a generator that never starts
        # (client gone before the first byte) never registers, so nothing leaks.
        ready = asyncio.Event()
        backlog, subscription = self.hub.subscribe(session_id, since, wake=ready.set)
        try:
            yield b": connected\n\n" + b"".join(message.to_sse() for message in backlog)
            while True:
                try:
                    await asyncio.wait_for(ready.wait(), self.keepalive_seconds)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                ready.clear()
                messages = subscription.drain()
                if messages:
                    yield b"".join(message.to_sse() for message in messages)
                if subscription.closed:
                    return
                if subscription.overflowed:
                    # Too far behind: end the stream; the client resumes with `since` and gets a compact catch-up.
                    logger.info("subscriber of session %s fell behind; closing its stream", session_id)
                    return
        finally:
            self.hub.unsubscribe(subscription)


def create_stream_app(
    token: str | None = None,
    retain_seconds: float = DEFAULT_RETAIN_SECONDS,
    *,
    hub: StreamHub | None = None,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
) -> Starlette:
    """The relay as an ASGI app; `app.state.hub` is its state. A token, when given, guards both directions."""
    relay = _Relay(hub or StreamHub(retain_seconds=retain_seconds), token, keepalive_seconds)
    app = Starlette(
        routes=[
            Route("/healthz", relay.healthz, methods=["GET"]),
            Route("/v1/streams/{session_id}", relay.subscribe, methods=["GET"]),
            Route("/v1/streams/{session_id}/publish", relay.publish, methods=["POST"]),
        ]
    )
    app.state.hub = relay.hub
    return app
