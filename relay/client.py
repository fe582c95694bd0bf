"""The publishing end of the relay, for the model worker: `StreamPublisher` (`subscriber.subscribe()` is the other).

The publisher's one promise is that it never breaks or slows down a model turn: `delta()` only appends to an
in-memory buffer, a background task streams the buffer as NDJSON over one request per attempt, and every failure
(relay down, slow, refusing the token) turns into dropped deltas and one warning. Deltas waiting while the relay
is slow are merged, so the buffer holds a few records however far behind it falls; past `max_pending_bytes` the
attempt stops streaming rather than leave a hole in the text.

With several relays (a comma-separated list, `partition`), an attempt publishes to the first relay of its session's
order; if that relay refuses it or the connection breaks, the attempt moves to the next one and sends it its whole
text so far (kept per block while the attempt runs, up to `max_kept_bytes`), then goes on. A relay that failed is
tried last for a while (`relay_down_seconds`), so the next attempts do not wait on it. With one relay nothing is
kept: the path is exactly the one-relay path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import httpx

from relay.hub import DEFAULT_MAX_BYTES
from relay.partition import relay_order, relay_urls
from relay.protocol import (
    DeltaKind,
    DeltaRecord,
    EndRecord,
    PublishRecord,
    StartRecord,
    record_line,
)

logger = logging.getLogger("relay")

_WARNING_INTERVAL = 30.0  # a relay that stays down warns once per interval, not once per model turn
RELAY_DOWN_SECONDS = 10.0
FLUSH_SECONDS = 0.05
"""After it sends deltas, an attempt waits this long before it sends more: the deltas that come meanwhile go in one
write. The first delta of an attempt, and the first after a pause this long, go at once, so a first token is never
held back; later text reaches a reader at most this much later. A model streams a delta every 20 ms or so, and a
write per delta was one of the largest parts of the model worker's CPU in `bench.load --profile`'s flame graph."""
UNACKED_MILLISECONDS = 2000
"""A relay that leaves the deltas sent to it unacknowledged this long is gone. A relay process that dies is seen at
once (its host resets the connection), but a relay whose host or container vanishes sends nothing back: the deltas
would fill the socket's buffer for minutes before any write failed, and its sessions' live text would stop until
the attempt ends. The kernel drops such a connection after this long (TCP_USER_TIMEOUT), and the attempt moves to
the next relay."""
_UNACKED_LIMIT = (
    [(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_MILLISECONDS)] if hasattr(socket, "TCP_USER_TIMEOUT") else []
)


def _auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(slots=True)
class _Pending:
    block: int
    kind: DeltaKind
    texts: list[str] = field(default_factory=list)


class StreamPublisher:
    """Publishes model output to a relay, or to the relays of a comma-separated list (partitioned by session);
    one instance per worker process, shared by all model turns."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        token: str | None = None,
        *,
        max_pending_bytes: int = 1024 * 1024,
        max_kept_bytes: int = DEFAULT_MAX_BYTES,
        relay_down_seconds: float = RELAY_DOWN_SECONDS,
        flush_seconds: float = FLUSH_SECONDS,
        connect_timeout: float = 2.0,
        io_timeout: float = 10.0,
    ) -> None:
        self.relays = relay_urls(base_url)
        self.base_url = self.relays[0]
        self.max_pending_bytes = max_pending_bytes
        self.max_kept_bytes = max_kept_bytes
        self.relay_down_seconds = relay_down_seconds
        self.flush_seconds = flush_seconds
        self._down_until: dict[str, float] = {}
        self._headers = {"Content-Type": "application/x-ndjson", **_auth_headers(token)}
        self._timeout = httpx.Timeout(io_timeout, connect=connect_timeout, pool=connect_timeout)
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_warning = -_WARNING_INTERVAL

    def _http(self) -> httpx.AsyncClient:
        # Created on first use, inside the event loop that runs the model activities.
        if self._client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=16)
            transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=_UNACKED_LIMIT)
            self._client = httpx.AsyncClient(timeout=self._timeout, transport=transport)
        return self._client

    def _warn(self, message: str, *args: object, consequence: str = "live text is dropped") -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARNING_INTERVAL:
            self._last_warning = now
            logger.warning(f"{message} ({consequence}; the durable message is unaffected)", *args)
        else:
            logger.debug(message, *args)

    def attempt(self, session_id: str, span_id: str, attempt: int) -> AttemptStream:
        """The live stream of one attempt of one model request; use it as `async with`."""
        return AttemptStream(self, session_id, span_id, attempt)

    def relays_for(self, session_id: str) -> list[str]:
        """The relays an attempt of `session_id` tries, in order: the session's order, relays that failed lately
        moved to the end (they are still tried, last)."""
        if len(self.relays) == 1:
            return [self.relays[0]]
        order = relay_order(session_id, self.relays)
        if not self._down_until:
            return order
        now = time.monotonic()
        for url, until in list(self._down_until.items()):
            if until <= now:
                del self._down_until[url]
        return [url for url in order if url not in self._down_until] + [u for u in order if u in self._down_until]

    def _failed(self, url: str) -> None:
        if len(self.relays) > 1:
            self._down_until[url] = time.monotonic() + self.relay_down_seconds

    async def publish_batch(self, session_id: str, records: Sequence[PublishRecord]) -> bool:
        """Publish finished records in one JSON array request, to the first relay of the session's order that
        takes it; False (and a warning) if every relay refused it."""
        body = b"[" + b",".join(record.model_dump_json().encode() for record in records) + b"]"
        headers = {**self._headers, "Content-Type": "application/json"}
        for url in self.relays_for(session_id):
            try:
                response = await self._http().post(self._url(session_id, url), content=body, headers=headers)
            except httpx.HTTPError as exc:
                self._warn("stream relay %s unreachable: %s", url, type(exc).__name__)
                self._failed(url)
                continue
            if response.status_code == 200:
                return True
            self._warn("stream relay %s answered %d to a batch", url, response.status_code)
            self._failed(url)
        return False

    def _url(self, session_id: str, relay: str | None = None) -> str:
        return f"{relay or self.base_url}/v1/streams/{session_id}/publish"

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self, timeout: float = 2.0) -> None:
        """Let attempts still sending finish (up to `timeout`), then cancel the rest and close the client."""
        if self._tasks:
            _, still_running = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in still_running:
                task.cancel()
            await asyncio.gather(*still_running, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> StreamPublisher:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AttemptStream:
    """One NDJSON request carrying `start`, the attempt's deltas as they come, and `end` when the block exits.

    Nothing here raises or waits on the network: leaving the `async with` queues `end` and returns at once,
    the request finishes in the background (the publisher's `aclose()` waits for it). With several relays, a
    request that fails is followed by one to the next relay of the session's order, which starts with the
    attempt's whole text so far; each relay is tried at most once per attempt (a relay that saw part of the
    attempt would take the whole text again for new text).
    """

    def __init__(self, publisher: StreamPublisher, session_id: str, span_id: str, attempt: int) -> None:
        self._publisher = publisher
        self.session_id = session_id
        self.span_id = span_id
        self.attempt = attempt
        self.dropped = 0  # deltas not sent: relay unreachable, or the pending buffer overflowed
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._ready = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing = False
        self._stopped = False  # no further delta will be sent
        self._next_seq = 0
        self._task: asyncio.Task[None] | None = None
        self._relays = publisher.relays_for(session_id)
        self._relay = self._relays[0]  # the relay the attempt is published to now
        # The attempt's text per block, for a failover: kept only when there is a relay to fail over to.
        self._kept: dict[int, _Pending] | None = {} if len(self._relays) > 1 else None
        self._kept_bytes = 0

    async def __aenter__(self) -> AttemptStream:
        try:
            self._task = asyncio.get_running_loop().create_task(self._send(), name=f"corral-stream-{self.span_id}")
            self._publisher._track(self._task)
        except Exception as exc:  # never let the live view break the model call
            logger.warning("cannot start live streaming for span %s: %s", self.span_id, exc)
            self._stopped = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        self._closed.set()
        self._ready.set()

    async def delta(self, block: int, kind: DeltaKind, text: str) -> None:
        """Queue a piece of output; returns immediately whatever the relay is doing."""
        if not text or self._closing:
            return
        if self._stopped or kind not in ("text", "thinking"):
            self.dropped += 1
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if self._pending_bytes + size > self._publisher.max_pending_bytes:
            self._publisher._warn("stream relay %s is too slow for span %s", self._relay, self.span_id)
            self.dropped += sum(len(p.texts) for p in self._pending) + 1
            self._pending.clear()
            self._pending_bytes = 0
            self._stopped = True  # stop, rather than skip a piece and show the user a gap
            return
        last = self._pending[-1] if self._pending else None
        if last is not None and last.block == block and last.kind == kind:
            last.texts.append(text)  # the sender is behind: merge into the delta not yet sent
        else:
            self._pending.append(_Pending(block, kind, [text]))
        self._pending_bytes += size
        if self._kept is not None:
            self._keep(block, kind, text, size)
        self._ready.set()

    def _keep(self, block: int, kind: DeltaKind, text: str, size: int) -> None:
        assert self._kept is not None
        if self._kept_bytes + size > self._publisher.max_kept_bytes:
            self._kept = None  # too long to send again: a failover now ends the attempt's streaming instead
            return
        kept = self._kept.get(block)
        if kept is None:
            self._kept[block] = _Pending(block, kind, [text])
        else:
            kept.kind = kind
            kept.texts.append(text)
        self._kept_bytes += size

    def _record(self, record_type: str) -> bytes:
        record: PublishRecord
        if record_type == "start":
            record = StartRecord(span_id=self.span_id, attempt=self.attempt)
        else:
            record = EndRecord(span_id=self.span_id, attempt=self.attempt)
        return record_line(record)

    def _whole_text(self) -> bytes:
        """`start` and the attempt's text so far, one delta per block, for a relay taking over the attempt. It
        includes every pending delta, so those are dropped (no await between, so none comes in meanwhile)."""
        assert self._kept is not None
        lines = [self._record("start")]
        for block, kept in sorted(self._kept.items()):
            text = "".join(kept.texts)
            kept.texts = [text]
            record = DeltaRecord(span_id=self.span_id, attempt=self.attempt, seq=self._next_seq, block=block,
                                 kind=kept.kind, text=text)  # fmt: skip
            self._next_seq += 1
            lines.append(record_line(record))
        self._pending.clear()
        self._pending_bytes = 0
        return b"".join(lines)

    async def _body(self, whole: bool = False) -> AsyncIterator[bytes]:
        if whole and self._kept is None:
            return  # the text grew past what is kept since the failover began: send nothing rather than a part
        yield self._whole_text() if whole else self._record("start")
        while True:
            if self._pending:
                lines = []
                for pending in self._pending:
                    text = "".join(pending.texts)
                    record = DeltaRecord(
                        span_id=self.span_id,
                        attempt=self.attempt,
                        seq=self._next_seq,
                        block=pending.block,
                        kind=pending.kind,
                        text=text,
                    )
                    self._next_seq += 1
                    lines.append(record_line(record))
                self._pending.clear()
                self._pending_bytes = 0
                yield b"".join(lines)
                if self._publisher.flush_seconds > 0 and not self._closing:
                    with contextlib.suppress(TimeoutError):  # what comes meanwhile goes in one write; `end` at once
                        async with asyncio.timeout(self._publisher.flush_seconds):
                            await self._closed.wait()
            elif self._closing:
                break
            else:
                self._ready.clear()
                await self._ready.wait()
        yield self._record("end")

    async def _send(self) -> None:
        try:
            for index, relay in enumerate(self._relays):
                if index and (self._kept is None or self._stopped):
                    break  # its text so far is not kept (too long) or the attempt stopped streaming
                if await self._post(relay, whole=index > 0):
                    return
        finally:
            self._stopped = True
            self.dropped += sum(len(p.texts) for p in self._pending)
            self._pending.clear()

    async def _post(self, relay: str, whole: bool) -> bool:
        """One request carrying the attempt to `relay`; False if the relay refused it or the connection broke."""
        publisher = self._publisher
        self._relay = relay
        last = relay == self._relays[-1]
        consequence = "live text is dropped" if last else "the attempt moves to the next relay"
        try:
            response = await publisher._http().post(
                publisher._url(self.session_id, relay), content=self._body(whole), headers=publisher._headers
            )
            if response.status_code == 200:
                return True
            publisher._warn("stream relay %s answered %d", relay, response.status_code, consequence=consequence)
        except Exception as exc:
            publisher._warn("stream relay %s unreachable: %s", relay, type(exc).__name__, consequence=consequence)
        publisher._failed(relay)
        return False


# ---- subscribing ------------------------------------------------------------------------------------------
