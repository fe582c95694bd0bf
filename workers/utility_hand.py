"""`corral-utility-hand`: serves the utility tools (`get_time`, `calculate`) on `corral-utility`."""

import asyncio

from corral.temporal import connect
from workers._run import run_until_stopped, setup_logging
from workers.roles import utility_hand_worker


async def _main() -> None:
    client = await connect()
    await run_until_stopped([utility_hand_worker(client)])


def main() -> None:
    setup_logging()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
