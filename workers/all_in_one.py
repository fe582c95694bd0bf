"""`corral-all-in-one`: every role in one process, for local use. The roles still use separate task queues."""

import asyncio

from corral.temporal import connect, ensure_search_attributes
from workers._run import run_until_stopped, setup_logging
from workers.model import check_model_environment
from workers.roles import harness_worker, model_worker, utility_hand_worker
from workers.sandbox import sandbox_role


async def _main() -> None:
    client = await connect()
    await ensure_search_attributes(client)
    async with sandbox_role(client) as sandbox:
        await run_until_stopped([harness_worker(client), model_worker(client), utility_hand_worker(client), *sandbox])


def main() -> None:
    setup_logging()
    check_model_environment()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
