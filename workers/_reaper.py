"""The reaper: every so often, clean up after sessions whose workflow closed without cleaning up after itself.

A session that is terminated runs no workflow code, so what it holds outside Temporal (sandbox containers and
volumes, Vault references and git tokens) would stay forever. Each role that holds such things runs this one loop
beside its workers, with two callables: which sessions it holds something for, and how to clean up after closed
ones. A failing round (Temporal, Docker or Vault passing through a hiccup) is logged and tried again next interval;
the loop ends only when cancelled, at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger("workers.reaper")

ListSessions = Callable[[], Awaitable[Iterable[str]]]
"""The ids of the sessions a role holds something for (closed or not)."""
CleanUp = Callable[[list[str]], Awaitable[None]]
"""Release what the role holds for these sessions, whose workflows are closed."""


async def closed_sessions(client: Client, session_ids: Iterable[str], *, missing_means_closed: bool) -> list[str]:
    """Those of `session_ids` whose workflow this Temporal server knows as closed.

    A workflow the server does not know is closed only if the caller says so: a sandbox exists only once its
    session ran, but a Vault reference may be stored before its session starts (or by another server)."""
    closed = []
    for session_id in session_ids:
        try:
            description = await client.get_workflow_handle(session_id).describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            if missing_means_closed:
                closed.append(session_id)
            continue
        if description.status != WorkflowExecutionStatus.RUNNING:
            closed.append(session_id)
    return closed


async def reap_once(
    client: Client, list_sessions: ListSessions, clean_up: CleanUp, *, missing_means_closed: bool = False
) -> list[str]:
    """One round: clean up after every listed session whose workflow is closed; returns their ids."""
    closed = await closed_sessions(client, await list_sessions(), missing_means_closed=missing_means_closed)
    if closed:
        await clean_up(closed)
    return closed


async def reap_forever(
    client: Client,
    interval_seconds: float,
    list_sessions: ListSessions,
    clean_up: CleanUp,
    *,
    job: str,
    missing_means_closed: bool = False,
) -> None:
    """A round now and then every `interval_seconds`, until cancelled; `job` names it in the log."""
    while True:
        try:
            await reap_once(client, list_sessions, clean_up, missing_means_closed=missing_means_closed)
        except Exception:  # outlive a passing Temporal, Docker or Vault hiccup: the next round tries again
            log.exception("%s failed; trying again in %g s", job, interval_seconds)
        await asyncio.sleep(interval_seconds)


@contextlib.asynccontextmanager
async def reaping(
    client: Client,
    interval_seconds: float,
    list_sessions: ListSessions,
    clean_up: CleanUp,
    *,
    job: str,
    missing_means_closed: bool = False,
) -> AsyncIterator[None]:
    """`reap_forever` in the background while the block runs (the role's workers); cancelled when it ends."""
    task = asyncio.create_task(
        reap_forever(
            client, interval_seconds, list_sessions, clean_up, job=job, missing_means_closed=missing_means_closed
        )
    )
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])  # its end, without swallowing a cancellation of this task
