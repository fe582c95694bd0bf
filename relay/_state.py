"""What the relay keeps per session, span and block, and a subscriber's queue: plain records, no rules.

The rules that change these records live in `hub`; keeping the data apart keeps both files readable.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.protocol import EventType, StreamMessage

TOMBSTONES = 256  # evicted span ids remembered per session, so their late records do not resurrect them


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class DeliveredText:
    """Delivered text of one block: appended in O(1), joined only when a retry or a catch-up needs it."""

    __slots__ = ("_chunks", "length")

    def __init__(self, text: str = "") -> None:
        self._chunks = [text] if text else []
        self.length = len(text)

    def append(self, text: str) -> None:
        self._chunks.append(text)
        self.length += len(text)

    def value(self) -> str:
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""


@dataclass(slots=True)
class BlockState:
    kind: str
    text: DeliveredText = field(default_factory=DeliveredText)
    matched: int = 0  # characters of `text` the current attempt has reproduced so far
    touched: bool = False  # the current attempt has written to this block


@dataclass(slots=True)
class LogEntry:
    """A message sent for a span, kept (without its text) so catch-up can tell what a resumer still lacks."""

    seq: int
    event: EventType
    block: int = -1
    offset: int = 0


@dataclass(slots=True)
class SpanState:
    span_id: str
    attempt: int
    last_active: float
    blocks: dict[int, BlockState] = field(default_factory=dict)
    log: list[LogEntry] = field(default_factory=list)
    next_delta_seq: int = 0
    ended: bool = False
    truncated: bool = False
    nbytes: int = 0


@dataclass(slots=True)
class SessionState:
    last_active: float
    spans: OrderedDict[str, SpanState] = field(default_factory=OrderedDict)  # creation order
    evicted: deque[str] = field(default_factory=lambda: deque(maxlen=TOMBSTONES))
    nbytes: int = 0


class Subscription:
    """A subscriber's bounded queue of live messages. A subscriber that falls `limit` messages behind is
    marked `overflowed` and should be disconnected: it resumes with `since` and gets a consolidated catch-up,
    which costs less than an unbounded backlog."""

    def __init__(self, session_id: str, limit: int, wake: Callable[[], None] | None) -> None:
        self.session_id = session_id
        self.limit = limit
        self.overflowed = False
        self.closed = False  # the relay is shutting down: end the stream, the client will resume elsewhere
        self._queue: deque[StreamMessage] = deque()
        self._wake = wake

    def push(self, messages: list[StreamMessage]) -> None:
        if self.overflowed:
            return
        if len(self._queue) + len(messages) > self.limit:
            self.overflowed = True
            self._queue.clear()
        else:
            self._queue.extend(messages)
        if self._wake is not None:
            self._wake()

    def close(self) -> None:
        self.closed = True
        if self._wake is not None:
            self._wake()

    def drain(self) -> list[StreamMessage]:
        """Everything queued so far, oldest first."""
        messages = list(self._queue)
        self._queue.clear()
        return messages
