"""A fault switch in front of a real MCP server: tool calls can be held (slow, or a gate a test opens), answered
with garbage, or answered with JSON-RPC that does not fit the request, while discovery keeps working.

By default only `tools/call` requests are touched; `server/discover`, `initialize` and `tools/list` reach the real
server, so a session binds and discovers its tools before the fault bites, mid-turn. `methods` widens that (to
`tools/list`, for a server that answers discovery with garbage).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

Fault = Literal["none", "hold", "garbage", "wrong_id", "bad_result"]

GARBAGE = b"<html><body>502 upstream exploded \x00\xff</body>"


@dataclass
class McpFaults:
    """What the next tool calls meet. Thread-safe: the server runs in its own thread, the test in another.

    - `hold`: the call waits until `release()` (a gate a test opens, or a server slower than any timeout);
    - `garbage`: HTTP 200, `application/json`, a body that is not JSON;
    - `wrong_id`: a well-formed JSON-RPC result, for a request id that was never sent;
    - `bad_result`: the right id, but a result that is not a `CallToolResult`.
    """

    fault: Fault = "none"
    methods: frozenset[str] = frozenset({"tools/call"})
    """The JSON-RPC methods the fault applies to."""
    calls: int = 0
    held: int = 0
    _released: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def release(self) -> None:
        """Let every held call (and every later one) through to the real server."""
        self._released.set()

    def _count(self, holding: bool) -> None:
        with self._lock:
            self.calls += 1
            self.held += int(holding)


class FaultyMcp:
    """ASGI middleware: the real MCP app behind it, with `faults` applied to each `tools/call`."""

    def __init__(self, app: Any, faults: McpFaults) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request_id = _request_id(body, self.faults.methods)
        fault = self.faults.fault
        if request_id is not None:
            self.faults._count(holding=fault == "hold")
            if fault == "hold":
                while not self.faults._released.is_set():
                    await asyncio.sleep(0.05)
            elif fault != "none":
                await _answer(send, _faulty_body(fault, request_id))
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)


def _request_id(body: bytes, methods: frozenset[str]) -> Any:
    """The JSON-RPC id of a request for one of `methods`, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") in methods:
        return message.get("id")
    return None


def _faulty_body(fault: Fault, request_id: Any) -> bytes:
    if fault == "garbage":
        return GARBAGE
    if fault == "wrong_id":
        other = f"{request_id}-never-sent" if isinstance(request_id, str) else int(request_id) + 1000
        return json.dumps({"jsonrpc": "2.0", "id": other, "result": {"content": []}}).encode()
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list", "isError": 7}}).encode()


async def _answer(send: Any, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
