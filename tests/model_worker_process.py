"""A real model worker process for the routing tests: `workers.roles.model_workers` (the shared queue and its own,
`<queue>@<worker id>`), as `corral-model` runs it, so a test can SIGKILL the worker that holds a conversation."""

from __future__ import annotations

import argparse
import asyncio

import anthropic

from activities.model import warm_http_client
from corral.temporal import connect
from workers.roles import model_workers
from workers.run import run_until_stopped, setup_logging


async def _main(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    model = anthropic.AsyncAnthropic(
        base_url=args.model_url, api_key="test-key", max_retries=0, http_client=warm_http_client()
    )
    await run_until_stopped(model_workers(client, model, args.model_queue, worker_id=args.worker_id))


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--address", "--model-url", "--model-queue", "--worker-id"):
        parser.add_argument(option, required=True)
    setup_logging()
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
