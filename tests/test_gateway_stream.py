"""The gateway's event stream beyond the log: live previews (`event_deltas[]`) from corral's stream relay, and
gateways that die mid-stream without the client losing or repeating an event. Real gateway processes, the real
Temporal dev server, the offline model server and the real relay, driven by the official `anthropic` SDK."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.lib.sessions import accumulate_managed_agents_event

from corral.apikeys import create_key
from corral.contract.events import (
    ModelUsage,
    SpanModelRequestEnd,
    SpanModelRequestStart,
    message_id_of,
    thinking_id_of,
)
from corral.records import Records
from gateway.previews import Previews
from relay import StreamEvent
from tests.chaos._processes import RoleProcess, role_process, until_healthy
from tests.conftest import Stack
from tests.ports import free_port
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

LONG_TEXT = " ".join(f"word{n}" for n in range(40))


class Gateways:
    """Gateway processes started on demand against the test stack (with the stack's relay for previews)."""

    def __init__(self, stack: Stack, tmp_path: Path) -> None:
        self.stack, self.tmp_path = stack, tmp_path
        self.records = Records(stack.client, task_queue=stack.harness_queue)
        self.processes: list[RoleProcess] = []
        self.exits = contextlib.ExitStack()

    async def start(self, name: str) -> tuple[str, RoleProcess]:
        port = free_port()
        address = self.stack.client.service_client.config.target_host
        argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
                "--harness-queue", self.stack.harness_queue, "--model-queue", self.stack.model_queue,
                "--stream-url", str(self.stack.stream_relay.base_url)]  # fmt: skip
        process = self.exits.enter_context(role_process(name, argv, self.tmp_path))
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        return url, process

    async def client(self, url: str, workspace: str) -> anthropic.AsyncAnthropic:
        key, _ = await create_key(self.records, workspace)
        return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


@pytest.fixture
async def gateways(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateways]:
    started = Gateways(stack, tmp_path)
    with started.exits:
        yield started


async def session_for(client: anthropic.AsyncAnthropic, model: str) -> Any:
    agent = await client.beta.agents.create(name="streamer", model=model)
    environment = await client.beta.environments.create(name="plain")
    return await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)


async def read_until(stream: Any, seen: list[Any], done: Callable[[Any], bool]) -> None:
    async for event in stream:
        seen.append(event)
        if done(event):
            return


def idle(event: Any) -> bool:
    return bool(event.type == "session.status_idle")


async def relay_followed(stack: Stack, session_id: str) -> None:
    """Until the gateway follows the session's live text at the relay: its previews are live from here on. (The
    stream's place in the log is fixed before its response starts, that is when the SDK's `stream()` returns.)"""
    hub = stack.stream_relay.hub
    await until(lambda: hub.subscriber_count(session_id) >= 1, "the gateway subscribed to the session at the relay")


async def stream_one_turn(stack: Stack, client: anthropic.AsyncAnthropic, session_id: str, text: str) -> list[Any]:
    """Open a stream with agent.message previews, send one message, read until the session is idle."""
    seen: list[Any] = []
    async with await client.beta.sessions.events.stream(session_id, event_deltas=["agent.message"]) as stream:
        reading = asyncio.create_task(read_until(stream, seen, idle))
        await relay_followed(stack, session_id)
        await client.beta.sessions.events.send(
            session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
        )
        await asyncio.wait_for(reading, 60)
    return seen


class PreviewingClient:
    """What a client following the documented rules shows: `event_start` (re)starts a preview, empty; a delta
    appends to its entry `index`; the request's `span.model_request_end` concludes it (the buffered message
    follows)."""

    def __init__(self) -> None:
        self.open: dict[str, dict[int, str]] = {}
        self.concluded: list[tuple[str, str]] = []  # (preview id, the text it showed when it ended)
        self.starts: list[str] = []

    def feed(self, event: Any) -> None:
        if event.type == "event_start" and event.event.type == "agent.message":
            self.starts.append(event.event.id)
            self.open[event.event.id] = {}
        elif event.type == "event_delta":
            assert event.event_id in self.open, f"a delta for preview {event.event_id} that is not open"
            entry = self.open[event.event_id]
            index = event.delta.index or 0
            entry[index] = entry.get(index, "") + event.delta.content.text
        elif event.type == "span.model_request_end" and message_id_of(event.model_request_start_id) in self.open:
            preview = message_id_of(event.model_request_start_id)
            shown = self.open.pop(preview)
            self.concluded.append((preview, "".join(shown[i] for i in sorted(shown))))


async def test_previews_show_the_message_as_it_is_written_then_the_message_concludes_them(
    stack: Stack, gateways: Gateways
) -> None:
    url, _ = await gateways.start("gateway")
    client = await gateways.client(url, "team-stream")
    model = stack.script([{"text": LONG_TEXT, "first_token_latency": 0.3, "tokens_per_second": 40}, {"text": "ok"}])
    session = await session_for(client, model)
    seen = await stream_one_turn(stack, client, session.id, "go")

    types = [event.type for event in seen]
    [span] = [event for event in seen if event.type == "span.model_request_start"]
    [message] = [event for event in seen if event.type == "agent.message"]
    starts = [event for event in seen if event.type == "event_start"]
    assert [(s.event.type, s.event.id) for s in starts] == [("agent.message", message.id)], (
        "one preview, carrying the id of the message it previews"
    )
    assert message.id == message_id_of(span.id), "the message's id is made from its request's"
    deltas = [event for event in seen if event.type == "event_delta"]
    assert len(deltas) > 1, "the text came in pieces while the model wrote it"
    assert {d.event_id for d in deltas} == {message.id} and {d.delta.index for d in deltas} == {0}
    assert "".join(d.delta.content.text for d in deltas) == LONG_TEXT == message.content[0].text
    end = types.index("span.model_request_end")
    assert types.index("event_start") < types.index("event_delta") < end < types.index("agent.message")
    assert types.index("span.model_request_start") < types.index("event_start")
    shown = PreviewingClient()
    for event in seen:
        shown.feed(event)
    assert shown.concluded == [(message.id, LONG_TEXT)] and not shown.open
    # The SDK's own helper folds the previews into a snapshot of the message, which the message then replaces.
    snapshot = None
    for event in seen[: types.index("span.model_request_end")]:
        snapshot = accumulate_managed_agents_event(snapshot, event)
    assert snapshot is not None and (snapshot.id, snapshot.content[0].text) == (message.id, LONG_TEXT)

    listed = [event.type async for event in client.beta.sessions.events.list(session.id)]
    assert "event_start" not in listed and "event_delta" not in listed, "previews never reach the log"
    plain: list[Any] = []
    async with await client.beta.sessions.events.stream(session.id) as stream:  # it holds what is written from now
        reading = asyncio.create_task(read_until(stream, plain, idle))
        await client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "again"}]}]
        )
        await asyncio.wait_for(reading, 60)
    assert "agent.message" in [e.type for e in plain]
    assert not [e for e in plain if e.type in ("event_start", "event_delta")], "no previews unless asked for"
    with pytest.raises(anthropic.BadRequestError, match="event_deltas"):
        await client.beta.sessions.events.stream(session.id, event_deltas=["agent.tool_use"])  # type: ignore[list-item]


async def test_a_retried_model_request_never_shows_the_client_text_twice(stack: Stack, gateways: Gateways) -> None:
    url, _ = await gateways.start("gateway")
    client = await gateways.client(url, "team-retry")
    model = stack.script([{"text": LONG_TEXT, "fail_mid_stream": True, "tokens_per_second": 40}])
    session = await session_for(client, model)
    seen = await stream_one_turn(stack, client, session.id, "go")

    spans = [event.id for event in seen if event.type == "span.model_request_start"]
    assert len(spans) == 2, "the first attempt failed mid-stream and was retried"
    [message] = [event for event in seen if event.type == "agent.message"]
    assert message.content[0].text == LONG_TEXT
    shown = PreviewingClient()
    for event in seen:
        shown.feed(event)
    assert not shown.open, "every preview was concluded by its request's span.model_request_end"
    assert shown.concluded, "the failed attempt's text was previewed"
    assert set(shown.starts) <= {message_id_of(span) for span in spans}, "a preview is its request's message's"
    for preview, text in shown.concluded:
        assert LONG_TEXT.startswith(text), f"preview {preview} showed {text!r}: not the answer once, in order"
    [(failed, partial), retried] = shown.concluded
    assert failed == message_id_of(spans[0]) and partial and partial != LONG_TEXT, "the failed attempt's part"
    assert retried == (message.id, LONG_TEXT), "the retry: a new preview with the text so far whole, then the rest"
    assert message.id == message_id_of(spans[1]), "the message is the retry's, whose preview carried its id"


def test_a_reset_restarts_the_preview_and_thinking_opens_its_own() -> None:
    """The relay's `reset` (a retried attempt wrote other text than was shown) and thinking, which the offline
    model does not produce: the `Previews` rules alone, fed what the relay and the log would give."""
    span = "sevt_" + "1" * 32
    previews = Previews({"agent.message", "agent.thinking"})
    previews.log(SpanModelRequestStart(id=span, created_at=datetime.now(UTC), position=1))
    frames = previews.live(StreamEvent("delta", span, 0, "thinking", "hmm"))
    assert frames == [{"type": "event_start", "event": {"type": "agent.thinking", "id": thinking_id_of(span)}}]
    assert previews.live(StreamEvent("delta", span, 0, "thinking", " more")) == [], "thinking previews: start only"
    frames = previews.live(StreamEvent("delta", span, 1, "text", "Hello"))
    assert [f["type"] for f in frames] == ["event_start", "event_delta"]
    assert frames[1]["delta"] == {"type": "content_delta", "content": {"type": "text", "text": "Hello"}, "index": 0}
    frames = previews.live(StreamEvent("reset", span))
    assert frames == [{"type": "event_start", "event": {"type": "agent.message", "id": message_id_of(span)}}]
    frames = previews.live(StreamEvent("delta", span, 1, "text", "Bye"))
    assert [f["type"] for f in frames] == ["event_delta"] and frames[0]["delta"]["content"]["text"] == "Bye"
    previews.log(SpanModelRequestEnd(id="sevt_" + "2" * 32, created_at=datetime.now(UTC), position=2,
                                     model_request_start_id=span, model_usage=ModelUsage()))  # fmt: skip
    assert previews.live(StreamEvent("delta", span, 1, "text", "late")) == [], "the message has the text"


async def test_a_gateway_killed_mid_stream_loses_nothing_the_next_one_serves(stack: Stack, gateways: Gateways) -> None:
    first, first_process = await gateways.start("gateway-1")
    second, _ = await gateways.start("gateway-2")
    model = stack.script([{"text": LONG_TEXT, "first_token_latency": 0.5, "tokens_per_second": 15}])
    client = await gateways.client(first, "team-kill")
    session = await session_for(client, model)

    shown: list[Any] = []  # what the client shows, each event once (the SDK runner's de-duplication by id)
    ids: set[str] = set()

    def show(event: Any) -> None:
        if event.type not in ("event_start", "event_delta") and event.id not in ids:  # previews have no id
            ids.add(event.id)
            shown.append(event)

    before: list[Any] = []
    stream = await client.beta.sessions.events.stream(session.id, event_deltas=["agent.message"])
    reading = asyncio.create_task(read_until(stream, before, lambda e: e.type == "event_delta"))
    await relay_followed(stack, session.id)
    await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]
    )
    await asyncio.wait_for(reading, 60)
    for event in before:
        show(event)
    first_process.kill()  # mid-turn: the model is still writing, the client has part of the text
    with contextlib.suppress(Exception):  # whatever the SDK makes of a connection that died
        async for event in stream:
            show(event)
    assert "agent.message" not in [e.type for e in shown], "the gateway died before the turn ended"

    again = await gateways.client(second, "team-kill")
    after: list[Any] = []
    async with await again.beta.sessions.events.stream(session.id, event_deltas=["agent.message"]) as resumed:
        # Opened (its place in the log fixed), then listed: together they hold every event.
        reading = asyncio.create_task(read_until(resumed, after, idle))
        for event in [e async for e in again.beta.sessions.events.list(session.id, limit=1000)]:
            show(event)
        await asyncio.wait_for(reading, 60)
    for event in after:
        show(event)

    log = [e async for e in again.beta.sessions.events.list(session.id, limit=1000)]
    assert [e.id for e in shown] == [e.id for e in log], "every event once, in the log's order: no gap, no repeat"
    assert shown[-1].type == "session.status_idle"
    [span] = [e.id for e in log if e.type == "span.model_request_start"]
    previewed = PreviewingClient()
    for event in after:
        previewed.feed(event)
    assert previewed.concluded == [(message_id_of(span), LONG_TEXT)], "the new gateway's: text so far, then the rest"
    assert [e.content[0].text for e in shown if e.type == "agent.message"] == [LONG_TEXT]
