"""Serve an ASGI app with uvicorn in a daemon thread, on a socket bound before the app starts.

Binding first (port 0 = any free port) means the port is known before the app is built, with no window in which
another process could take it. The git proxy, the offline model server, the stream relay and the test servers all
start this way.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import uvicorn


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket on `host:port` (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio enables TCP_NODELAY only on sockets whose proto says TCP, and without it
    # every small request waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """One uvicorn server in a daemon thread. `start()` blocks until it accepts connections; `stop()` ends it.

    `app` may be an ASGI app or a factory taking the base URL (`http://host:port`), for apps that must know
    their own address (an MCP server's resource URL, for instance)."""

    def __init__(
        self,
        app: Any | Callable[[str], Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "corral-server",
        lifespan: str = "auto",
        startup_timeout: float = 10.0,
        app_takes_url: bool = False,
        before_stop: Callable[[], None] | None = None,
    ) -> None:
        self._app = app
        self._app_takes_url = app_takes_url
        self.host = host
        self.port = port
        self.name = name
        self.lifespan = lifespan
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self.app: Any = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._before_stop = before_stop
        """Run on the server's loop when stopping (e.g. end streams that never end by themselves)."""

    def start(self) -> str:
        """Start serving; returns the base URL (`http://host:port`). Idempotent."""
        if self.base_url is not None:
            return self.base_url
        sock = bind_socket(self.host, self.port)
        port = int(sock.getsockname()[1])
        url_host = f"[{self.host}]" if ":" in self.host else self.host
        base_url = f"http://{url_host}:{port}"
        self.app = self._app(base_url) if self._app_takes_url else self._app
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            log_config=None,  # leave the embedding process's logging alone
            access_log=False,
            lifespan=self.lifespan,  # type: ignore[arg-type]
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve(sockets=[sock])

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # a failure to start must not vanish silently
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.name} failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start within {self.startup_timeout} s")
            time.sleep(0.01)
        self.port = port
        self.base_url = base_url
        return base_url

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread (forcing it if connections linger). Idempotent."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        loop = self._loop
        if self._before_stop is not None and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._before_stop)
            except RuntimeError:
                pass  # the loop closed in between
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)
        self._server = self._thread = None
        self._loop = None
        self.base_url = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
