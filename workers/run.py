"""Run workers until SIGTERM or SIGINT, then shut down gracefully (in-flight activities get time to finish).

`run_worker` is the body of every entrypoint's `main()`: settings read once, then the role served; a bad setting or
a service that does not answer at start ends the process with one line on stderr, not a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import PollerBehaviorAutoscaling, Worker

from corral import telemetry
from corral.names import ENV_TEMPORAL_ADDRESS
from corral.temporal import connect
from workers.errors import WorkerStartError
from workers.settings import SettingsError, TemporalSettings

log = logging.getLogger("workers")

GRACEFUL_SHUTDOWN = timedelta(seconds=10)
STICKY_TIMEOUT = timedelta(seconds=3)
"""A workflow task cached on a worker that died goes to any other worker after this long."""
POLLERS = PollerBehaviorAutoscaling()
"""How the harness and the model workers poll: as many polls at once as the server has tasks waiting for them (the
SDK's autoscaling poller, up to 100). With a fixed 5 (the SDK's default), `bench.load`'s 200 sessions kept workflow
tasks waiting seconds in the server's queue and timing out by the thousand on the harness's sticky queue (each then
replayed in full from the shared one) while the harness used a third of a core: the polls were the bottleneck, not
the worker. A live worker now takes a task within a poll's round trip, so a task that waits out `STICKY_TIMEOUT` or
`ROUTED_SCHEDULE_TO_START` is most often on a worker that is gone (bench/results/load.md, recovery.md).

The hands keep the SDK's 5 polls. Measured under the same load with this poller on the hands too: `execute` waited
0.5 s p50 instead of 3 s, but the turns it let through crowded the model worker (179 heartbeat time-outs, 163 turns
that ended in a `session.error`). A turn waits most cheaply where it is: in a hand's queue."""

EXIT_START_FAILED = 1
EXIT_BAD_SETTINGS = 2
"""As for a command-line usage error: the process was started wrongly, and starting it again will not help."""

Settings = TypeVar("Settings")


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


async def connect_to_temporal(settings: TemporalSettings) -> Client:
    """A client of the configured server, or WorkerStartError saying where it was looked for."""
    try:
        return await connect(settings.address, settings.namespace)
    except (RuntimeError, RPCError) as exc:  # the SDK reports a refused or failed connection as a RuntimeError
        raise WorkerStartError(
            f"cannot reach Temporal at {settings.address} (namespace {settings.namespace}): {exc}. "
            f"Start it (`corral up`), or point {ENV_TEMPORAL_ADDRESS} at it."
        ) from exc


def run_worker(
    program: str,
    read_settings: Callable[[], Settings],
    serve: Callable[[Settings], Coroutine[Any, Any, None]],
) -> None:
    """Read the settings (bad ones: exit code 2), then serve until stopped (a start failure: exit code 1). Logs,
    traces and metrics are set up first, named after `program` (corral/telemetry.py)."""
    telemetry.setup(program)
    try:
        settings = read_settings()
    except SettingsError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
    try:
        asyncio.run(serve(settings))
    except WorkerStartError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        # Skip interpreter teardown: after a failed connection the Temporal SDK's native threads can abort it
        # (SIGABRT, "PyGILState_Release ... finalizing", temporalio/sdk-python#300), and the exit code would lie.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_START_FAILED)


def setup_logging() -> None:
    """The log format `CORRAL_LOG_FORMAT` names (for a process that sets up no traces or metrics)."""
    telemetry.setup_logging()
