"""Live token streaming: the hub's rules with a fake clock, then the relay over real HTTP (publisher, SSE
subscribers, reconnects, retries, auth, a relay that is down or stuck)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest

from relay import (
    DeltaRecord,
    EndRecord,
    InvalidSinceError,
    StartRecord,
    StreamAuthError,
    StreamEvent,
    StreamHub,
    StreamMessage,
    StreamPublisher,
    StreamRelayThread,
    create_stream_app,
    subscribe,
)
from relay.protocol import parse_event_id
from tests.ports import closed_port, free_port

# ---- hub: pure state machine --------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_hub(**options: Any) -> tuple[StreamHub, FakeClock]:
    clock = FakeClock()
    return StreamHub(clock=clock, seq_origin=0, **options), clock


def start(span: str, attempt: int = 1) -> StartRecord:
    return StartRecord(span_id=span, attempt=attempt)


def delta(span: str, attempt: int, seq: int, text: str, block: int = 0, kind: str = "text") -> DeltaRecord:
    return DeltaRecord.model_validate(
        {"span_id": span, "attempt": attempt, "seq": seq, "block": block, "kind": kind, "text": text}
    )


def end(span: str, attempt: int = 1) -> EndRecord:
    return EndRecord(span_id=span, attempt=attempt)


def play(hub: StreamHub, session: str, span: str, attempt: int, pieces: list[str], *, finish: bool = True) -> list:
    """Publish one attempt; returns the payloads of every message it produced."""
    out = [m.data for m in hub.publish(session, start(span, attempt))]
    for seq, piece in enumerate(pieces):
        out += [m.data for m in hub.publish(session, delta(span, attempt, seq, piece))]
    if finish:
        out += [m.data for m in hub.publish(session, end(span, attempt))]
    return out


def shown(payloads: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """What a client applying these payloads by offset ends up showing, checking there is no gap."""
    text: dict[tuple[str, int], str] = {}
    for data in payloads:
        if data["type"] == "reset":
            text = {k: v for k, v in text.items() if k[0] != data["span_id"]}
        elif data["type"] == "delta":
            key = (data["span_id"], data["block"])
            have = text.get(key, "")
            assert data["offset"] <= len(have), f"gap: {data} after {have!r}"
            text[key] = have[: data["offset"]] + data["text"]
    return text


def test_hub_forwards_first_attempt_with_offsets() -> None:
    hub, _ = make_hub()
    out = play(hub, "s", "sp", 1, ["Hel", "lo", " world"])
    assert [(d["type"], d.get("offset"), d.get("text")) for d in out] == [
        ("delta", 0, "Hel"),
        ("delta", 3, "lo"),
        ("delta", 5, " world"),
        ("end", None, None),
    ]
    assert out[0] == {"type": "delta", "span_id": "sp", "block": 0, "kind": "text", "text": "Hel", "offset": 0}


def test_hub_retry_with_identical_text_forwards_nothing_new() -> None:
    hub, _ = make_hub()
    play(hub, "s", "sp", 1, ["Hello", " wor"], finish=False)  # the worker is lost mid-stream
    # The retry chunks the same text differently; none of it is new.
    assert play(hub, "s", "sp", 2, ["He", "llo w", "or"], finish=False) == []
    out = play(hub, "s", "sp", 2, [], finish=False) + [m.data for m in hub.publish("s", delta("sp", 2, 3, "ld!"))]
    assert out == [{"type": "delta", "span_id": "sp", "block": 0, "kind": "text", "text": "ld!", "offset": 9}]


def test_hub_retry_forwards_only_the_excess_of_a_straddling_delta() -> None:
    hub, _ = make_hub()
    first = play(hub, "s", "sp", 1, ["Hello", " wor"], finish=False)
    second = play(hub, "s", "sp", 2, ["Hel", "lo world", "!"])
    assert [(d["type"], d.get("offset"), d.get("text")) for d in second] == [
        ("delta", 9, "ld"),
        ("delta", 11, "!"),
        ("end", None, None),
    ]
    assert shown(first + second) == {("sp", 0): "Hello world!"}


def test_hub_divergent_retry_resets_then_sends_new_text_from_zero() -> None:
    hub, _ = make_hub()
    first = play(hub, "s", "sp", 1, ["The answer", " is 41"], finish=False)
    second = play(hub, "s", "sp", 2, ["The answer", " is 42", " exactly"])
    assert [d["type"] for d in second] == ["reset", "delta", "delta", "end"]
    assert second[1]["offset"] == 0 and second[1]["text"] == "The answer is 42"
    assert second[2]["offset"] == len("The answer is 42")
    assert shown(first + second) == {("sp", 0): "The answer is 42 exactly"}


def test_hub_retry_that_ends_short_resets_to_its_own_text() -> None:
    hub, _ = make_hub()
    first = play(hub, "s", "sp", 1, ["Hello world"], finish=False)
    second = play(hub, "s", "sp", 2, ["Hello"])
    assert [d["type"] for d in second] == ["reset", "delta", "end"]
    assert shown(first + second) == {("sp", 0): "Hello"}


def test_hub_retry_across_thinking_and_text_blocks() -> None:
    hub, _ = make_hub()
    out = [m.data for m in hub.publish("s", start("sp", 1))]
    out += [m.data for m in hub.publish("s", delta("sp", 1, 0, "hmm", block=0, kind="thinking"))]
    out += [m.data for m in hub.publish("s", delta("sp", 1, 1, "Hi", block=1))]
    out += [m.data for m in hub.publish("s", start("sp", 2))]
    out += [m.data for m in hub.publish("s", delta("sp", 2, 0, "hmm", block=0, kind="thinking"))]
    assert [m.data for m in hub.publish("s", delta("sp", 2, 1, "Hi", block=1))] == []
    changed = [m.data for m in hub.publish("s", delta("sp", 2, 2, "!", block=1))]
    assert changed == [{"type": "delta", "span_id": "sp", "block": 1, "kind": "text", "text": "!", "offset": 2}]
    # A third attempt whose thinking differs voids both blocks; its thinking comes back from offset 0.
    out += changed + [m.data for m in hub.publish("s", start("sp", 3))]
    reset = [m.data for m in hub.publish("s", delta("sp", 3, 0, "hm, no", block=0, kind="thinking"))]
    assert [d["type"] for d in reset] == ["reset", "delta"]
    assert shown(out + reset) == {("sp", 0): "hm, no"}


def test_hub_ignores_stale_attempts_and_duplicate_seqs() -> None:
    hub, _ = make_hub()
    play(hub, "s", "sp", 1, ["Hello"], finish=False)
    hub.publish("s", start("sp", 2))
    assert hub.publish("s", delta("sp", 1, 1, " from the lost worker")) == []
    assert hub.publish("s", end("sp", 1)) == []
    assert hub.publish("s", start("sp", 1)) == []
    assert [m.data["text"] for m in hub.publish("s", delta("sp", 2, 0, "Hello!"))] == ["!"]
    assert hub.publish("s", delta("sp", 2, 0, "Hello!")) == []  # the same seq again
    assert [m.event for m in hub.publish("s", end("sp", 2))] == ["end"]
    assert hub.publish("s", delta("sp", 2, 1, "late")) == []  # after its own end


def ids_are_watermarks(messages: list[StreamMessage]) -> list[int]:
    seqs = [parse_event_id(m.event_id)[1] for m in messages]
    assert seqs == sorted(seqs)
    return seqs


def test_hub_catch_up_is_consolidated_and_resumable() -> None:
    hub, _ = make_hub()
    play(hub, "s", "a", 1, ["one ", "two"])
    play(hub, "s", "b", 1, ["thr", "ee"], finish=False)
    full = hub.catch_up("s", None)
    assert [m.data for m in full] == [
        {"type": "delta", "span_id": "a", "block": 0, "kind": "text", "text": "one two", "offset": 0},
        {"type": "end", "span_id": "a"},
        {"type": "delta", "span_id": "b", "block": 0, "kind": "text", "text": "three", "offset": 0},
    ]
    assert ids_are_watermarks(full)[-1] == hub.last_seq
    # Resuming after the first message of span b: only the rest of b, at the right offset.
    first_b = next(m for m in hub.publish("s", delta("b", 1, 2, " four")))
    assert first_b.data["offset"] == 5
    resumed = hub.catch_up("s", full[-1].event_id)
    assert [m.data for m in resumed] == [first_b.data]
    assert hub.catch_up("s", first_b.event_id) == []


def test_hub_catch_up_after_a_reset_resends_the_span() -> None:
    hub, _ = make_hub()
    play(hub, "s", "sp", 1, ["old text"], finish=False)
    before = hub.catch_up("s", None)[-1].event_id
    play(hub, "s", "sp", 2, ["new"])
    for since in (None, before):
        assert [m.data["type"] for m in hub.catch_up("s", since)] == ["reset", "delta", "end"]


def test_hub_catch_up_ids_stay_safe_when_spans_interleave() -> None:
    hub, _ = make_hub()
    hub.publish("s", start("a"))
    hub.publish("s", start("b"))
    for seq in range(3):
        hub.publish("s", delta("a", 1, seq, f"a{seq}"))
        hub.publish("s", delta("b", 1, seq, f"b{seq}"))
    messages = hub.catch_up("s", None)
    seqs = ids_are_watermarks(messages)
    # After span a's consolidated delta the subscriber does not yet hold b's first delta: the id must not claim it.
    assert seqs[0] < seqs[-1] == hub.last_seq
    # Resuming from each id in turn and applying by offset always rebuilds the same text.
    for cut in range(len(messages)):
        resumed = [m.data for m in messages[: cut + 1]] + [m.data for m in hub.catch_up("s", messages[cut].event_id)]
        assert shown(resumed) == {("a", 0): "a0a1a2", ("b", 0): "b0b1b2"}


def test_hub_foreign_or_malformed_since() -> None:
    hub, _ = make_hub()
    play(hub, "s", "sp", 1, ["x"])
    assert len(hub.catch_up("s", "sp/999999")) == 2  # from the future (another relay process): full catch-up
    with pytest.raises(InvalidSinceError):
        hub.catch_up("s", "no-number")


def test_hub_seq_origin_defaults_to_wall_clock() -> None:
    before = time.time_ns() // 1000
    assert StreamHub().seq_origin >= before


def test_hub_drops_ended_spans_and_idle_sessions_after_retention() -> None:
    hub, clock = make_hub(retain_seconds=120)
    play(hub, "s", "done", 1, ["a"])
    play(hub, "s", "running", 1, ["b"], finish=False)
    clock.now += 60
    hub.publish("s", delta("running", 1, 1, "c"))
    clock.now += 61
    hub.sweep()
    assert hub.span_ids("s") == ["running"]
    # Records for a span dropped from memory do not bring it back.
    assert hub.publish("s", delta("done", 1, 1, "zombie")) == []
    clock.now += 121
    hub.sweep()
    assert hub.session_ids() == []


def test_hub_bounds_spans_and_bytes_per_session() -> None:
    hub, _ = make_hub(max_spans=3, max_bytes=10_000)
    play(hub, "s", "ended", 1, ["x"])
    for name in ("a", "b", "c"):
        play(hub, "s", name, 1, ["y"], finish=False)
    assert hub.span_ids("s") == ["a", "b", "c"]  # the ended span went first
    big = "z" * 4000
    play(hub, "s", "d", 1, [big, big], finish=False)
    assert hub.session_bytes("s") <= 10_000
    assert hub.span_ids("s")[-1] == "d"
    # Other spans make room first; one span alone over budget then stops streaming instead of leaving a hole.
    assert hub.publish("s", delta("d", 1, 2, big)) == []
    assert hub.publish("s", delta("d", 1, 3, "tail")) == []
    assert hub.span_ids("s") == ["d"]
    assert [m.data["text"] for m in hub.catch_up("s", None)] == [big + big]
    assert [m.event for m in hub.publish("s", end("d"))] == ["end"]


def test_hub_bounds_sessions() -> None:
    hub, _ = make_hub(max_sessions=2)
    for name in ("s1", "s2", "s3"):
        play(hub, name, "sp", 1, ["x"])
    assert hub.session_ids() == ["s2", "s3"]


def test_hub_subscription_overflow_and_isolation() -> None:
    hub, _ = make_hub(queue_limit=3)
    wakes: list[int] = []
    _, sub = hub.subscribe("s", None, wake=lambda: wakes.append(1))
    _, other = hub.subscribe("t")
    play(hub, "s", "sp", 1, ["a", "b"], finish=False)
    assert [m.data["text"] for m in sub.drain()] == ["a", "b"] and wakes
    play(hub, "s", "sp2", 1, ["c", "d", "e", "f"], finish=False)
    assert sub.overflowed and sub.drain() == []
    assert other.drain() == []
    hub.unsubscribe(sub)
    assert hub.subscriber_count("s") == 0


# ---- relay over real HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay() -> Iterator[StreamRelayThread]:
    with StreamRelayThread() as server:
        yield server


def new_session() -> str:
    return f"sesn_{uuid.uuid4().hex[:12]}"


def ndjson(*records: Any) -> bytes:
    return b"".join(r.model_dump_json().encode() + b"\n" for r in records)


class Collector:
    """Follows a session with `subscribe()` in a task and rebuilds the text, failing on any gap."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []
        self.text: dict[tuple[str, int], str] = {}

    def apply(self, event: StreamEvent) -> None:
        self.events.append(event)
        if event.type == "reset":
            self.text = {k: v for k, v in self.text.items() if k[0] != event.span_id}
        elif event.type == "delta":
            assert event.block is not None
            key = (event.span_id, event.block)
            have = self.text.get(key, "")
            assert event.offset == len(have), f"gap or overlap at {event} after {have!r}"
            self.text[key] = have + event.text

    def ended(self, span: str) -> bool:
        return any(e.type == "end" and e.span_id == span for e in self.events)

    def has_text(self, span: str) -> bool:
        return any(e.type == "delta" and e.span_id == span for e in self.events)


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@asynccontextmanager
async def following(base_url: str, session: str, **options: Any) -> AsyncIterator[Collector]:
    collector = Collector()

    async def run() -> None:
        async with aclosing(subscribe(base_url, session, **options)) as events:
            async for event in events:
                collector.apply(event)

    task = asyncio.create_task(run())
    try:
        yield collector
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def test_publish_and_subscribe_in_order_while_the_attempt_runs(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    words = [f"word{i} " for i in range(200)]
    async with StreamPublisher(url) as publisher, following(url, session) as seen:
        async with publisher.attempt(session, "sp", 1) as pub:
            await pub.delta(0, "thinking", "let me think")
            for word in words:
                await pub.delta(1, "text", word)
            await wait_for(lambda: seen.text.get(("sp", 1)) == "".join(words))
            assert not seen.ended("sp")  # the attempt is still open: this text arrived live
        await wait_for(lambda: seen.ended("sp"))
    assert seen.text == {("sp", 0): "let me think", ("sp", 1): "".join(words)}
    assert next(e.kind for e in seen.events if e.type == "delta") == "thinking"


async def test_first_delta_arrives_before_the_publish_request_finishes(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    release = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield ndjson(start("sp"), delta("sp", 1, 0, "first"))
        await release.wait()
        yield ndjson(delta("sp", 1, 1, " second"), end("sp"))

    async with httpx.AsyncClient() as client, following(url, session) as seen:
        post = asyncio.create_task(client.post(f"{url}/v1/streams/{session}/publish", content=body()))
        await wait_for(lambda: seen.has_text("sp"))
        assert not post.done()
        release.set()
        response = await post
        assert response.status_code == 200 and response.json() == {"accepted": 4}
        await wait_for(lambda: seen.ended("sp"))
    assert seen.text == {("sp", 0): "first second"}


def ends_with(seen: Collector, text: str) -> bool:
    return seen.text.get(("sp", 0), "").endswith(text)


async def test_deltas_that_come_soon_after_a_write_go_in_the_next_one(relay: StreamRelayThread) -> None:
    session, control, url = new_session(), new_session(), relay.start()
    async with (
        StreamPublisher(url, flush_seconds=5.0) as publisher,
        StreamPublisher(url, flush_seconds=0) as unbatched,
        following(url, session) as seen,
        following(url, control) as seen_control,
    ):
        async with publisher.attempt(session, "sp", 1) as pub, unbatched.attempt(control, "sp", 1) as other:
            await pub.delta(0, "text", "first")
            await wait_for(lambda: seen.has_text("sp"))  # the first delta is not held back by the flush interval
            for piece in (" second", " third", " fourth"):
                await pub.delta(0, "text", piece)
                await other.delta(0, "text", piece)
                # A write made after this piece came in has reached a reader: without the interval, it went alone.
                await wait_for(partial(ends_with, seen_control, piece))
        await wait_for(lambda: seen.ended("sp"))
    assert [e.text for e in seen.events if e.type == "delta"] == ["first", " second third fourth"]
    assert [e.text for e in seen_control.events if e.type == "delta"] == [" second", " third", " fourth"]


async def test_sessions_are_isolated(relay: StreamRelayThread) -> None:
    one, two, url = new_session(), new_session(), relay.start()
    async with StreamPublisher(url) as publisher, following(url, one) as seen_one, following(url, two) as seen_two:
        for session, text in ((one, "for one"), (two, "for two")):
            async with publisher.attempt(session, "sp", 1) as pub:
                await pub.delta(0, "text", text)
        await wait_for(lambda: seen_one.ended("sp") and seen_two.ended("sp"))
    assert seen_one.text == {("sp", 0): "for one"}
    assert seen_two.text == {("sp", 0): "for two"}


async def test_json_array_batch_and_invalid_records(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    publish_url = f"{url}/v1/streams/{session}/publish"
    async with httpx.AsyncClient() as client:
        batch = [start("sp").model_dump(), delta("sp", 1, 0, "batched").model_dump(), end("sp").model_dump()]
        response = await client.post(publish_url, content=json.dumps(batch))
        assert response.json() == {"accepted": 3}
        bad = ndjson(start("sp2")) + b'{"type": "delta", "span_id": "sp2"}\n'
        response = await client.post(publish_url, content=bad)
        assert response.status_code == 400 and response.json()["line"] == 2
        assert (await client.post(publish_url, content=b"[1]")).status_code == 400
        assert (await client.get(f"{url}/v1/streams/{session}", params={"since": "nope"})).status_code == 400
    async with following(url, session) as seen:
        await wait_for(lambda: seen.ended("sp"))
    assert seen.text == {("sp", 0): "batched"}


class SseReader:
    """Reads SSE messages off one response as {"event", "id", "data"}, skipping comments."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def take(self, count: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        current: dict[str, Any] = {}
        async for line in self._lines:
            if not line:
                if current:
                    messages.append(current)
                    current = {}
                    if len(messages) == count:
                        return messages
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                current[name] = json.loads(value) if name == "data" else value
        raise AssertionError(f"stream ended after {messages}")


async def test_reconnect_gets_consolidated_catch_up_then_live_without_gap_or_duplicate(
    relay: StreamRelayThread,
) -> None:
    session, url = new_session(), relay.start()
    publish_url, stream_url = f"{url}/v1/streams/{session}/publish", f"{url}/v1/streams/{session}"
    pieces = [f"p{i} " for i in range(12)]
    async with httpx.AsyncClient() as client:
        await client.post(publish_url, content=ndjson(start("sp"), *[delta("sp", 1, i, pieces[i]) for i in range(3)]))
        async with client.stream("GET", stream_url) as response:
            first = await SseReader(response).take(1)  # a consolidated catch-up of the three pieces
        assert first[0]["event"] == "delta" and first[0]["data"]["text"] == "".join(pieces[:3])
        assert first[0]["id"].startswith("sp/")
        # While disconnected, more text arrives; then the client resumes (once by query, once by header).
        await client.post(publish_url, content=ndjson(*[delta("sp", 1, i, pieces[i]) for i in range(3, 6)]))
        resumed_text = ""
        async with client.stream("GET", stream_url, params={"since": first[0]["id"]}) as response:
            reader = SseReader(response)
            caught_up = await reader.take(1)
            assert caught_up[0]["data"]["offset"] == len("".join(pieces[:3]))
            resumed_text = caught_up[0]["data"]["text"]
            await client.post(publish_url, content=ndjson(*[delta("sp", 1, i, pieces[i]) for i in range(6, 9)]))
            live = await reader.take(3)
        assert [m["data"]["offset"] for m in live] == [len("".join(pieces[:i])) for i in range(6, 9)]
        resumed_text += "".join(m["data"]["text"] for m in live)
        await client.post(publish_url, content=ndjson(*[delta("sp", 1, i, pieces[i]) for i in range(9, 12)]))
        await client.post(publish_url, content=ndjson(end("sp")))
        async with client.stream("GET", stream_url, headers={"Last-Event-ID": live[-1]["id"]}) as response:
            rest = await SseReader(response).take(2)
        assert [m["event"] for m in rest] == ["delta", "end"]
        resumed_text += rest[0]["data"]["text"]
    assert first[0]["data"]["text"] + resumed_text == "".join(pieces)


async def test_subscriber_that_falls_behind_is_dropped_and_resumes_seamlessly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = new_session()
    with StreamRelayThread(create_stream_app(hub=StreamHub(queue_limit=4))) as small:
        url = small.start()
        texts = [f"t{i:03d}," for i in range(300)]
        with caplog.at_level(logging.INFO, logger="relay"):
            async with httpx.AsyncClient() as client, following(url, session, retry_delay=0.01) as seen:
                await wait_for(lambda: small.hub.subscriber_count(session) == 1)
                for batch in range(0, 300, 30):  # bursts larger than the subscriber queue
                    records = [delta("sp", 1, i, texts[i]) for i in range(batch, batch + 30)]
                    await client.post(f"{url}/v1/streams/{session}/publish", content=ndjson(*records))
                await client.post(f"{url}/v1/streams/{session}/publish", content=ndjson(end("sp")))
                await wait_for(lambda: seen.ended("sp"))
        assert any("fell behind" in r.getMessage() for r in caplog.records)
    assert seen.text == {("sp", 0): "".join(texts)}  # Collector.apply already failed on any gap or overlap


async def test_retried_attempt_with_identical_text_is_shown_once(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    async with StreamPublisher(url) as publisher, following(url, session) as seen:
        async with publisher.attempt(session, "sp", 1) as pub:
            await pub.delta(0, "text", "The quick brown")
            await wait_for(lambda: seen.has_text("sp"))
        async with publisher.attempt(session, "sp", 2) as pub:
            for piece in ("The ", "quick brown", " fox"):
                await pub.delta(0, "text", piece)
        await wait_for(lambda: seen.text.get(("sp", 0)) == "The quick brown fox" and len(seen.events) >= 4)
        # A span published after: once its end is in, whatever else the retry made the relay send is in too.
        async with publisher.attempt(session, "after", 1) as pub:
            await pub.delta(0, "text", "done")
        await wait_for(lambda: seen.ended("after"))
    shown = [e for e in seen.events if e.span_id == "sp"]
    assert [e.type for e in shown] == ["delta", "end", "delta", "end"]
    assert shown[2].text == " fox"


async def test_retried_attempt_with_different_text_resets_first(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    async with StreamPublisher(url) as publisher, following(url, session) as seen:
        async with publisher.attempt(session, "sp", 1) as pub:
            await pub.delta(0, "text", "Roses are red")
            await wait_for(lambda: seen.has_text("sp"))
        async with publisher.attempt(session, "sp", 2) as pub:
            await pub.delta(0, "text", "Violets are blue")
        await wait_for(lambda: seen.text.get(("sp", 0)) == "Violets are blue" and seen.events[-1].type == "end")
    assert [e.type for e in seen.events] == ["delta", "end", "reset", "delta", "end"]


async def test_stale_older_attempt_is_ignored(relay: StreamRelayThread) -> None:
    session, url = new_session(), relay.start()
    async with StreamPublisher(url) as publisher, following(url, session) as seen:
        old = publisher.attempt(session, "sp", 1)
        async with old:
            await old.delta(0, "text", "Hello")
            await wait_for(lambda: seen.has_text("sp"))
            async with publisher.attempt(session, "sp", 2) as new:  # Temporal retried: the old worker lives on
                await new.delta(0, "text", "Hello there")
                await wait_for(lambda: seen.text.get(("sp", 0)) == "Hello there")
                await old.delta(0, "text", " from the stale worker")
                await new.delta(0, "text", ", friend")
                await wait_for(lambda: seen.text.get(("sp", 0)) == "Hello there, friend")
        await wait_for(lambda: seen.ended("sp"))
    assert seen.text == {("sp", 0): "Hello there, friend"}


async def test_auth_is_required_when_a_token_is_set() -> None:
    session = new_session()
    with StreamRelayThread(token="s3cret-token") as guarded:
        url = guarded.start()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/healthz")).json() == {"ok": True}
            publish_url, body = f"{url}/v1/streams/{session}/publish", ndjson(start("sp"))
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
                assert (await client.post(publish_url, content=body, headers=headers)).status_code == 401
                assert (await client.get(f"{url}/v1/streams/{session}", headers=headers)).status_code == 401
        with pytest.raises(StreamAuthError):
            async with aclosing(subscribe(url, session, token="wrong")) as events:
                async for _ in events:
                    pass
        async with StreamPublisher(url, token="s3cret-token") as publisher:
            async with following(url, session, token="s3cret-token") as seen:
                async with publisher.attempt(session, "sp", 1) as pub:
                    await pub.delta(0, "text", "authorized")
                await wait_for(lambda: seen.ended("sp"))
        assert seen.text == {("sp", 0): "authorized"}
        # A publisher with a wrong token loses its live text but does not fail the turn.
        async with StreamPublisher(url, token="wrong") as publisher:
            async with publisher.attempt(session, "sp2", 1) as pub:
                await pub.delta(0, "text", "rejected")
        assert guarded.hub.span_ids(session) == ["sp"]


@pytest.mark.timeout(60)
async def test_relay_down_never_breaks_or_holds_up_the_model_call() -> None:
    with closed_port() as port:  # nothing listens there
        publisher = StreamPublisher(f"http://127.0.0.1:{port}")
        async with publisher.attempt(new_session(), "sp", 1) as pub:
            for i in range(1000):
                await pub.delta(0, "text", f"token{i} ")
        # Reaching this line is the assertion: the model-side code path returned without raising.
        await publisher.aclose()
    assert pub.dropped == 1000


@pytest.mark.timeout(60)
async def test_stuck_relay_never_breaks_or_holds_up_the_model_call() -> None:
    connections: list[asyncio.StreamWriter] = []

    async def accept_and_never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(accept_and_never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    publisher = StreamPublisher(f"http://127.0.0.1:{port}", max_pending_bytes=256 * 1024)
    chunk = "x" * 1024
    async with publisher.attempt(new_session(), "sp", 1) as pub:
        for _ in range(32 * 1024):  # 32 MB: far more than socket buffers and the pending limit together
            await pub.delta(0, "text", chunk)
            await asyncio.sleep(0)
    assert pub.dropped > 0
    await publisher.aclose(timeout=0.5)
    for writer in connections:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.mark.timeout(60)
async def test_console_script_serves_with_a_token_from_the_environment() -> None:
    port = free_port()
    env = {**os.environ, "CORRAL_STREAM_TOKEN": "env-token"}
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "--port", str(port), "--retain-seconds", "30"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert (await client.get(f"{url}/healthz")).json() == {"ok": True}
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and process.poll() is None
                    await asyncio.sleep(0.05)
            assert (await client.get(f"{url}/v1/streams/x", headers={"Authorization": "Bearer no"})).status_code == 401
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert f"listening on http://127.0.0.1:{port} (auth on, retain 30s)" in stderr
    assert "env-token" not in stderr
