"""`corral-model`: runs model turns on `corral-model`, with `ANTHROPIC_API_KEY` / `ANTHROPIC_BASE_URL` from
its own environment only."""

import asyncio
import os
import sys

from corral.temporal import connect
from workers._run import run_until_stopped, setup_logging
from workers.roles import model_worker


def check_model_environment() -> None:
    """Fail at start, with a clear message, rather than on the first model turn."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        sys.exit(
            "corral-model: ANTHROPIC_API_KEY is not set. Set it (and ANTHROPIC_BASE_URL for a compatible endpoint), "
            "or run `corral up`, which starts the offline stand-in model when no key is set."
        )


async def _main() -> None:
    client = await connect()
    await run_until_stopped([model_worker(client)])


def main() -> None:
    setup_logging()
    check_model_environment()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
