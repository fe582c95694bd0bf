"""A client of a session's event stream that follows the documented preview rules (`event_start` starts a preview
over, a delta appends), for the tests that kill relays and gateways under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from corral.contract.events import message_id_of


class Previews:
    """A client following the documented preview rules: `event_start` (re)starts a preview, empty; a delta appends
    to entry `index` of its preview. `texts` is what each preview shows now."""

    def __init__(self) -> None:
        self.texts: dict[str, dict[int, str]] = {}
        self.deltas = 0

    def feed(self, event: Any) -> None:
        if event.type == "event_start" and event.event.type == "agent.message":
            self.texts[event.event.id] = {}
        elif event.type == "event_delta":
            assert event.event_id in self.texts, f"a delta for preview {event.event_id}, which is not open"
            entry = self.texts[event.event_id]
            index = event.delta.index or 0
            entry[index] = entry.get(index, "") + event.delta.content.text
            self.deltas += 1

    def text(self, preview: str) -> str:
        entry = self.texts.get(preview, {})
        return "".join(entry[index] for index in sorted(entry))


async def read_until(stream: Any, seen: list[Any], previews: Previews, done: Callable[[], bool]) -> None:
    async for event in stream:
        seen.append(event)
        previews.feed(event)
        if done():
            return


DELTAS_BEFORE_EACH_KILL = 5


async def relay_then_gateway_killed(
    client_a: Any,
    client_b: Any,
    session_id: str,
    kill_relay: Callable[[], Awaitable[None]],
    kill_gateway: Callable[[], Awaitable[None]],
    within: float,
) -> list[Any]:
    """Stream a session's reply through gateway A (`client_a`), kill the relay that holds its live text after a few
    deltas, then gateway A after a few more, reopen the stream on gateway B (`client_b`) and list what was missed,
    as a client does; then check what the client saw. The log, as gateway B lists it at the end."""
    seen_a: list[Any] = []
    shown_a = Previews()
    # Once `stream()` returns, the stream's place in the log is fixed (before its response started); no wait for its
    # relay subscriptions: a relay hands a late subscriber the text it holds first, so no delta is missed.
    stream_a = await client_a.beta.sessions.events.stream(session_id, event_deltas=["agent.message"])
    reading = asyncio.create_task(
        read_until(stream_a, seen_a, shown_a, lambda: shown_a.deltas >= DELTAS_BEFORE_EACH_KILL)
    )
    await client_a.beta.sessions.events.send(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]
    )
    await asyncio.wait_for(reading, within)
    [preview] = list(shown_a.texts)
    await kill_relay()  # the relay holding the session's live text, mid-reply
    at_relay_kill = shown_a.text(preview)
    after = shown_a.deltas + DELTAS_BEFORE_EACH_KILL
    await asyncio.wait_for(read_until(stream_a, seen_a, shown_a, lambda: shown_a.deltas >= after), within)
    at_gateway_kill = shown_a.text(preview)
    await kill_gateway()  # and then the gateway the client streams through
    with contextlib.suppress(Exception):  # whatever the SDK makes of a connection that died
        async for event in stream_a:
            seen_a.append(event)
            shown_a.feed(event)
    shown_at_a = shown_a.text(preview)
    assert "agent.message" not in [e.type for e in seen_a], "gateway A died before the reply was written"

    # Gateway B: the client reopens its stream there, then lists what it missed.
    seen_b: list[Any] = []
    shown_b = Previews()
    async with await client_b.beta.sessions.events.stream(session_id, event_deltas=["agent.message"]) as stream_b:
        listed = [event async for event in client_b.beta.sessions.events.list(session_id, limit=1000)]
        await asyncio.wait_for(
            read_until(stream_b, seen_b, shown_b, lambda: seen_b[-1].type == "session.status_idle"), 2 * within
        )
    log = [event async for event in client_b.beta.sessions.events.list(session_id, limit=1000)]

    [message] = [event for event in log if event.type == "agent.message"]
    final = "".join(getattr(block, "text", "") for block in message.content)
    assert preview == message.id == message_id_of(next(e.id for e in log if e.type == "span.model_request_start"))
    # Through gateway A: the text grew after the relay died (the other relay took over), never repeated a piece.
    assert at_relay_kill and len(at_relay_kill) < len(at_gateway_kill), "no live text after the relay died"
    assert final.startswith(shown_at_a), f"gateway A showed {shown_at_a!r}: not the reply once, in order"
    assert len(shown_at_a) < len(final), "the reply was still being written when gateway A died"
    # Through gateway B: the preview starts over with the text so far, then goes on; it ends as the message.
    assert list(shown_b.texts) == [message.id], "gateway B opened the same preview"
    assert shown_b.text(message.id) == final, "the preview assembled through gateway B is the message"
    # Log events: every one once, in the log's order (the client drops ids it has already seen).
    for stream_events in (seen_a, seen_b):
        ids = [e.id for e in stream_events if e.type not in ("event_start", "event_delta")]
        assert len(ids) == len(set(ids)), "a stream sent a log event twice"
    shown_ids: list[str] = []
    for event in seen_a + listed + seen_b:
        if event.type not in ("event_start", "event_delta") and event.id not in shown_ids:
            shown_ids.append(event.id)
    assert shown_ids == [event.id for event in log], "the log events seen are the whole log, in order"
    assert log[-1].type == "session.status_idle"
    return log
