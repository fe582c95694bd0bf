"""Live deltas: text reaches a subscribed client while the turn runs, never through history, once per turn."""

from __future__ import annotations

import asyncio
import contextlib
import time

from corral.contract.events import SpanModelRequestStart
from relay import StreamEvent, subscribe
from tests.conftest import Stack, history_text, read_events, texts, wait_for_idle
from tests.waits import until

LONG_TEXT = " ".join(f"word{n}" for n in range(40))


async def _collect(stack: Stack, session_id: str, into: list[tuple[float, StreamEvent]]) -> None:
    async for event in subscribe(str(stack.stream_relay.base_url), session_id):
        into.append((time.monotonic(), event))


async def _subscribed(stack: Stack, session_id: str) -> None:
    """Until the relay counts the test's subscriber: what is published from here on reaches it live."""
    hub = stack.stream_relay.hub
    await until(lambda: hub.subscriber_count(session_id) == 1, "subscribed at the relay")


async def _ended(received: list[tuple[float, StreamEvent]]) -> None:
    """Until the reply's `end` reached the subscriber (the turn's idle in the log may come first)."""
    await until(lambda: any(event.type == "end" for _, event in received), "the live reply's end")


async def test_text_deltas_reach_the_client_while_the_turn_runs(stack: Stack) -> None:
    model = stack.script([{"text": LONG_TEXT, "first_token_latency": 0.3, "tokens_per_second": 40}])
    handle = await stack.start(model)
    received: list[tuple[float, StreamEvent]] = []
    listener = asyncio.create_task(_collect(stack, handle.id, received))
    try:
        await _subscribed(stack, handle.id)
        sent = time.monotonic()
        await handle.signal("user_message", {"content": "go"})
        events = await wait_for_idle(handle, within_seconds=30)
        idle_at = time.monotonic()
        await _ended(received)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    deltas = [(at, event) for at, event in received if event.type == "delta"]
    assert deltas, "no live delta reached the client"
    assert "".join(event.text for _, event in deltas) == LONG_TEXT == texts(events)[0]
    first_delta_at = deltas[0][0]
    assert sent < first_delta_at < idle_at, "the first delta must arrive before the turn ends"
    assert len(deltas) > 1, "the text came in pieces as the model wrote it, not at once"
    [span] = [e for e in events if isinstance(e, SpanModelRequestStart)]
    assert {event.span_id for _, event in received} == {span.id}
    history = await history_text(handle)
    assert history.count("word39") == 1, "deltas must never go through workflow history (only the agent.message)"


async def test_a_retried_attempt_does_not_show_a_second_copy(stack: Stack) -> None:
    model = stack.script([{"text": LONG_TEXT, "fail_mid_stream": True, "tokens_per_second": 200}])
    handle = await stack.start(model)
    received: list[tuple[float, StreamEvent]] = []
    listener = asyncio.create_task(_collect(stack, handle.id, received))
    try:
        await _subscribed(stack, handle.id)
        await handle.signal("user_message", {"content": "go"})
        events = await wait_for_idle(handle, within_seconds=30)
        await _ended(received)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    assert [e.type for e in events].count("span.model_request_start") == 2, "the first attempt failed mid-stream"
    shown = "".join(event.text for _, event in received if event.type == "delta")
    assert shown == LONG_TEXT, "the client must see the answer once, not the failed attempt's part plus a copy"
    assert not [event for _, event in received if event.type == "reset"]
    assert texts(await read_events(handle)) == [LONG_TEXT]
