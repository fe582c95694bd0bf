"""A user's webhook receiver, for tests: a real HTTP server that verifies each delivery with the SDK, as a user's
server would (`client.beta.webhooks.unwrap(body, headers=…, key=secret)`), and keeps what it got.

It can answer with any status (`answer`), hold its answer until released (`hold()`: the test sees the request
arrive, then does something, then `release()`), and be shut and opened again on the same port (`down()` / `up()`:
a receiver that is down refuses connections, as a stopped server does).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import anthropic
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.serving import ServerThread


@dataclass(frozen=True)
class Received:
    path: str
    webhook_id: str
    event: Any
    """The SDK's `BetaWebhookEvent` (None when the delivery did not verify)."""
    verified: bool
    answered: int
    body: str


class WebhookReceiver:
    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        """The signing secret of each path (an endpoint's URL is `url(path)`)."""
        self.received: list[Received] = []
        self.answer = 200
        self._lock = threading.Lock()
        self._holding = False
        self._released = threading.Event()
        self.held = threading.Event()
        """Set when a request arrived while holding (its answer waits for `release()`)."""
        self._sdk = anthropic.Anthropic(api_key="unused", base_url="http://127.0.0.1:9")
        self._server: ServerThread | None = None
        self.port = 0
        self.up()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def up(self) -> None:
        self._server = ServerThread(Starlette(routes=[Route("/{path:path}", self._handle, methods=["POST"])]),
                                    port=self.port, name="webhook-receiver")  # fmt: skip
        self._server.start()
        self.port = self._server.port

    def down(self) -> None:
        assert self._server is not None
        self._server.stop()

    def hold(self) -> None:
        self._released.clear()
        self.held.clear()
        self._holding = True

    def release(self) -> None:
        self._holding = False
        self._released.set()

    def ids(self, path: str | None = None, verified: bool = True) -> list[str]:
        with self._lock:
            return [r.webhook_id for r in self.received if r.verified == verified and path in (None, r.path)]

    def events(self, path: str | None = None) -> list[Any]:
        with self._lock:
            return [r.event for r in self.received if r.verified and path in (None, r.path)]

    async def _handle(self, request: Request) -> Response:
        body = (await request.body()).decode()
        path = request.url.path
        headers = dict(request.headers)
        try:
            event = self._sdk.beta.webhooks.unwrap(body, headers=headers, key=self.keys[path])
            verified = True
        except Exception:  # a wrong signature, a missing header, no key for the path: the test sees verified=False
            event, verified = None, False
        if self._holding:
            self.held.set()
            await asyncio.to_thread(self._released.wait)
        answered = self.answer if verified else 400
        with self._lock:
            self.received.append(Received(path, headers.get("webhook-id", ""), event, verified, answered, body))
        return JSONResponse({"ok": answered < 300}, status_code=answered)

    def close(self) -> None:
        self.release()
        if self._server is not None:
            self._server.stop()
