"""Live previews on a session's event stream (`event_deltas[]`): the stream relay's text as `event_start` and
`event_delta` frames, merged with the session's log. Pure rules, no I/O: `gateway/stream.py` feeds them."""

from __future__ import annotations

from typing import Any

from corral.contract.events import SessionEvent, SpanModelRequestEnd, message_id_of, thinking_id_of
from relay import StreamEvent

MAX_PREVIEW_SPANS = 64
"""Relay spans whose text one stream keeps (a session runs one model request at a time; this is slack)."""


class Previews:
    """Live previews (`event_start`, `event_delta`) of a stream that asked for them with `event_deltas[]`.

    The relay names live text by span: the id of the first `span.model_request_start` of a model turn (the
    workflow makes it the turn's `stream_id`, kept across the turn's visible retries). A preview belongs to the
    request producing it, and carries the id that request's `agent.message` (or `agent.thinking`) gets when the
    workflow writes it: `message_id_of` (`thinking_id_of`) its span id. The request's `span.model_request_end`
    (which the stream sends before the `agent.message`) concludes the preview, success or not: a client shows the
    preview until then, and then the message of the same id (a failed request writes none).

    What the client sees of retries (text already shown is never shown twice):
    - a retried attempt the relay absorbs (a lost worker; same text so far) continues the preview, new text only;
    - an attempt whose text differs from what was shown (the relay's `reset`) opens the same preview again: a
      second `event_start` with the same id, then the new attempt's text from index 0 — a client starts the
      preview over on every `event_start` (replaces, never appends);
    - a visible retry (the request failed, its `span.model_request_end` has `is_error` and closed the preview)
      opens a new preview, with the retry's span id, carrying the text so far whole.
    Text that arrives after its request ended without error is dropped: the `agent.message` already has it.
    """

    def __init__(self, kinds: set[str]) -> None:
        self.kinds = kinds
        self._texts: dict[str, dict[int, str]] = {}  # relay span -> model content block -> text so far
        self._thinking: set[str] = set()  # relay spans whose request has been thinking
        self._open: dict[str, str] = {}  # relay span -> id of its open preview (the request's span id)
        self._started: set[str] = set()  # relay spans whose open preview has had its agent.message event_start
        self._relay: dict[str, str] = {}  # request span id -> the relay span its text comes under
        self._ended: dict[str, None] = {}  # request span ids ended, oldest first
        self._retrying: set[str] = set()  # relay spans whose request failed (a retry may follow)
        self._current: str | None = None  # the request under way, as far as the log has shown

    def log(self, event: SessionEvent) -> None:
        """Follow the model requests in the log (every event the stream sends goes through here first)."""
        if event.type == "span.model_request_start":
            self._current = event.id
            for relay in self._retrying:
                self._relay[event.id] = relay  # one request at a time: this is the failed one's retry
        elif isinstance(event, SpanModelRequestEnd):
            span = event.model_request_start_id
            self._ended[span] = None
            if self._current == span:
                self._current = None
            relay = self._relay.get(span, span)
            self._open.pop(relay, None)
            self._started.discard(relay)
            if event.is_error:
                self._retrying.add(relay)
            else:
                self._retrying.discard(relay)
                self._texts.pop(relay, None)
                self._thinking.discard(relay)
            for kept in (self._ended, self._relay):  # bounded: the oldest requests are long concluded
                while len(kept) > 4 * MAX_PREVIEW_SPANS:
                    del kept[next(iter(kept))]

    def live(self, event: StreamEvent) -> list[dict[str, Any]]:
        """The frames (as JSON objects) one relay event becomes: none, or `event_start`s and/or deltas."""
        relay = event.span_id
        if event.type == "end":
            return []
        if event.type == "reset":
            self._texts.pop(relay, None)
            self._thinking.discard(relay)
            preview = self._open.get(relay)
            if preview is None or relay not in self._started:
                return []
            return [_message(preview)]  # the same preview, started over: the client drops what it showed
        if event.kind == "thinking":
            if relay in self._thinking:
                return []
            self._thinking.add(relay)
        else:
            texts = self._texts.setdefault(relay, {})
            if len(self._texts) > MAX_PREVIEW_SPANS:
                self._texts.pop(next(iter(self._texts)))
            block = event.block or 0
            texts[block] = texts.get(block, "") + event.text
        preview = self._open.get(relay) or self._opened(relay)
        if preview is None:
            return []
        frames: list[dict[str, Any]] = []
        if event.kind == "thinking":
            if "agent.thinking" in self.kinds:
                frames.append(_thinking(preview))
        elif "agent.message" in self.kinds and relay not in self._started:
            self._started.add(relay)  # the text so far, whole (it may include text shown by a failed request)
            frames.append(_message(preview))
            texts = self._texts[relay]
            frames += [_delta(preview, index, texts[block]) for index, block in enumerate(sorted(texts))]
        elif "agent.message" in self.kinds:
            frames.append(_delta(preview, sorted(self._texts[relay]).index(event.block or 0), event.text))
        return frames

    def _opened(self, relay: str) -> str | None:
        """Open the relay span's preview if its request is under way; its id, or None."""
        if relay not in self._ended:
            preview = relay  # the turn's first request, under way (the log may not have shown it yet)
            self._retrying.clear()  # a new turn: no earlier request will be retried any more
        elif relay in self._retrying and self._current is not None and self._current not in self._ended:
            preview = self._current
        else:
            return None  # the request is over: its messages are (or will be) in the log, whole
        self._open[relay] = preview
        self._relay[preview] = relay
        return preview


def _message(preview: str) -> dict[str, Any]:
    return {"type": "event_start", "event": {"type": "agent.message", "id": message_id_of(preview)}}


def _thinking(preview: str) -> dict[str, Any]:
    return {"type": "event_start", "event": {"type": "agent.thinking", "id": thinking_id_of(preview)}}


def _delta(preview: str, index: int, text: str) -> dict[str, Any]:
    return {"type": "event_delta", "event_id": message_id_of(preview),
            "delta": {"type": "content_delta", "content": {"type": "text", "text": text}, "index": index}}  # fmt: skip
