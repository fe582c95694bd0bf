"""The sandbox worker's side of the resident runner: one open stream per container, requests matched by id.

Each sandbox container runs `corral-runner` (images/sandbox/tools) as its main process. The worker attaches to
the container once (stdin, stdout and stderr over one hijacked HTTP connection) and keeps the stream open: a call
is one line of JSON written and one read back, with no process started per call and no polling. A thread reads
each stream, because the Docker SDK's sockets are blocking (and may be TLS); it hands each answer to the event
loop. When a stream ends (the worker's engine connection dropped, the daemon restarted, the container died),
every waiting request fails with `RunnerLost`; requests are idempotent by call id, so the caller may open a new
stream and ask again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import docker
import docker.errors

from sandbox.errors import RunnerLost, SandboxError

log = logging.getLogger(__name__)

RUNNER = "/opt/corral/bin/corral-runner"
RUNNER_LABEL = "corral.runner"
"""On containers whose main process is the resident runner: its protocol version."""
PROTOCOL_VERSION = "1"
STDOUT, STDERR = 1, 2
HELLO_TIMEOUT_SECONDS = 30.0
"""How long a fresh container's runner may take to answer its first request (python start-up under load)."""


class RunnerStream:
    """One attached stream to one container's runner."""

    def __init__(self, container_id: str, sock: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.container_id = container_id
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)
        self._loop = loop
        self._send_lock = threading.Lock()
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._prefix = os.urandom(6).hex()
        self.closed: str | None = None
        """Why the stream ended, once it has."""
        self.on_end: Callable[[RunnerStream], None] | None = None
        self._reader = threading.Thread(target=self._read, name=f"runner-{container_id[:12]}", daemon=True)
        self._reader.start()

    @classmethod
    async def open(cls, client: docker.DockerClient, container_id: str) -> RunnerStream:
        def attach() -> Any:
            params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            return client.api.attach_socket(container_id, params=params)

        try:
            sock = await asyncio.to_thread(attach)
        except docker.errors.APIError as exc:
            raise RunnerLost(f"could not attach to the sandbox's runner: {exc}") from exc
        return cls(container_id, sock, asyncio.get_running_loop())

    async def request(self, op: str, wait: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and wait up to `wait` seconds for its answer (RunnerLost if the stream ends first)."""
        if self.closed is not None:
            raise RunnerLost(self.closed)
        request_id = f"{self._prefix}-{next(self._ids)}"
        answer: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._waiting[request_id] = answer
        line = json.dumps({"id": request_id, "op": op, **fields}).encode() + b"\n"
        try:
            await asyncio.to_thread(self._send, line)
            return await asyncio.wait_for(answer, wait)
        finally:
            self._waiting.pop(request_id, None)

    def send_without_answer(self, op: str, **fields: Any) -> None:
        """Fire and forget (a kill on the way out of a cancelled call); errors are ignored."""
        with contextlib.suppress(OSError, RunnerLost):
            self._send(json.dumps({"id": None, "op": op, **fields}).encode() + b"\n")

    def _send(self, line: bytes) -> None:
        with self._send_lock:
            if self.closed is not None:
                raise RunnerLost(self.closed)
            try:
                self._raw.sendall(line)
            except OSError as exc:
                raise RunnerLost(f"the stream to the sandbox's runner broke: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    # ---- the reader thread -----------------------------------------------------------------------------------

    def _read(self) -> None:
        """Demultiplex Docker's frames (8-byte header: stream, 3 zero bytes, big-endian length) into lines."""
        pending = b""
        reason = "the sandbox's runner closed its stream (the container stopped)"
        try:
            while True:
                header = self._exactly(8)
                if header is None:
                    break
                stream, length = header[0], struct.unpack(">I", header[4:])[0]
                payload = self._exactly(length)
                if payload is None:
                    break
                if stream == STDERR:
                    log.debug("runner %s: %s", self.container_id[:12], payload.decode(errors="replace").rstrip())
                    continue
                pending += payload
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._deliver(line)
        except OSError as exc:
            reason = f"the stream to the sandbox's runner broke: {exc}"
        with contextlib.suppress(RuntimeError):  # the loop closed first: nobody is waiting
            self._loop.call_soon_threadsafe(self._end, reason)

    def _exactly(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            chunk = self._raw.recv(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _deliver(self, line: bytes) -> None:
        try:
            answer = json.loads(line)
        except ValueError:
            log.warning("runner %s wrote a line that is not JSON: %r", self.container_id[:12], line[:200])
            return
        request_id = answer.get("id") if isinstance(answer, dict) else None
        if isinstance(request_id, str) and request_id.startswith(self._prefix):
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._resolve, request_id, answer)

    def _resolve(self, request_id: str, answer: dict[str, Any]) -> None:
        future = self._waiting.get(request_id)
        if future is not None and not future.done():
            future.set_result(answer)

    def _end(self, reason: str) -> None:
        self.closed = reason
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RunnerLost(reason))
        self.close()
        if self.on_end is not None:
            self.on_end(self)


class Runners:
    """The streams one sandbox worker keeps open, one per container, opened on first use."""

    def __init__(self, client: docker.DockerClient) -> None:
        self._client = client
        self._streams: dict[str, RunnerStream] = {}
        self._opening: dict[str, asyncio.Task[RunnerStream]] = {}

    async def stream(self, container_id: str) -> RunnerStream:
        stream = self._streams.get(container_id)
        if stream is not None and stream.closed is None:
            return stream
        opening = self._opening.get(container_id)
        if opening is None:
            opening = asyncio.ensure_future(self._open(container_id))
            self._opening[container_id] = opening
            opening.add_done_callback(lambda _: self._opening.pop(container_id, None))
        return await asyncio.shield(opening)

    async def _open(self, container_id: str) -> RunnerStream:
        stream = await RunnerStream.open(self._client, container_id)
        try:
            hello = await stream.request("hello", HELLO_TIMEOUT_SECONDS)
        except (RunnerLost, TimeoutError):
            stream.close()
            raise
        if not hello.get("ok"):
            stream.close()
            raise SandboxError(f"the sandbox's runner refused the stream: {hello}")
        self._streams[container_id] = stream
        stream.on_end = self._ended  # a stopped or removed container's stream is not kept
        return stream

    def _ended(self, stream: RunnerStream) -> None:
        if self._streams.get(stream.container_id) is stream:
            del self._streams[stream.container_id]

    async def request(self, container_id: str, op: str, wait: float | None = None, **fields: Any) -> dict[str, Any]:
        """One request on the container's stream (opened if needed). RunnerLost when the stream ends first: the
        caller checks whether the container died, and if not, may ask again (every request is idempotent)."""
        stream = await self.stream(container_id)
        try:
            return await stream.request(op, wait, **fields)
        except RunnerLost:
            self.forget(container_id)
            raise

    def __len__(self) -> int:
        """How many streams are open."""
        return len(self._streams)

    def forget(self, container_id: str) -> None:
        stream = self._streams.pop(container_id, None)
        if stream is not None:
            stream.close()

    def close(self) -> None:
        for container_id in list(self._streams):
            self.forget(container_id)
