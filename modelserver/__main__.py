"""Console entry point `corral-model-server`: serve the offline stand-in model over HTTP."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from modelserver.app import create_app

logger = logging.getLogger("modelserver")


def _non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The command-line options; separate so they can be tested without starting a server."""
    parser = argparse.ArgumentParser(
        prog="corral-model-server",
        description="corral's offline model server: a deterministic Messages-API stand-in, not a real model.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--first-token-latency",
        type=_non_negative,
        default=0.0,
        metavar="SECONDS",
        help="delay before the first streamed token (default 0)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=_non_negative,
        default=0.0,
        metavar="N",
        help="streaming rate; 0 means as fast as possible (default 0)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse options, announce that this is a stand-in, and serve until interrupted."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(first_token_latency=args.first_token_latency, tokens_per_second=args.tokens_per_second)
    logger.info(
        "corral offline model server — a deterministic stand-in, not a real model — listening on http://%s:%d",
        args.host,
        args.port,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
