"""Run the model server with uvicorn in a background thread, so tests and benchmarks can embed it in-process."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from corral.serving import ServerThread
from modelserver.app import create_app
from modelserver.scripts import Script, ScriptBook


class ModelServerThread(ServerThread):
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
        self.book: ScriptBook = app.state.book
        super().__init__(app, host=host, name="corral-model-server", startup_timeout=startup_timeout)

    def register(self, name: str, script: Script | dict[str, Any]) -> None:
        """Register a script without an HTTP round trip; dicts are validated like `PUT /_corral/scripts`."""
        self.book.register(name, script if isinstance(script, Script) else Script.model_validate(script))
