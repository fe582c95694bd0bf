"""Property tests of the log's edges (pure functions, no Temporal): however a session's events are split into runs
and chunks, a slice read from the archive and the current run equals the same slice of the whole log; and whatever
a raw client sends, the update validator accepts it or rejects it with a message."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.archive import CHUNK_EVENTS, read_archived, write_chunks
from corral.blobs import LocalBlobStore
from corral.contract.carry import ArchiveIndex
from corral.contract.events import AgentMessage, SessionEvent, SessionStatusIdle, TextBlock, UserMessage
from corral.contract.session import EventsQuery, SendEventsInput, parse_user_events
from workflows import SessionLog, check_answers

NOW = datetime(2026, 12, 1, tzinfo=UTC)
TYPES = ["user.message", "agent.message", "session.status_idle"]


def make_log(length: int) -> list[SessionEvent]:
    events: list[SessionEvent] = []
    for position in range(1, length + 1):
        kind = position % 3
        common = {"id": f"sevt_{position}", "position": position, "created_at": NOW, "processed_at": NOW}
        if kind == 0:
            events.append(UserMessage(**common, content=[TextBlock(text=f"m{position}")]))
        elif kind == 1:
            events.append(AgentMessage(**common, content=[TextBlock(text=f"a{position}")]))
        else:
            events.append(SessionStatusIdle(**common, stop_reason={"type": "end_turn"}))
    return events


def archive_runs(store: LocalBlobStore, events: list[SessionEvent], run_ends: list[int]) -> ArchiveIndex:
    """Archive `events[:through]` as the runs ending at `run_ends` would have, one write per run."""
    chunks: list[int] = []
    start = 0
    for end in run_ends:
        chunks += write_chunks(store, "sesn_p", events[start:end])
        start = end
    return ArchiveIndex(through=run_ends[-1] if run_ends else 0, chunks=chunks)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[int, list[int]]:
    length = draw(st.integers(min_value=1, max_value=3 * CHUNK_EVENTS))
    ends = sorted(set(draw(st.lists(st.integers(min_value=1, max_value=length), max_size=6))))
    return length, ends


@settings(max_examples=60, deadline=None)
@given(
    sessions(),
    st.integers(min_value=-5, max_value=3 * CHUNK_EVENTS + 5),
    st.one_of(st.none(), st.integers(min_value=0, max_value=3 * CHUNK_EVENTS + 5)),
    st.integers(min_value=1, max_value=1000),
    st.one_of(st.none(), st.lists(st.sampled_from(TYPES), min_size=1, max_size=2)),
)
def test_a_slice_is_the_same_wherever_the_runs_split_the_log(
    session: tuple[int, list[int]], after: int, before: int | None, limit: int, types: list[str] | None
) -> None:
    length, run_ends = session
    whole = make_log(length)
    with TemporaryDirectory() as scratch:
        store = LocalBlobStore(Path(scratch))
        index = archive_runs(store, whole, run_ends)
        log = SessionLog(new_id=lambda: "unused", now=lambda: NOW)
        log.resume(index.through, whole[index.through :], [])

        # What the client does: the archive for the positions it holds, then the run's page after them.
        end = length + 1 if before is None else before
        archived = [e for e in read_archived(store, "sesn_p", index, after, min(end, index.through + 1))]
        page = log.page(EventsQuery(after=after, before=before, limit=limit, types=types), index)
        assert (page.archive is not None) == (after < index.through and index.through > 0)
        read = [e for e in archived if types is None or e.type in types] + page.events

    expected = [e.position for e in whole if after < e.position < end and (types is None or e.type in types)]
    from_archive = [e.position for e in read[: len(read) - len(page.events)]]
    assert from_archive == [p for p in expected if p <= index.through], "the archive's part, whole"
    assert [e.position for e in page.events] == [p for p in expected if p > index.through][:limit], "the run's part"
    assert page.has_more == (len([p for p in expected if p > index.through]) > limit)


def test_chunks_hold_at_most_their_share_and_are_read_in_order(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    whole = make_log(CHUNK_EVENTS * 2 + 7)
    index = archive_runs(store, whole, [CHUNK_EVENTS - 3, len(whole)])
    assert index.chunks == [1, CHUNK_EVENTS - 2, 2 * CHUNK_EVENTS - 2, 3 * CHUNK_EVENTS - 2][: len(index.chunks)]
    read = list(read_archived(store, "sesn_p", index, 0, len(whole) + 1))
    assert [e.position for e in read] == list(range(1, len(whole) + 1))
    assert all(a.position + 1 == b.position for a, b in itertools.pairwise(read))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
USER_EVENTS = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["user.message", "user.interrupt", "user.custom_tool_result", "user.tool_confirmation", "x"]
        )
    },
    optional={
        "content": st.one_of(st.text(max_size=30), st.lists(JSON_VALUES, max_size=3), JSON_VALUES),
        "id": st.one_of(st.text(max_size=10), JSON_VALUES),
        "custom_tool_use_id": st.one_of(st.just("sevt_open"), st.text(max_size=10)),
        "tool_use_id": st.text(max_size=10),
        "result": st.sampled_from(["allow", "deny", "maybe"]),
        "is_error": JSON_VALUES,
        "extra": JSON_VALUES,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(USER_EVENTS, st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4)), max_size=5))
def test_the_send_events_validator_rejects_with_a_message_or_accepts(events: list[dict[str, object]]) -> None:
    """Whatever a raw client sends, the validator either accepts it or raises ValueError with a message: never
    another exception, which would fail the workflow task instead of rejecting the update."""
    try:
        params = parse_user_events(SendEventsInput(events=events))
        check_answers(params, waiting={"sevt_open"})
    except ValueError as exc:
        assert str(exc).strip(), "a rejection says why"
        return
    assert len(params) == len(events) and all(p.type == e["type"] for p, e in zip(params, events, strict=True))
