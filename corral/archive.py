"""A session's log beyond its current workflow run: the events of earlier runs, in chunks in the blob store (and,
beside them, the whole output of tool calls the model saw cut).

When a session continues as new, the run that ends writes its events (positions `after+1 .. through`) as chunks
of at most `CHUNK_EVENTS` events, one JSON Lines blob each, keyed by the position of its first event. The next run
carries the chunks' first positions (an `ArchiveIndex`), so a slice of the log reads only the chunks that hold
it: the cost of a slice does not depend on where in the session it is, nor on how many runs came before.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from pydantic import TypeAdapter

from corral.blobs import BlobStore
from corral.contract.events import SessionEvent
from corral.contract.session import ArchiveIndex

CHUNK_EVENTS = 500
"""Events per chunk: a 100-event slice reads one or two chunks."""

_EVENT: TypeAdapter[SessionEvent] = TypeAdapter(SessionEvent)


def tool_output_key(session_id: str, tool_use_id: str) -> str:
    """Where the whole output of a tool call is kept when the model was shown only its head and tail."""
    return f"sessions/{session_id}/outputs/{tool_use_id}"


def forget_session(store: BlobStore, session_id: str) -> None:
    """Remove what the store keeps of a deleted session: its archived runs and its kept tool outputs (payloads are
    shared by content, and stay)."""
    store.delete_prefix(f"sessions/{session_id}/")


def chunk_key(session_id: str, first: int) -> str:
    return f"sessions/{session_id}/log/{first:012d}.jsonl"


def write_chunks(store: BlobStore, session_id: str, events: list[SessionEvent]) -> list[int]:
    """Write consecutive events as chunks; the first position of each chunk, in order."""
    firsts = []
    for start in range(0, len(events), CHUNK_EVENTS):
        chunk = events[start : start + CHUNK_EVENTS]
        store.put(chunk_key(session_id, chunk[0].position), b"".join(_EVENT.dump_json(e) + b"\n" for e in chunk))
        firsts.append(chunk[0].position)
    return firsts


def read_chunk(store: BlobStore, session_id: str, first: int) -> list[SessionEvent]:
    return [_EVENT.validate_json(line) for line in store.get(chunk_key(session_id, first)).splitlines() if line]


def chunks_between(index: ArchiveIndex, after: int, before: int) -> list[int]:
    """The first positions of the chunks that hold any position in `(after, before)`."""
    if after + 1 >= before or after >= index.through or not index.chunks:
        return []
    first = max(bisect.bisect_right(index.chunks, after + 1) - 1, 0)
    last = bisect.bisect_right(index.chunks, min(before - 1, index.through)) - 1
    return index.chunks[first : last + 1]


def read_archived(
    store: BlobStore, session_id: str, index: ArchiveIndex, after: int, before: int
) -> Iterable[SessionEvent]:
    """The archived events at positions in `(after, before)`, in order, reading only the chunks that hold them."""
    for first in chunks_between(index, after, before):
        for event in read_chunk(store, session_id, first):
            if after < event.position < before and event.position <= index.through:
                yield event
