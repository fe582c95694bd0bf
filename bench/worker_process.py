"""A real worker process for the benchmarks: the roles asked for, built by `workers.roles` as shipped.

    python -m bench.worker_process --address HOST:PORT --roles harness,model,sandbox,utility \
        --harness-queue Q --model-queue Q --model-url URL [--stream-url URL] [--image IMAGE]

`harness` runs `SessionWorkflow`, `model` the model turns (with live deltas when `--stream-url` is given; on the
shared queue and its own, as `corral-model` does, unless `--no-model-routing`),
`sandbox` the Docker hand on `corral-sandbox` and its engine queue, `utility` the `get_time`/`calculate` hand.
The benchmark kills it with SIGKILL or stops it with SIGTERM; its identity is Temporal's default, `pid@host`.
"""

from __future__ import annotations

import argparse
import asyncio

import anthropic
import docker
from temporalio.worker import Worker

from activities.model import warm_http_client, warm_up
from activities.sandbox import SandboxActivities
from corral.names import HARNESS_TASK_QUEUE, MODEL_TASK_QUEUE
from corral.temporal import cluster_id, connect
from relay import StreamPublisher
from workers.roles import harness_worker, model_worker, model_workers, sandbox_workers, utility_hand_worker
from workers.run import run_until_stopped, setup_logging

ROLES = ("harness", "model", "sandbox", "utility")


async def _main(args: argparse.Namespace) -> None:
    roles = set(args.roles.split(","))
    unknown = roles - set(ROLES)
    if unknown:
        raise SystemExit(f"unknown roles: {', '.join(sorted(unknown))}")
    client = await connect(args.address)
    workers: list[Worker] = []
    if "harness" in roles:
        workers.append(harness_worker(client, args.harness_queue))
    if "model" in roles:
        model = anthropic.AsyncAnthropic(
            base_url=args.model_url, api_key="bench", max_retries=0, http_client=warm_http_client()
        )
        stream = StreamPublisher(args.stream_url) if args.stream_url else None
        if args.no_model_routing:  # as before routing: one queue, the turns go to any worker
            workers.append(model_worker(client, model, args.model_queue, stream=stream))
        else:
            await warm_up(model)
            workers.extend(model_workers(client, model, args.model_queue, stream=stream))
    if "sandbox" in roles:
        activities = SandboxActivities(docker.from_env(), args.image, await cluster_id(client))
        workers.extend(sandbox_workers(client, activities))
    if "utility" in roles:
        workers.append(utility_hand_worker(client))
    await run_until_stopped(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    parser.add_argument("--roles", required=True, help=f"comma-separated, of: {', '.join(ROLES)}")
    parser.add_argument("--harness-queue", default=HARNESS_TASK_QUEUE)
    parser.add_argument("--model-queue", default=MODEL_TASK_QUEUE)
    parser.add_argument("--model-url")
    parser.add_argument("--stream-url")
    parser.add_argument("--image")
    parser.add_argument(
        "--no-model-routing",
        action="store_true",
        help="model role on the shared queue only, with no warm-up (as before routing)",
    )
    setup_logging()
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
