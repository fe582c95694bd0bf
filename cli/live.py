"""Live text in `corral tail`: deltas from the stream relay printed as they come, beside the durable events.

The relay carries only what the model is producing right now; the session log stays the record. When the durable
`agent.message` arrives for text that was already streamed, it is shown as one short line instead of twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from rich.console import Console
from rich.text import Text

from cli.render import safe
from cli.stack import STREAM_TOKEN_ENV
from corral.contract.events import AgentMessage, SessionEvent
from relay import StreamEvent, subscribe

log = logging.getLogger(__name__)
PREFIX = "          ▌ "


class LiveText:
    """Prints text deltas inline, one line per model request; remembers what it showed so the durable message
    is not printed again. Streams in `ignore` (requests already in the log before the tail began) are skipped.

    The relay is faster than the log: deltas of a request usually arrive before the tail has read the
    `span.model_request_start` event that opens it (and the message that caused it). They are held until the tail
    prints that event (`release`), so live text never appears above its cause.
    """

    def __init__(self, console: Console, ignore: set[str] | None = None) -> None:
        self.console = console
        self.ignore = set(ignore or ())
        self._shown: dict[str, str] = {}
        self._held: dict[str, str] = {}
        self._released: set[str] = set()
        self._current: str | None = None

    def on_stream(self, event: StreamEvent) -> None:
        if event.span_id in self.ignore:
            return
        if event.type == "reset":
            self._held.pop(event.span_id, None)
            if self._shown.get(event.span_id):
                self.close_line()
                self.console.print(Text(f"{PREFIX}(the model retried; the text above is replaced)", style="dim"))
            self._shown[event.span_id] = ""
        elif event.type == "delta" and event.kind == "text" and event.text:
            if event.span_id in self._released:
                self._show(event.span_id, event.text)
            else:
                self._held[event.span_id] = self._held.get(event.span_id, "") + event.text

    def release(self, span_id: str) -> None:
        """The tail printed the `span.model_request_start` of `span_id`: show what was held, and the rest live."""
        self._released.add(span_id)
        held = self._held.pop(span_id, "")
        if held:
            self._show(span_id, held)

    def _show(self, span_id: str, text: str) -> None:
        if self._current != span_id:
            self.close_line()
            self.console.print(Text(PREFIX, style="cyan"), end="")
            self._current = span_id
        self.console.print(Text(safe(text)), end="", soft_wrap=True)
        self._shown[span_id] = self._shown.get(span_id, "") + text

    def close_line(self) -> None:
        if self._current is not None:
            self.console.print()
            self._current = None

    def already_shown(self, event: SessionEvent) -> bool:
        """True for an `agent.message` whose text was streamed above; that stream is then done with."""
        if not isinstance(event, AgentMessage):
            return False
        text = "".join(block.text for block in event.content).strip()
        for span_id, shown in self._shown.items():
            if shown.strip() == text:
                del self._shown[span_id]
                self.ignore.add(span_id)
                return True
        return False

    async def follow(self, base_url: str, session_id: str) -> None:
        """Print deltas until cancelled; a relay that is down only costs the live view, never the tail. `base_url`
        may be a comma-separated list of relays: every one is followed and their text merged (`subscribe`)."""
        try:
            async for event in subscribe(base_url, session_id, token=os.environ.get(STREAM_TOKEN_ENV) or None):
                self.on_stream(event)
        except Exception as exc:  # the durable events still print
            log.debug("live stream unavailable: %s", exc)


@contextlib.asynccontextmanager
async def following(live: LiveText | None, base_url: str | None, session_id: str) -> AsyncIterator[None]:
    """Run `live.follow` in the background for the duration of the block."""
    if live is None or base_url is None:
        yield
        return
    task = asyncio.create_task(live.follow(base_url, session_id))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        live.close_line()
