"""Run workers until SIGTERM or SIGINT, then shut down gracefully (in-flight activities get time to finish)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from datetime import timedelta

from temporalio.worker import Worker

log = logging.getLogger("workers")

GRACEFUL_SHUTDOWN = timedelta(seconds=10)
STICKY_TIMEOUT = timedelta(seconds=3)
"""A workflow task cached on a worker that died goes to any other worker after this long."""


async def run_until_stopped(workers: Sequence[Worker]) -> None:
    """Run every worker; the first SIGTERM/SIGINT shuts them all down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(worker.run()) for worker in workers]
    for worker in workers:
        log.info("worker on task queue %s started", worker.task_queue)
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopped, *runs], return_when=asyncio.FIRST_COMPLETED)
    if stopped not in done:
        for task in done:
            task.result()  # a worker that died on its own: raise its error
    log.info("shutting down")
    await asyncio.gather(*(worker.shutdown() for worker in workers), return_exceptions=True)
    for task in runs:
        if not task.done():
            task.cancel()


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
