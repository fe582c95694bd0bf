"""The client end of the relay: `subscribe()` follows a session's live text over SSE, from one relay or from several
at once (merged by `merge.LiveMerge`), resuming where it left off after a dropped connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from relay.client import _auth_headers
from relay.errors import StreamAuthError, StreamError, StreamRelayError
from relay.merge import LiveMerge
from relay.partition import relay_urls
from relay.protocol import StreamEvent

logger = logging.getLogger("relay")
_MAX_TRACKED_SPANS = 256


@dataclass(slots=True)
class _SseMessage:
    event: str = "message"
    event_id: str | None = None
    data: list[str] = field(default_factory=list)


async def _sse_messages(response: httpx.Response) -> AsyncIterator[_SseMessage]:
    """Parse Server-Sent Events from raw bytes (httpx's line splitting would also break on U+2028)."""
    buffer = bytearray()
    message = _SseMessage()
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while (newline := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:newline]).rstrip(b"\r").decode("utf-8", "replace")
            del buffer[: newline + 1]
            if not line:
                if message.data:
                    yield message
                message = _SseMessage()
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                message.event = value
            elif name == "data":
                message.data.append(value)
            elif name == "id" and "\x00" not in value:
                message.event_id = value


@dataclass(slots=True)
class _SpanSeen:
    lengths: dict[int, int] = field(default_factory=dict)  # block -> characters given to the caller
    ended: bool = False


class _TextTracker:
    """Per span and block, how much text the caller has been given: the client half of exactly-once."""

    def __init__(self) -> None:
        self._spans: OrderedDict[str, _SpanSeen] = OrderedDict()

    def _span(self, span_id: str) -> _SpanSeen:
        seen = self._spans.get(span_id)
        if seen is None:
            seen = self._spans[span_id] = _SpanSeen()
            if len(self._spans) > _MAX_TRACKED_SPANS:
                self._spans.popitem(last=False)
        else:
            self._spans.move_to_end(span_id)
        return seen

    def feed(self, data: dict[str, Any]) -> StreamEvent | None:
        """The event to hand to the caller for one relay message, or None if it brings nothing new."""
        span_id = str(data.get("span_id", ""))
        seen = self._span(span_id)
        kind = data.get("type")
        if kind == "reset":
            seen.lengths.clear()
            seen.ended = False
            attempt = data.get("attempt")
            return StreamEvent("reset", span_id, attempt=attempt if isinstance(attempt, int) else 0)
        if kind == "end":
            if seen.ended:
                return None
            seen.ended = True
            return StreamEvent("end", span_id)
        if kind != "delta":
            return None
        block, offset, text = int(data["block"]), int(data["offset"]), str(data["text"])
        have = seen.lengths.get(block, 0)
        if offset > have:
            logger.warning("gap in live text of span %s block %d (%d > %d)", span_id, block, offset, have)
        fresh = text[max(0, have - offset) :]
        if not fresh:
            return None
        seen.lengths[block] = offset + len(text)
        seen.ended = False
        return StreamEvent("delta", span_id, block, data["kind"], fresh, max(offset, have))


def subscribe(
    base_url: str | Sequence[str],
    session_id: str,
    token: str | None = None,
    reconnect: bool = True,
    *,
    since: str | None = None,
    retry_delay: float = 0.1,
    max_retry_delay: float = 5.0,
    read_timeout: float = 60.0,
) -> AsyncGenerator[StreamEvent, None]:
    """Follow a session's live text: new text only, resets and ends, resuming with `since` after a drop.

    With `reconnect`, a dropped connection or a 5xx is retried with backoff, forever (break out of the loop
    to stop); 401 raises `StreamAuthError` and other 4xx `StreamRelayError` at once. The read timeout is a
    few keep-alive periods, so a silently dead connection is noticed too. Wrap it in `contextlib.aclosing`
    so that leaving the loop early closes the connection at once.

    `base_url` may name several relays (a comma-separated list, or a sequence): then every one is followed at
    once and their text merged (`merge.LiveMerge`); a relay that is down is retried in the background without
    ending the stream, and only when every relay has refused the subscription does the error reach the caller.
    `since` is a position on one relay, so it is used only with one.
    """
    urls = relay_urls(base_url)
    options = {"retry_delay": retry_delay, "max_retry_delay": max_retry_delay, "read_timeout": read_timeout}
    if len(urls) == 1:
        return _subscribe_one(urls[0], session_id, token, reconnect, since, **options)
    return _subscribe_all(urls, session_id, token, reconnect, **options)


async def _subscribe_all(
    urls: Sequence[str], session_id: str, token: str | None, reconnect: bool, **options: float
) -> AsyncGenerator[StreamEvent, None]:
    """Every relay of `urls` followed by a task of its own, their events merged as they come."""
    queue: asyncio.Queue[tuple[int, StreamEvent | StreamError | None]] = asyncio.Queue()

    async def follow(index: int, url: str) -> None:
        try:
            async with contextlib.aclosing(_subscribe_one(url, session_id, token, reconnect, None, **options)) as one:
                async for event in one:
                    await queue.put((index, event))
        except StreamError as exc:
            await queue.put((index, exc))
        else:
            await queue.put((index, None))

    followers = [asyncio.create_task(follow(index, url)) for index, url in enumerate(urls)]
    merge = LiveMerge()
    finished: list[StreamError | None] = []
    try:
        while len(finished) < len(urls):
            index, item = await queue.get()
            if isinstance(item, StreamEvent):
                for event in merge.feed(index, item):
                    yield event
                continue
            finished.append(item)
            if item is not None:
                logger.warning("no live text from relay %s for %s: %s", urls[index], session_id, item)
        errors = [error for error in finished if error is not None]
        if len(errors) == len(urls):
            raise errors[-1]  # every relay refused: as with one relay, the caller is told
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)


async def _subscribe_one(
    base_url: str,
    session_id: str,
    token: str | None,
    reconnect: bool,
    since: str | None,
    *,
    retry_delay: float,
    max_retry_delay: float,
    read_timeout: float,
) -> AsyncGenerator[StreamEvent, None]:
    url = f"{base_url.rstrip('/')}/v1/streams/{session_id}"
    tracker = _TextTracker()
    last_id = since
    delay = retry_delay
    timeout = httpx.Timeout(10.0, read=read_timeout)
    async with httpx.AsyncClient(timeout=timeout) as client:
        while True:
            params = {"since": last_id} if last_id else {}
            try:
                async with client.stream("GET", url, params=params, headers=_auth_headers(token)) as response:
                    if response.status_code == 401:
                        raise StreamAuthError(f"stream relay {base_url} refused the token (401)", 401)
                    if response.status_code != 200:
                        message = f"stream relay {base_url} answered {response.status_code}"
                        if response.status_code < 500 or not reconnect:
                            raise StreamRelayError(message, response.status_code)
                        raise httpx.HTTPStatusError(message, request=response.request, response=response)
                    delay = retry_delay
                    async for sse in _sse_messages(response):
                        event = tracker.feed(_json_object("\n".join(sse.data)))
                        if sse.event_id:
                            last_id = sse.event_id
                        if event is not None:
                            yield event
            except httpx.HTTPError as exc:
                if not reconnect:
                    raise StreamRelayError(f"stream relay {base_url}: {type(exc).__name__}", 0) from exc
                logger.debug("stream from %s dropped (%s); resuming after %s", base_url, exc, last_id)
            else:
                if not reconnect:
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry_delay)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        logger.warning("ignoring a stream message that is not JSON: %.80r", text)
        return {}
    return value if isinstance(value, dict) else {}
