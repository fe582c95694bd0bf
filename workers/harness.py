"""`corral-harness`: runs `SessionWorkflow` on `corral-harness`. Stateless: kill it any time."""

import asyncio

from corral.temporal import connect, ensure_search_attributes
from workers._run import run_until_stopped, setup_logging
from workers.roles import harness_worker


async def _main() -> None:
    client = await connect()
    await ensure_search_attributes(client)
    await run_until_stopped([harness_worker(client)])


def main() -> None:
    setup_logging()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
