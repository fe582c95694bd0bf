"""The wire format shared by the relay, its publishers and its subscribers, in one place.

Publishers send *records* (one JSON object per NDJSON line, or a JSON array of them)::

    {"type": "start", "span_id": S, "attempt": A}
    {"type": "delta", "span_id": S, "attempt": A, "seq": N, "block": B, "kind": "text" | "thinking", "text": "..."}
    {"type": "end",   "span_id": S, "attempt": A}

S is the id of the `span.model_request_start` event, A counts attempts of that span from 1 (Temporal may retry a
span after losing its worker), N counts deltas 0, 1, 2... within one attempt. Unknown extra fields are ignored so
that publishers can add optional ones without breaking an older relay.

Subscribers receive Server-Sent Events, each with `event: <type>`, `id: <span_id>/<out_seq>` and one JSON
`data:` line::

    {"type": "delta", "span_id": S, "block": B, "kind": K, "text": "...", "offset": O}
    {"type": "reset", "span_id": S, "attempt": A}
    {"type": "end",   "span_id": S}

`attempt` on a reset is the attempt whose text follows it (subscribers following several relays use it to tell a
newer attempt from a relay still holding an older one; a relay before it sent none, read as 0). `offset` counts
the characters (Unicode code points) of that span and block delivered before `text`, so a client drops what it
already has. `out_seq` is a watermark: once a subscriber has read a message, it holds every message
of the session up to that number, which is what makes `?since=<id>` (or `Last-Event-ID`) a safe resume point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from relay.errors import InvalidRecordError, InvalidSinceError

DeltaKind = Literal["text", "thinking"]
EventType = Literal["delta", "reset", "end"]

# Ids end up on an SSE `id:` line, so they must not contain line breaks; no other constraint is needed.
_ID_PATTERN = r"^[^\r\n\x00]+$"
SpanId = Annotated[str, Field(min_length=1, max_length=256, pattern=_ID_PATTERN)]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    span_id: SpanId
    attempt: int = Field(ge=1)


class StartRecord(_Record):
    """An attempt of a model request begins."""

    type: Literal["start"] = "start"


class DeltaRecord(_Record):
    """A piece of text or thinking produced by one attempt, numbered by `seq` within that attempt."""

    type: Literal["delta"] = "delta"
    seq: int = Field(ge=0)
    block: int = Field(ge=0)
    kind: DeltaKind
    text: str


class EndRecord(_Record):
    """The attempt finished, successfully or not."""

    type: Literal["end"] = "end"


PublishRecord = Annotated[StartRecord | DeltaRecord | EndRecord, Field(discriminator="type")]

_RECORD = TypeAdapter[PublishRecord](PublishRecord)
_RECORDS = TypeAdapter[list[PublishRecord]](list[PublishRecord])


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "record"
    return f"{where}: {first['msg']}"


def parse_record(raw: bytes | str) -> PublishRecord:
    """One record from one NDJSON line; raises `InvalidRecordError` with a short reason."""
    try:
        return _RECORD.validate_json(raw)
    except ValidationError as exc:
        raise InvalidRecordError(_describe(exc)) from exc


def parse_record_array(raw: bytes | str) -> list[PublishRecord]:
    """All records of a JSON array body, validated before any is published."""
    try:
        return _RECORDS.validate_json(raw)
    except ValidationError as exc:
        raise InvalidRecordError(_describe(exc)) from exc


def record_line(record: PublishRecord) -> bytes:
    """A record as one NDJSON line (with its newline), as publishers send it."""
    return record.model_dump_json().encode() + b"\n"


def format_event_id(span_id: str, out_seq: int) -> str:
    """The SSE id of a message: the span it is about and the session watermark after it."""
    return f"{span_id}/{out_seq}"


def parse_event_id(value: str) -> tuple[str, int]:
    """Split `<span_id>/<out_seq>`; span ids may themselves contain `/`, the number is after the last one."""
    span_id, slash, number = value.rpartition("/")
    if not slash or not span_id or not number.isdigit():
        raise InvalidSinceError(f"expected <span_id>/<out_seq>, got {value[:80]!r}")
    return span_id, int(number)


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One message from the relay to subscribers: the SSE event name, its id and its JSON payload."""

    event: EventType
    event_id: str
    data: dict[str, Any]

    def to_sse(self) -> bytes:
        """The message framed as Server-Sent Events (JSON escapes newlines, so `data` is one line)."""
        payload = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        # Lone surrogates cannot be UTF-8 encoded; "replace" keeps one character per character, so offsets hold.
        return f"event: {self.event}\nid: {self.event_id}\ndata: {payload}\n\n".encode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """What `subscribe()` yields: only text the caller has not seen yet, resets, and ends.

    For a delta, `offset` is where `text` starts in the span+block; for `reset` the text shown so far for the
    span is void and the new attempt's text follows from offset 0 (`attempt` says which one, 0 if the relay did
    not say); for `end` the span's text is complete as far as streaming goes (the durable `agent.message` follows
    in the session log).
    """

    type: EventType
    span_id: str
    block: int | None = None
    kind: DeltaKind | None = None
    text: str = ""
    offset: int = 0
    attempt: int = 0
