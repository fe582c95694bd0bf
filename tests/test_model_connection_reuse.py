"""A model call sent on a kept-alive connection that the server closed meanwhile is sent again on a new one.

The model worker keeps idle connections to the model for 30 s (`warm_http_client`), and a server may close an idle
one sooner (uvicorn, which serves the offline model, after 5 s). When that close crosses the worker's next request
in the socket, the request fails before any byte of an answer: a reset, or a close without a response. Nothing of
the turn has happened, so the activity sends it once more on a fresh connection, instead of failing the turn (a
`session.error` and a retried turn). A TCP relay in front of the real model server closes a kept-alive connection
the moment its second request arrives, once, the way the server's idle close does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anthropic
import pytest

from activities.model import warm_http_client
from corral.client import send_text, wait_for_idle
from relay import StreamPublisher
from tests.conftest import Stack, texts, unique
from workers.roles import model_worker

pytestmark = pytest.mark.timeout(120)


@dataclass
class ClosingRelay:
    """Forwards each connection to the model server; closes one kept-alive connection as its second request comes."""

    upstream: tuple[str, int]
    reset: bool
    """Close with a reset (SO_LINGER 0: "Connection reset by peer"), else plainly (no response: a clean EOF)."""
    drops_left: int = 1
    connections: int = 0
    dropped: int = 0
    port: int = 0
    serving: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.serving.append(asyncio.current_task())  # type: ignore[arg-type]
        self.clients.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        back = asyncio.ensure_future(self._pump(up_reader, writer))
        requests = 0
        try:
            while chunk := await reader.read(65536):
                if chunk.startswith((b"POST ", b"GET ")):
                    requests += 1
                    if requests == 2 and self.drops_left:
                        self.drops_left -= 1
                        self.dropped += 1
                        self._close(writer)
                        return
                up_writer.write(chunk)
                await up_writer.drain()
        finally:
            back.cancel()
            up_writer.close()
            writer.close()

    def _close(self, writer: asyncio.StreamWriter) -> None:
        if self.reset:
            raw = writer.get_extra_info("socket")
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort() if self.reset else writer.close()

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()


@contextlib.asynccontextmanager
async def closing_relay(stack: Stack, reset: bool) -> AsyncIterator[ClosingRelay]:
    base = str(stack.model_server.base_url).rstrip("/").removeprefix("http://")
    host, port = base.rsplit(":", 1)
    relay = ClosingRelay((host, int(port)), reset)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    relay.port = server.sockets[0].getsockname()[1]
    async with server:
        yield relay
        for writer in relay.clients:  # the pool's idle connections end: each one's forwarding ends with it
            writer.close()
        await asyncio.gather(*relay.serving, return_exceptions=True)


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
async def test_a_turn_on_a_connection_the_server_closed_is_sent_again_not_failed(stack: Stack, reset: bool) -> None:
    async with closing_relay(stack, reset) as relay:
        queue = unique("model")
        model = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{relay.port}", api_key="test-key",
                                         max_retries=0, http_client=warm_http_client())  # fmt: skip
        publisher = StreamPublisher(str(stack.stream_relay.base_url))
        async with model_worker(stack.client, model, queue, stream=publisher, proxy_queue=stack.proxy_queue):
            script = stack.script([{"text": "first"}, {"text": "second"}])
            handle = await stack.start(script, message="one", model_task_queue=queue)
            first = await wait_for_idle(handle)
            await send_text(handle, "two")
            second = await wait_for_idle(handle, after=first[-1].position)
        await publisher.aclose()
    assert relay.dropped == 1, "the second turn's request met a closed kept-alive connection"
    assert relay.connections == 2, "it was sent again on a new connection"
    events = first + second
    assert texts(events) == ["first", "second"]
    assert [e for e in events if e.type == "session.error"] == [], "the turn did not fail"
    assert len(stack.requests(script)) == 2, "the model answered each turn once"
