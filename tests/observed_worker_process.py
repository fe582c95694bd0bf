"""A real worker process for the observability test: one role (`harness`, or `model` with the test hand beside it) on
given task queues, set up as the role's own entrypoint sets it up (`corral.telemetry.setup` named after the role), so
its traces, metrics and logs are what a deployed worker exports."""

from __future__ import annotations

import argparse
import asyncio

import anthropic
from temporalio.worker import Worker

from corral import telemetry
from corral.hands import make_execute_activity
from corral.temporal import connect
from tests.hand_tools import TEST_TOOLS
from workers.roles import harness_worker, model_worker
from workers.run import run_until_stopped


async def _main(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    if args.role == "harness":
        workers = [harness_worker(client, args.harness_queue)]
    else:
        model = anthropic.AsyncAnthropic(base_url=args.model_url, api_key="test-key", max_retries=0)
        workers = [
            model_worker(client, model, args.model_queue),
            Worker(client, task_queue=args.hand_queue, activities=[make_execute_activity(TEST_TOOLS)]),
        ]
    await run_until_stopped(workers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["harness", "model"], required=True)
    for option in ("--address", "--model-url", "--harness-queue", "--model-queue", "--hand-queue"):
        parser.add_argument(option, required=True)
    args = parser.parse_args()
    telemetry.setup(f"corral-{args.role}")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
