"""Several stream relays, partitioned by session: the rendezvous order every publisher computes, the merge every
subscriber applies (pure rules), then a publisher and a subscriber over real HTTP with the session's first relay
down."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from contextlib import aclosing

import pytest

from gateway.__main__ import build_parser
from relay import StreamEvent, StreamPublisher, StreamRelayThread, subscribe
from relay.merge import LiveMerge
from relay.partition import relay_order, relay_urls
from tests.ports import closed_port
from tests.waits import until
from workers.settings import ModelSettings, SettingsError

RELAYS = ["http://relay-a:8766", "http://relay-b:8766", "http://relay-c:8766", "http://relay-d:8766"]
SESSIONS = [f"sesn_{n:05d}" for n in range(4000)]

# ---- the order --------------------------------------------------------------------------------------------------


def test_relay_urls_are_a_comma_separated_list_and_one_url_is_a_list_of_one() -> None:
    assert relay_urls("http://one:8766") == ("http://one:8766",)
    assert relay_urls(" http://a:1/ ,http://b:2,, http://a:1") == ("http://a:1", "http://b:2")
    assert relay_urls(["http://a:1", "http://b:2/"]) == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="no stream relay"):
        relay_urls(" , ")


def test_model_workers_and_gateways_take_a_list_of_relays() -> None:
    environ = {"ANTHROPIC_API_KEY": "test-key", "CORRAL_STREAM_URL": "http://a:8766, http://b:8766/"}
    settings = ModelSettings.from_environment(environ)
    assert StreamPublisher(settings.stream_url or "").relays == ("http://a:8766", "http://b:8766")
    for bad in ("http://a:8766,ftp://b", "a:8766", ","):
        with pytest.raises(SettingsError, match="comma-separated list"):
            ModelSettings.from_environment({**environ, "CORRAL_STREAM_URL": bad})
    parsed = build_parser().parse_args(["--stream-url", " http://a:8766/ ,http://b:8766"])
    assert parsed.stream_url == "http://a:8766,http://b:8766"


def test_the_order_does_not_depend_on_how_the_relays_are_listed() -> None:
    for session in SESSIONS[:200]:
        orders = {tuple(relay_order(session, list(listed))) for listed in itertools.permutations(RELAYS)}
        assert len(orders) == 1, f"{session}: the order changed with the list's order"
        assert sorted(next(iter(orders))) == sorted(RELAYS)


def test_removing_a_relay_moves_only_its_sessions_and_keeps_the_rest_of_each_order() -> None:
    gone = RELAYS[1]
    remaining = [url for url in RELAYS if url != gone]
    moved = 0
    for session in SESSIONS:
        before = relay_order(session, RELAYS)
        after = relay_order(session, remaining)
        assert after == [url for url in before if url != gone], "the others keep their relative order"
        if before[0] == gone:
            moved += 1
            assert after[0] == before[1], "its sessions move to their second choice"
        else:
            assert after[0] == before[0], "a session of another relay does not move"
    assert 0 < moved < len(SESSIONS) / 2


def test_sessions_spread_over_the_relays() -> None:
    firsts = [relay_order(session, RELAYS)[0] for session in SESSIONS]
    share = len(SESSIONS) / len(RELAYS)
    for url in RELAYS:
        assert 0.8 * share < firsts.count(url) < 1.2 * share, f"{url} is first for {firsts.count(url)} sessions"
    assert relay_order("sesn_x", ["http://only:1"]) == ["http://only:1"]


# ---- the merge ----------------------------------------------------------------------------------------------------


def delta(text: str, offset: int, span: str = "sp", block: int = 0, kind: str = "text") -> StreamEvent:
    return StreamEvent("delta", span, block, kind, text, offset)  # type: ignore[arg-type]


def reset(span: str = "sp", attempt: int = 0) -> StreamEvent:
    return StreamEvent("reset", span, attempt=attempt)


def end(span: str = "sp") -> StreamEvent:
    return StreamEvent("end", span)


class Shown:
    """What a consumer of the merged stream shows, checked as it goes: a delta starts where the text so far ends
    (nothing twice, no hole), a reset empties the span."""

    def __init__(self) -> None:
        self.merge = LiveMerge()
        self.text: dict[tuple[str, int], str] = {}
        self.out: list[StreamEvent] = []

    def feed(self, source: int, event: StreamEvent) -> list[StreamEvent]:
        out = self.merge.feed(source, event)
        for item in out:
            if item.type == "reset":
                for key in [key for key in self.text if key[0] == item.span_id]:
                    del self.text[key]
            elif item.type == "delta":
                key = (item.span_id, item.block or 0)
                have = self.text.get(key, "")
                assert item.offset == len(have), f"{item} after {have!r}: a repeat or a hole"
                self.text[key] = have + item.text
        self.out += out
        return out

    def __getitem__(self, key: tuple[str, int]) -> str:
        return self.text.get(key, "")


def test_one_source_passes_through() -> None:
    shown = Shown()
    assert shown.feed(0, delta("Hel", 0)) == [delta("Hel", 0)]
    assert shown.feed(0, delta("lo", 3)) == [delta("lo", 3)]
    assert shown.feed(0, end()) == [end()]
    assert shown.feed(0, end()) == [], "an end is forwarded once"
    assert shown.feed(0, reset(attempt=2)) == [reset(attempt=2)]
    assert shown.feed(0, delta("Bye", 0)) == [delta("Bye", 0)]
    assert shown["sp", 0] == "Bye"


def test_a_relay_taking_over_with_the_whole_text_contributes_only_the_excess() -> None:
    shown = Shown()
    shown.feed(0, delta("Hello ", 0))
    shown.feed(0, delta("wor", 6))  # then relay 0 dies; "ld" was sent to it but never reached us
    assert shown.feed(1, delta("Hello world", 0)) == [delta("ld", 9)], "the publisher's whole text so far"
    assert shown.feed(1, delta("!", 11)) == [delta("!", 11)]
    assert shown.feed(0, delta("Hello wor", 0)) == [], "relay 0 back with what it held: nothing new"
    assert shown.feed(0, end()) == [], "only the source feeding the span ends it"
    assert shown.feed(1, end()) == [end()]
    assert shown["sp", 0] == "Hello world!"


def test_a_fresh_subscriber_gets_the_text_once_whichever_relay_answers_first() -> None:
    for first, second in ((0, 1), (1, 0)):
        shown = Shown()
        held = {0: "Hello wor", 1: "Hello world"}  # relay 0 lost the session mid-attempt, relay 1 took over
        shown.feed(first, delta(held[first], 0))
        shown.feed(second, delta(held[second], 0))
        shown.feed(1, delta("!", 11))
        assert shown["sp", 0] == "Hello world!"


def test_a_reset_from_the_feeding_relay_starts_the_span_over() -> None:
    shown = Shown()
    shown.feed(0, delta("The answer is 41", 0))
    assert shown.feed(0, reset(attempt=2)) == [reset(attempt=2)]
    assert shown.feed(0, delta("The answer is 42", 0)) == [delta("The answer is 42", 0)]
    assert shown["sp", 0] == "The answer is 42"


def test_a_relay_holding_an_older_attempt_neither_voids_nor_adds_text() -> None:
    shown = Shown()
    shown.feed(1, delta("The answer is 41, since", 0))  # attempt 1, on relay 1
    shown.feed(0, reset(attempt=2))  # attempt 2 on relay 0, diverging: relay 0 says so
    shown.feed(0, delta("The answer is 42", 0))
    assert shown["sp", 0] == "The answer is 42"
    assert shown.feed(1, reset(attempt=1)) == [], "an older attempt's reset (a relay's catch-up) voids nothing"
    assert shown.feed(1, delta("The answer is 41, since", 0)) == [], "text that disagrees is not shown"
    assert shown.feed(1, delta(" it is", 23)) == [], "however long it grows"
    assert shown.feed(0, delta(" because", 16)) == [delta(" because", 16)]
    assert shown["sp", 0] == "The answer is 42 because"


def test_a_newer_attempt_announced_by_another_relay_takes_the_span_over() -> None:
    shown = Shown()
    shown.feed(0, delta("The answer is 41", 0))
    assert shown.feed(1, reset(attempt=2)) == [reset(attempt=2)]
    shown.feed(1, delta("It is 42", 0))
    assert shown.feed(0, delta(", since", 16)) == [], "the replaced attempt's relay is not listened to"
    assert shown["sp", 0] == "It is 42"


def test_a_relay_set_aside_by_a_reset_is_heard_again_once_it_agrees() -> None:
    shown = Shown()
    shown.feed(1, delta("Hello", 0))  # attempt 1 reached relay 1 (a failover) before relay 0 came back
    shown.feed(0, reset(attempt=2))
    shown.feed(0, delta("Hello th", 0))  # attempt 2, on relay 0: same start, so far
    # Relay 0 dies again; attempt 2 moves to relay 1, whose text agrees with it: relay 1 only extends what it had.
    assert shown.feed(1, delta(" there", 5)) == [delta("ere", 8)]
    assert shown["sp", 0] == "Hello there"


def test_blocks_and_spans_are_merged_apart() -> None:
    shown = Shown()
    shown.feed(0, delta("hmm", 0, block=0, kind="thinking"))
    shown.feed(0, delta("Hi", 0, block=1))
    shown.feed(0, delta("Other", 0, span="sp2"))
    shown.feed(1, delta("hmm, yes", 0, block=0, kind="thinking"))
    shown.feed(1, delta("Hi!", 0, block=1))
    shown.feed(1, delta("Other", 0, span="sp2"))
    assert (shown["sp", 0], shown["sp", 1], shown["sp2", 0]) == ("hmm, yes", "Hi!", "Other")
    assert shown.feed(1, delta("x", 0, block=2, kind="thinking")) == [delta("x", 0, block=2, kind="thinking")]
    assert shown.feed(0, delta("y", 0, block=2, kind="text")) == [], "another kind in the same block disagrees"


@pytest.mark.parametrize("seed", range(200))
def test_any_interleaving_of_a_failover_shows_the_text_once_and_whole(seed: int) -> None:
    """The publisher's side of a failover, played with random cuts: relay 0 gets the attempt's first pieces and
    delivers some of them before it dies; relay 1 then gets the whole text so far in one delta and the rest live;
    the subscriber's two feeds interleave at random, and relay 0 may come back with what it held."""
    rng = random.Random(seed)
    pieces = [f"w{n} " for n in range(rng.randint(1, 12))]
    text = "".join(pieces)
    cut = rng.randint(0, len(pieces))  # relay 0 died after this many pieces were sent to it
    delivered = rng.randint(0, cut)  # of which relay 0 delivered this many
    feed0 = []
    offset = 0
    for piece in pieces[:delivered]:
        feed0.append(delta(piece, offset))
        offset += len(piece)
    so_far = "".join(pieces[:cut])
    feed1 = [delta(so_far, 0)] if so_far else []
    offset = len(so_far)
    for piece in pieces[cut:]:
        feed1.append(delta(piece, offset))
        offset += len(piece)
    if rng.random() < 0.5:
        feed0.append(delta("".join(pieces[:delivered]), 0))  # relay 0's catch-up, if a subscriber reconnects
    shown = Shown()
    while feed0 or feed1:
        source = rng.choice([s for s, feed in ((0, feed0), (1, feed1)) if feed])
        shown.feed(source, (feed0 if source == 0 else feed1).pop(0))
    assert shown["sp", 0] == text


def test_the_merge_keeps_a_bounded_number_of_spans() -> None:
    merge = LiveMerge(max_spans=3)
    for n in range(10):
        merge.feed(0, delta("x", 0, span=f"sp{n}"))
    assert [merge.shown(f"sp{n}") for n in range(10)] == [""] * 7 + ["x"] * 3


# ---- over HTTP ----------------------------------------------------------------------------------------------------


async def test_an_attempt_whose_first_relay_is_down_reaches_the_subscriber_through_the_next() -> None:
    """The session's first relay refuses connections (nothing listens there): the publisher moves to the next
    relay with the text so far, and a subscriber following both gets the text once, whole."""
    with closed_port() as port, StreamRelayThread() as relay:
        down = f"http://127.0.0.1:{port}"
        up = str(relay.base_url).rstrip("/")
        session = next(
            s for s in (f"sesn_{uuid.uuid4().hex}" for _ in range(100)) if relay_order(s, [down, up])[0] == down
        )
        received: list[StreamEvent] = []
        ended = asyncio.Event()

        async def listen() -> None:
            async with aclosing(subscribe(f"{down},{up}", session, max_retry_delay=0.2)) as events:
                async for event in events:
                    received.append(event)
                    if event.type == "end":
                        ended.set()

        listener = asyncio.create_task(listen())
        try:
            await until(lambda: relay.hub.subscriber_count(session) == 1, "subscribed to the relay that answers")
            async with StreamPublisher(f"{down},{up}") as publisher:
                async with publisher.attempt(session, "sp", 1) as attempt:
                    for word in ("one ", "two ", "three"):
                        await attempt.delta(0, "text", word)
                        await asyncio.sleep(0.05)
                assert publisher.relays_for(session) == [up, down], "the relay that failed is tried last for a while"
            await asyncio.wait_for(ended.wait(), 30)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
        assert "".join(event.text for event in received if event.type == "delta") == "one two three"
        assert [event.type for event in received][-1] == "end"
