"""A real sandbox worker process (for the SIGKILL test): the sandbox hand alone, on the real engine."""

from __future__ import annotations

import argparse
import asyncio

import docker

from activities.sandbox import SandboxActivities
from corral.temporal import cluster_id, connect
from workers.roles import sandbox_workers
from workers.run import run_until_stopped, setup_logging


async def _main(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    activities = SandboxActivities(docker.from_env(), args.image, await cluster_id(client))
    await run_until_stopped(sandbox_workers(client, activities))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--image", required=True)
    setup_logging()
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
