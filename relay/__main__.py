"""Console entry point `corral-stream`: serve the live token-streaming relay over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from types import FrameType

import uvicorn

from corral.names import ENV_STREAM_TOKEN
from relay.app import create_stream_app
from relay.hub import DEFAULT_RETAIN_SECONDS, StreamHub

logger = logging.getLogger("relay")

TOKEN_ENV = ENV_STREAM_TOKEN


class _RelayServer(uvicorn.Server):
    """uvicorn, ending subscriber streams on Ctrl-C/SIGTERM so that clients reconnect at once."""

    def __init__(self, config: uvicorn.Config, hub: StreamHub) -> None:
        super().__init__(config)
        self._hub = hub

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._hub.close_subscriptions)
        except RuntimeError:
            pass  # no loop running yet: no subscribers either
        super().handle_exit(sig, frame)


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The command-line options; separate so they can be tested without starting a server."""
    parser = argparse.ArgumentParser(
        prog="corral-stream",
        description="corral's stream relay: model workers publish live text, clients follow it over SSE.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"require `Authorization: Bearer TOKEN` on publish and subscribe (default: ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--retain-seconds",
        type=_positive,
        default=DEFAULT_RETAIN_SECONDS,
        metavar="SECONDS",
        help=f"keep ended spans for reconnecting clients this long (default {DEFAULT_RETAIN_SECONDS:g})",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse options, log one line saying where the relay listens, and serve until interrupted."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_stream_app(token=args.token, retain_seconds=args.retain_seconds)
    logger.info(
        "corral stream relay listening on http://%s:%d (auth %s, retain %gs)",
        args.host,
        args.port,
        "on" if args.token else "off",
        args.retain_seconds,
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=2
    )
    _RelayServer(config, app.state.hub).run()


if __name__ == "__main__":
    main()
