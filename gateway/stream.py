"""A session's event stream over SSE (`GET /v1/sessions/{id}/events/stream`): the log from the moment the stream
opens (`corral.client.follow_events`, a long poll on the workflow's history), merged with live previews from the
stream relay when `event_deltas[]` asks for them (`gateway/previews.py`). The gateway keeps no state: a client
whose gateway died opens a stream on another one and lists what it missed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from temporalio.client import WorkflowHandle

from corral.client import SessionClosed, follow_events, read_events, session_info
from corral.contract.events import SessionEvent
from gateway.errors import invalid
from gateway.previews import Previews
from gateway.shapes import event_view
from relay import StreamError, subscribe

PING_SECONDS = 15.0
RECENT_SPANS = 2000
"""How far back a stream with previews looks, when it opens, for model requests under way or over."""

logger = logging.getLogger("gateway")


async def stream_events(
    handle: WorkflowHandle, request: Request, view: Callable[[SessionEvent], dict[str, Any]] = event_view
) -> EventSourceResponse:
    """The session's events written from now on, as SSE frames (`event: <type>`), with the relay's previews when
    `event_deltas[]` asks for them; pings keep the connection open; a failure is an `error` frame. `view` shows an
    event as the API does (a thread's own stream names its statuses as the thread's)."""
    deltas = request.query_params.getlist("event_deltas[]")
    bad = sorted(set(deltas) - {"agent.message", "agent.thinking"})
    if bad:
        raise invalid(f"event_deltas[]: unknown type {', '.join(bad)}")
    start = (await session_info(handle)).last_position  # only what is written after the stream opened
    relay: str | None = getattr(request.app.state, "stream_url", None)
    previews: Previews | None = None
    if deltas and relay:
        previews = Previews(set(deltas))
        recent = await read_events(handle, after=max(0, start - RECENT_SPANS), before=start + 1,
                                   types=["span.model_request_start", "span.model_request_end"])  # fmt: skip
        for event in recent:
            previews.log(event)  # which model requests are under way or over, before anything is shown
    token: str | None = getattr(request.app.state, "stream_token", None)

    async def frames() -> AsyncIterator[ServerSentEvent]:
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        feeders = [asyncio.create_task(_feed_log(handle, start, queue))]
        if previews is not None and relay:
            feeders.append(asyncio.create_task(_feed_live(relay, token, handle.id, queue)))
        try:
            while True:
                source, item = await queue.get()
                if source == "closed":
                    return
                if source == "error":  # the client is told, in the stream's own terms
                    error = {"type": "api_error", "message": f"the stream failed: {item}"}
                    body = {"type": "error", "error": error}
                    yield ServerSentEvent(event="error", data=json.dumps(body))
                    return
                if source == "live":
                    assert previews is not None
                    for frame in previews.live(item):
                        yield ServerSentEvent(event=frame["type"], data=json.dumps(frame))
                    continue
                if previews is not None:
                    previews.log(item)
                data = view(item)
                yield ServerSentEvent(event=data["type"], data=json.dumps(data))
                if data["type"] == "session.deleted":
                    return  # the session's last event: the stream ends with it, as upstream
        finally:
            for feeder in feeders:
                feeder.cancel()
            await asyncio.gather(*feeders, return_exceptions=True)

    return EventSourceResponse(
        frames(),
        ping=PING_SECONDS,
        ping_message_factory=lambda: ServerSentEvent(event="ping", data=json.dumps({"type": "ping"})),
        headers={"Cache-Control": "no-cache"},
    )


async def _feed_log(handle: WorkflowHandle, after: int, queue: asyncio.Queue[tuple[str, Any]]) -> None:
    """The session's log from `after` on, into `queue`; then `closed` (the session ended) or `error`."""
    try:
        async with contextlib.aclosing(follow_events(handle, after=after)) as events:
            async for event in events:
                await queue.put(("log", event))
    except SessionClosed:
        await queue.put(("closed", None))
    except Exception as exc:
        await queue.put(("error", exc))


async def _feed_live(relay: str, token: str | None, session_id: str, queue: asyncio.Queue[tuple[str, Any]]) -> None:
    """The relay's live text of the session, into `queue`; with a comma-separated list of relays, every one of them
    followed and their text merged (`relay.subscribe`), so a relay lost mid-reply costs a pause. Best
    effort: relays that all refuse us end the previews, never the stream (the log carries every message whole)."""
    try:
        async with contextlib.aclosing(subscribe(relay, session_id, token)) as live:
            async for event in live:
                await queue.put(("live", event))
    except StreamError as exc:
        logger.warning("no live previews for %s: %s", session_id, exc)
