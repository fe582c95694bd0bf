"""Keep an activity heartbeating while it waits, so a lost worker is noticed fast and cancellation arrives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity


@contextlib.asynccontextmanager
async def heartbeating(interval: float = 1.0) -> AsyncIterator[None]:
    """Heartbeat every `interval` seconds for the duration of the block (the SDK throttles what it sends)."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
