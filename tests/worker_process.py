"""A real worker process for crash tests: harness + model + test hand in one process, on given task queues."""

from __future__ import annotations

import argparse
import asyncio

import anthropic
from temporalio.worker import Worker

from corral.hands import make_execute_activity
from corral.temporal import connect
from tests.hand_tools import TEST_TOOLS
from workers.roles import harness_worker, model_worker
from workers.run import run_until_stopped, setup_logging


async def _main(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    model = anthropic.AsyncAnthropic(base_url=args.model_url, api_key="test-key", max_retries=0)
    await run_until_stopped(
        [
            harness_worker(client, args.harness_queue),
            model_worker(client, model, args.model_queue),
            Worker(client, task_queue=args.hand_queue, activities=[make_execute_activity(TEST_TOOLS)]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--address", "--model-url", "--harness-queue", "--model-queue", "--hand-queue"):
        parser.add_argument(option, required=True)
    setup_logging()
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
