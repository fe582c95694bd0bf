"""A client of a session's event stream that follows the documented preview rules (`event_start` starts a preview
over, a delta appends), for the tests that kill relays and gateways under it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Previews:
    """A client following the documented preview rules: `event_start` (re)starts a preview, empty; a delta appends
    to entry `index` of its preview. `texts` is what each preview shows now."""

    def __init__(self) -> None:
        self.texts: dict[str, dict[int, str]] = {}
        self.deltas = 0

    def feed(self, event: Any) -> None:
        if event.type == "event_start" and event.event.type == "agent.message":
            self.texts[event.event.id] = {}
        elif event.type == "event_delta":
            assert event.event_id in self.texts, f"a delta for preview {event.event_id}, which is not open"
            entry = self.texts[event.event_id]
            index = event.delta.index or 0
            entry[index] = entry.get(index, "") + event.delta.content.text
            self.deltas += 1

    def text(self, preview: str) -> str:
        entry = self.texts.get(preview, {})
        return "".join(entry[index] for index in sorted(entry))


async def read_until(stream: Any, seen: list[Any], previews: Previews, done: Callable[[], bool]) -> None:
    async for event in stream:
        seen.append(event)
        previews.feed(event)
        if done():
            return
