"""One session's live text followed on several relays at once, merged into one stream. Pure rules, no I/O.

With the relays partitioned by session (`partition`), an attempt's text is on one relay until that relay fails;
the publisher then moves the attempt to the next relay of the session's order and sends it the attempt's whole text
so far. A subscriber cannot know where a session's text is now, so it follows every relay and feeds what each one
yields (a relay's `StreamEvent`s: text new *from that relay*) to `LiveMerge.feed(source, event)`, which returns the
events to show:

- per (span, block) the merge keeps the text already forwarded; from any source it forwards only text beyond it,
  so a relay that catches up with the whole text so far after a failover contributes only the excess;
- text that disagrees with what was forwarded (a relay still holding an attempt that has been replaced) is never
  forwarded: a source is checked against the forwarded text, and only an agreeing source extends it;
- the source that last extended a span is its *feeder*; a `reset` from the feeder starts the span over, as on one
  relay. A `reset` from another source counts only if its attempt is newer than any seen before (the relay says
  which attempt's text follows a reset), so a relay holding an older attempt cannot void live text;
- `end` is forwarded once, from the feeder.

What it cannot do: a retried attempt whose text differs from what was shown, published to a relay that never saw
the span (so that relay sends no `reset`), is not shown live; the preview then stays as it was until the durable
message replaces it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from relay._state import DeliveredText
from relay.protocol import DeltaKind, StreamEvent

MAX_MERGED_SPANS = 256


@dataclass(slots=True)
class _Text:
    kind: DeltaKind
    text: DeliveredText = field(default_factory=DeliveredText)
    agrees: bool = True  # known to agree with the forwarded text; False: compare it whole on its next delta
    broken: bool = False  # a source's own text has a hole: it is not used until that source resets


@dataclass(slots=True)
class _Span:
    shown: dict[int, _Text] = field(default_factory=dict)  # block -> text forwarded
    sources: dict[int, dict[int, _Text]] = field(default_factory=dict)  # source -> block -> that source's text
    feeder: int | None = None
    attempt: int = 0  # the newest attempt a reset has announced
    ended: bool = False


class LiveMerge:
    """Merges live text from several sources (relays, numbered by the caller); see the module docstring."""

    def __init__(self, max_spans: int = MAX_MERGED_SPANS) -> None:
        self.max_spans = max_spans
        self._spans: OrderedDict[str, _Span] = OrderedDict()

    def feed(self, source: int, event: StreamEvent) -> list[StreamEvent]:
        """The events to show for one event of one source: none, a delta of new text, or a reset or an end."""
        span = self._span(event.span_id)
        if event.type == "reset":
            return self._reset(span, source, event)
        if event.type == "end":
            if span.ended or span.feeder not in (None, source):
                return []
            span.ended = True
            return [event]
        if event.kind is None:
            return []
        return self._delta(span, source, event.span_id, event.block or 0, event.kind, event.offset, event.text)

    def shown(self, span_id: str, block: int = 0) -> str:
        """The text forwarded so far for a span and block (tests, diagnostics)."""
        span = self._spans.get(span_id)
        text = span.shown.get(block) if span is not None else None
        return text.text.value() if text is not None else ""

    def _span(self, span_id: str) -> _Span:
        span = self._spans.get(span_id)
        if span is None:
            span = self._spans[span_id] = _Span()
            while len(self._spans) > self.max_spans:
                self._spans.popitem(last=False)
        else:
            self._spans.move_to_end(span_id)
        return span

    def _reset(self, span: _Span, source: int, event: StreamEvent) -> list[StreamEvent]:
        span.sources[source] = {}  # the source's own text starts over whatever we make of its reset
        if span.feeder not in (None, source) and event.attempt <= span.attempt:
            return []  # a relay announcing an attempt no newer than the text shown: nothing to void
        span.attempt = max(span.attempt, event.attempt)
        span.feeder = source
        span.shown = {}
        span.ended = False
        for blocks in span.sources.values():
            for text in blocks.values():
                text.agrees = False  # what the other sources hold is checked again against the new text
        return [event]

    def _delta(
        self, span: _Span, source: int, span_id: str, block: int, kind: DeltaKind, offset: int, text: str
    ) -> list[StreamEvent]:
        blocks = span.sources.setdefault(source, {})
        own = blocks.get(block)
        if own is None:
            own = blocks[block] = _Text(kind)
        if offset != own.text.length or kind != own.kind:
            if offset > own.text.length or kind != own.kind:
                own.broken = True  # a hole (or another kind) in this source's text: unusable until it resets
            else:
                own.text = DeliveredText(own.text.value()[:offset])
        if own.broken:
            return []
        own.text.append(text)
        shown = span.shown.get(block)
        length = shown.text.length if shown is not None else 0
        if own.agrees and offset == length and (shown is None or shown.kind == kind):
            fresh, at = text, offset  # the common case: the feeder, live
        elif own.agrees and offset < length and shown is not None and shown.kind == kind:
            overlap = shown.text.value()[offset : offset + len(text)]
            if not text.startswith(overlap):
                own.agrees = False
                return []
            fresh, at = text[len(overlap) :], length
        else:
            whole = own.text.value()
            before = shown.text.value() if shown is not None else ""
            if (shown is not None and shown.kind != kind) or not (whole.startswith(before) or before.startswith(whole)):
                own.agrees = False
                return []
            own.agrees = True
            fresh, at = whole[len(before) :], len(before)
        if not fresh:
            return []
        if shown is None:
            shown = span.shown[block] = _Text(kind)
        shown.text.append(fresh)
        span.feeder = source
        span.ended = False
        return [StreamEvent("delta", span_id, block, kind, fresh, at)]
