"""The relay's state machine: what to forward for each published record, and what a (re)connecting subscriber
must be sent first. No I/O and no awaits, so every rule is unit-testable with a fake clock.

Per (session, span, block) the hub keeps the text already delivered to subscribers. A retried attempt of a span
is compared with it as it arrives: while the new attempt only repeats delivered text nothing is forwarded; once
it runs past, only the excess is; if it diverges (or ends short), subscribers get `reset` and the new attempt's
text from offset 0. Deltas of an attempt older than the newest one are ignored. That is how "a retried model
attempt must not show the user a second copy" holds without the relay knowing anything about Temporal.

Every message gets an `out_seq` from one hub-wide counter that starts at the wall clock in microseconds, so a
resume position handed out by an earlier relay process is recognised as foreign (and answered with a full
catch-up) instead of being trusted against new numbers.

State is bounded: per session at most `max_spans` spans and `max_bytes` of text, spans ended (or silent) for
`retain_seconds` are dropped, sessions idle that long are dropped, and at most `max_sessions` are kept. It is
ephemeral by design: the durable record of every message is the session's workflow history.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from relay._state import (
    BlockState,
    DeliveredText,
    LogEntry,
    SessionState,
    SpanState,
    Subscription,
    utf8_len,
)
from relay.protocol import (
    DeltaRecord,
    EndRecord,
    EventType,
    PublishRecord,
    StreamMessage,
    format_event_id,
    parse_event_id,
)

DEFAULT_RETAIN_SECONDS = 120.0
DEFAULT_MAX_SPANS = 32
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_QUEUE_LIMIT = 4096
_ENTRY_BYTES = 64  # rough cost of one retained log entry, counted against `max_bytes`
_SWEEP_INTERVAL = 1.0

# A catch-up message before it gets its id: event, payload, and the log entries (by out_seq) it stands for.
_Planned = tuple[EventType, dict[str, object], list[int]]


class StreamHub:
    """In-memory relay state for all sessions; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        retain_seconds: float = DEFAULT_RETAIN_SECONDS,
        max_spans: int = DEFAULT_MAX_SPANS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        clock: Callable[[], float] = time.monotonic,
        seq_origin: int | None = None,
    ) -> None:
        self.retain_seconds = retain_seconds
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.queue_limit = queue_limit
        self._clock = clock
        self.seq_origin = time.time_ns() // 1000 if seq_origin is None else seq_origin
        self.last_seq = self.seq_origin
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()  # least recently active first
        self._subscribers: dict[str, set[Subscription]] = {}
        self._last_sweep = clock()

    # ---- publishing -------------------------------------------------------------------------------------

    def publish(self, session_id: str, record: PublishRecord) -> list[StreamMessage]:
        """Apply one record; returns the messages it produced, already queued for every subscriber."""
        now = self._clock()
        self._maybe_sweep(now)
        session = self._touch_session(session_id, now)
        span = self._span_for(session, record, now)
        if span is None or record.attempt < span.attempt:
            return []  # an evicted span, or a stale attempt still talking after a newer one started
        span.last_active = now
        if record.attempt > span.attempt:
            self._begin_attempt(span, record.attempt)
        if isinstance(record, DeltaRecord):
            messages = self._on_delta(session, span, record)
        elif isinstance(record, EndRecord):
            messages = self._on_end(session, span)
        else:
            messages = []
        if messages:
            for subscription in self._subscribers.get(session_id, ()):
                subscription.push(messages)
        return messages

    def _touch_session(self, session_id: str, now: float) -> SessionState:
        session = self._sessions.get(session_id)
        if session is None:
            while len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
            session = self._sessions[session_id] = SessionState(last_active=now)
        else:
            session.last_active = now
            self._sessions.move_to_end(session_id)
        return session

    def _span_for(self, session: SessionState, record: PublishRecord, now: float) -> SpanState | None:
        span = session.spans.get(record.span_id)
        if span is not None:
            return span
        if record.span_id in session.evicted or isinstance(record, EndRecord):
            return None  # nothing to end, or a span dropped from memory: it does not stream again
        # A delta without a start (a batch, or a relay restarted mid-attempt) opens the span implicitly.
        if len(session.spans) >= self.max_spans:
            self._evict(session, self._victim(session, keep=None))
        span = session.spans[record.span_id] = SpanState(record.span_id, record.attempt, last_active=now)
        return span

    def _begin_attempt(self, span: SpanState, attempt: int) -> None:
        """A newer attempt: it must re-earn every delivered character before anything more is forwarded."""
        span.attempt = attempt
        span.next_delta_seq = 0
        span.ended = False
        span.truncated = False
        span.log = [entry for entry in span.log if entry.event != "end"]
        for block in span.blocks.values():
            block.matched = 0
            block.touched = False

    def _on_delta(self, session: SessionState, span: SpanState, record: DeltaRecord) -> list[StreamMessage]:
        if span.ended or span.truncated or record.seq < span.next_delta_seq:
            return []  # after the attempt's end, over budget, or a duplicate
        span.next_delta_seq = record.seq + 1
        if not record.text:
            return []
        block = span.blocks.get(record.block)
        if block is None:
            block = span.blocks[record.block] = BlockState(kind=record.kind)
        block.touched = True
        pos = block.matched
        text = record.text
        if pos == block.text.length and block.kind == record.kind:
            overlap = ""  # the common case: nothing delivered ahead of this attempt
        else:
            overlap = block.text.value()[pos : pos + len(text)]
        if block.kind != record.kind or not text.startswith(overlap):
            # Diverged from what subscribers were shown: the new attempt's text replaces it.
            block.kind = record.kind
            block.text = DeliveredText(block.text.value()[:pos] + text)
            block.matched = block.text.length
            return self._reset(session, span)
        excess = text[len(overlap) :]
        cost = utf8_len(excess) + _ENTRY_BYTES
        if excess and not self._make_room(session, span, cost):
            block.matched = pos + len(overlap)
            span.truncated = True  # this span alone is over budget: stop here rather than leave a hole
            return []
        block.matched = pos + len(text)
        if not excess:
            return []
        offset = block.text.length
        block.text.append(excess)
        return [self._emit_delta(session, span, record.block, block.kind, offset, excess, cost)]

    def _on_end(self, session: SessionState, span: SpanState) -> list[StreamMessage]:
        if span.ended:
            return []
        messages: list[StreamMessage] = []
        if any(block.matched < block.text.length for block in span.blocks.values()):
            messages = self._reset(session, span)  # the attempt ended short of what was shown
        span.ended = True
        messages.append(self._emit(session, span, "end", {"type": "end", "span_id": span.span_id}))
        return messages

    def _reset(self, session: SessionState, span: SpanState) -> list[StreamMessage]:
        """Void the span's shown text and resend the current attempt's text from offset 0."""
        kept = {i: b for i, b in sorted(span.blocks.items()) if b.touched and b.matched > 0}
        for block in kept.values():
            if block.matched < block.text.length:
                block.text = DeliveredText(block.text.value()[: block.matched])
        span.blocks = kept
        span.log = []
        session.nbytes -= span.nbytes
        span.nbytes = 0
        reset = {"type": "reset", "span_id": span.span_id, "attempt": span.attempt}
        messages = [self._emit(session, span, "reset", reset)]
        for index, block in kept.items():
            text = block.text.value()
            cost = utf8_len(text) + _ENTRY_BYTES
            messages.append(self._emit_delta(session, span, index, block.kind, 0, text, cost))
        return messages

    def _emit(self, session: SessionState, span: SpanState, event: EventType, data: dict[str, object]) -> StreamMessage:
        self.last_seq += 1
        span.log.append(LogEntry(self.last_seq, event))
        span.nbytes += _ENTRY_BYTES
        session.nbytes += _ENTRY_BYTES
        return StreamMessage(event, format_event_id(span.span_id, self.last_seq), data)

    def _emit_delta(
        self, session: SessionState, span: SpanState, block: int, kind: str, offset: int, text: str, cost: int
    ) -> StreamMessage:
        self.last_seq += 1
        span.log.append(LogEntry(self.last_seq, "delta", block, offset))
        span.nbytes += cost
        session.nbytes += cost
        data = {"type": "delta", "span_id": span.span_id, "block": block, "kind": kind, "text": text, "offset": offset}
        return StreamMessage("delta", format_event_id(span.span_id, self.last_seq), data)

    # ---- memory bounds ----------------------------------------------------------------------------------

    def _make_room(self, session: SessionState, span: SpanState, cost: int) -> bool:
        while session.nbytes + cost > self.max_bytes:
            victim = self._victim(session, keep=span)
            if victim is None:
                return False
            self._evict(session, victim)
        return True

    @staticmethod
    def _victim(session: SessionState, keep: SpanState | None) -> SpanState | None:
        """The span to drop first: the oldest ended one, else the oldest in flight (never `keep`)."""
        candidates = [s for s in session.spans.values() if s is not keep]
        ended = [s for s in candidates if s.ended]
        pool = ended or candidates
        return pool[0] if pool else None

    @staticmethod
    def _evict(session: SessionState, span: SpanState | None) -> None:
        if span is None:
            return
        del session.spans[span.span_id]
        session.nbytes -= span.nbytes
        session.evicted.append(span.span_id)

    def sweep(self) -> None:
        """Drop sessions idle for `retain_seconds` and spans ended (or silent) for that long."""
        now = self._clock()
        self._last_sweep = now
        horizon = now - self.retain_seconds
        while self._sessions:
            session_id, session = next(iter(self._sessions.items()))
            if session.last_active >= horizon:
                break
            del self._sessions[session_id]
        for session in self._sessions.values():
            for span in [s for s in session.spans.values() if s.last_active < horizon]:
                self._evict(session, span)

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep >= _SWEEP_INTERVAL:
            self.sweep()

    # ---- subscribing ------------------------------------------------------------------------------------

    def subscribe(
        self, session_id: str, since: str | None = None, wake: Callable[[], None] | None = None
    ) -> tuple[list[StreamMessage], Subscription]:
        """Register a subscriber and return its catch-up, atomically, so no live message falls in between."""
        backlog = self.catch_up(session_id, since)
        subscription = Subscription(session_id, self.queue_limit, wake)
        self._subscribers.setdefault(session_id, set()).add(subscription)
        return backlog, subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.session_id)
        if subscribers is not None:
            subscribers.discard(subscription)
            if not subscribers:
                del self._subscribers[subscription.session_id]

    def close_subscriptions(self) -> None:
        """Ask every subscriber stream to end (before a shutdown, so none holds the server open)."""
        for subscriptions in self._subscribers.values():
            for subscription in subscriptions:
                subscription.close()

    def subscriber_count(self, session_id: str) -> int:
        return len(self._subscribers.get(session_id, ()))

    def catch_up(self, session_id: str, since: str | None = None) -> list[StreamMessage]:
        """What a subscriber resuming after `since` lacks, consolidated to one delta per span and block.

        Without a usable `since` (none, or from another relay process) that is every retained span from offset 0,
        with `reset` first for a span that was ever reset so that a client holding void text drops it. Each
        message's id carries the highest `out_seq` up to which the subscriber then holds everything.
        """
        self._maybe_sweep(self._clock())
        after = self._resolve_since(since)
        session = self._sessions.get(session_id)
        if session is None:
            return []
        plans: list[tuple[int, str, list[_Planned]]] = []
        pending: list[int] = []
        for span in session.spans.values():
            entries = [e for e in span.log if e.seq > after]
            if entries:
                pending.extend(e.seq for e in entries)
                plans.append((entries[0].seq, span.span_id, self._consolidate(span, entries)))
        plans.sort()
        pending.sort()
        covered: set[int] = set()
        watermark, next_index = after, 0
        messages: list[StreamMessage] = []
        for _, span_id, items in plans:
            for event, data, seqs in items:
                covered.update(seqs)
                while next_index < len(pending) and pending[next_index] in covered:
                    watermark = pending[next_index]
                    next_index += 1
                messages.append(StreamMessage(event, format_event_id(span_id, watermark), data))
        return messages

    @staticmethod
    def _consolidate(span: SpanState, entries: list[LogEntry]) -> list[_Planned]:
        """Messages (with the log entries each one covers) replacing `entries` of one span."""
        items: list[_Planned] = []
        by_block: dict[int, list[LogEntry]] = {}
        for entry in entries:
            if entry.event == "reset":
                # The attempt whose text follows (this catch-up sends the span's current text).
                reset = {"type": "reset", "span_id": span.span_id, "attempt": span.attempt}
                items.append(("reset", reset, [entry.seq]))
            elif entry.event == "delta":
                by_block.setdefault(entry.block, []).append(entry)
        for index, block_entries in by_block.items():
            block = span.blocks[index]
            offset = block_entries[0].offset  # entries after a resume point run contiguously to the end
            data = {
                "type": "delta",
                "span_id": span.span_id,
                "block": index,
                "kind": block.kind,
                "text": block.text.value()[offset:],
                "offset": offset,
            }
            items.append(("delta", data, [e.seq for e in block_entries]))
        ends = [e.seq for e in entries if e.event == "end"]
        if ends:
            items.append(("end", {"type": "end", "span_id": span.span_id}, ends))
        return items

    def _resolve_since(self, since: str | None) -> int:
        """The out_seq after which the subscriber lacks messages; a foreign or future position means all."""
        if not since:
            return self.seq_origin
        _, out_seq = parse_event_id(since)
        return out_seq if self.seq_origin <= out_seq <= self.last_seq else self.seq_origin

    # ---- introspection (tests, health) ------------------------------------------------------------------

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def span_ids(self, session_id: str) -> list[str]:
        session = self._sessions.get(session_id)
        return list(session.spans) if session is not None else []

    def session_bytes(self, session_id: str) -> int:
        session = self._sessions.get(session_id)
        return session.nbytes if session is not None else 0
