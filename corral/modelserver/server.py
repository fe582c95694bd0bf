"""Run the model server with uvicorn in a background thread, so tests and the CLI can embed it in-process."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from corral.modelserver.app import create_app
from corral.modelserver.scripts import Script, ScriptBook


class ModelServerThread:
    """The offline model server on 127.0.0.1 and a free port, running in a daemon thread.

    `start()` returns the base URL to hand to `anthropic.Anthropic(base_url=...)`; `stop()` shuts it down.
    """

    def __init__(
        self,
        app: Starlette | None = None,
        *,
        first_token_latency: float = 0.0,
        tokens_per_second: float = 0.0,
        book: ScriptBook | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 10.0,
    ) -> None:
        if app is None:
            app = create_app(first_token_latency=first_token_latency, tokens_per_second=tokens_per_second, book=book)
        self.app = app
        self.book: ScriptBook = app.state.book
        self.host = host
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def register(self, name: str, script: Script | dict[str, Any]) -> None:
        """Register a script without an HTTP round trip; dicts are validated like `PUT /_corral/scripts`."""
        self.book.register(name, script if isinstance(script, Script) else Script.model_validate(script))

    def start(self) -> str:
        """Start serving and block until the socket is bound; returns `http://127.0.0.1:PORT`."""
        if self.base_url is not None:
            return self.base_url
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=0,
            log_level="warning",
            log_config=None,  # Leave the embedding process's logging configuration alone.
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server

        def run() -> None:
            try:
                asyncio.run(server.serve())
            except BaseException as exc:  # SystemExit on bind failure must not vanish silently.
                self._error = exc

        self._thread = threading.Thread(target=run, name="corral-model-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"corral offline model server failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("corral offline model server did not start in time")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread; forces exit if connections linger."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)
        self._server = self._thread = None
        self.base_url = None

    def __enter__(self) -> ModelServerThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
