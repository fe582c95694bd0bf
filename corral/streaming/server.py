"""Run the stream relay with uvicorn in a background thread, for tests and for embedding in `corral up`."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType

import uvicorn
from starlette.applications import Starlette

from corral.streaming.app import create_stream_app
from corral.streaming.hub import DEFAULT_RETAIN_SECONDS, StreamHub


class StreamRelayThread:
    """The relay on 127.0.0.1 and a free port in a daemon thread; `start()` returns its base URL."""

    def __init__(
        self,
        app: Starlette | None = None,
        *,
        token: str | None = None,
        retain_seconds: float = DEFAULT_RETAIN_SECONDS,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 10.0,
    ) -> None:
        self.app = app if app is not None else create_stream_app(token=token, retain_seconds=retain_seconds)
        self.hub: StreamHub = self.app.state.hub
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        """Serve, and block until the socket is bound; returns `http://HOST:PORT`."""
        if self.base_url is not None:
            return self.base_url
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            log_config=None,  # leave the embedding process's logging alone
            access_log=False,
            lifespan="off",
            # Subscriber streams never end by themselves; do not let them hold up a stop.
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve()

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # SystemExit on a bind failure must not vanish silently
                self._error = exc

        self._thread = threading.Thread(target=run, name="corral-stream-relay", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"corral stream relay failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("corral stream relay did not start in time")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread, forcing the exit if connections linger."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # End subscriber streams first: they never end by themselves and would hold up the shutdown.
            try:
                loop.call_soon_threadsafe(self.hub.close_subscriptions)
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

    def __enter__(self) -> StreamRelayThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
