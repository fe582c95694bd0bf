"""Run the stream relay with uvicorn in a background thread, for tests and for embedding."""

from __future__ import annotations

from starlette.applications import Starlette

from corral.serving import ServerThread
from relay.app import create_stream_app
from relay.hub import DEFAULT_RETAIN_SECONDS, StreamHub


class StreamRelayThread(ServerThread):
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
        relay = app if app is not None else create_stream_app(token=token, retain_seconds=retain_seconds)
        self.hub: StreamHub = relay.state.hub
        super().__init__(
            relay,
            host=host,
            port=port,
            name="corral-stream-relay",
            startup_timeout=startup_timeout,
            before_stop=self.hub.close_subscriptions,  # subscriber streams never end by themselves
        )
