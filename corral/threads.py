"""A session's threads, for every reader of them (the gateway, the CLI): the session's `threads` query, which thread
ids are that session's, the handle that reads a thread's log, and the thread updates.

A thread id is never trusted alone: a thread is read only once its session's `threads` query lists it, so a thread
of another session (or workspace) is reached through nothing but its own session. A child thread's log is its own
workflow's (the workflow id is the thread id) and reads as a session's does (corral.reading); the primary thread's
log is the session's.
"""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle

from corral.client import until_taken
from corral.contract.threads import ArchiveThreadInput, SpawnThreadInput, ThreadInfo, primary_thread_id
from corral.names import QUERY_THREADS, THREAD_ID_PREFIX, UPDATE_ARCHIVE_THREAD, UPDATE_SPAWN_THREAD
from corral.reading import query_session

MAX_THREAD_ID_LENGTH = 128
"""Longer than any thread id corral makes: a longer value is no thread."""


def is_thread_id(value: str) -> bool:
    """Whether `value` has a thread id's form (`sthr_…`, printable ASCII); whether it is a thread is the session's
    to say."""
    return (
        value.startswith(THREAD_ID_PREFIX)
        and len(value) <= MAX_THREAD_ID_LENGTH
        and value.isascii()
        and value.isprintable()
    )


async def session_threads(session: WorkflowHandle) -> list[ThreadInfo]:
    """The session's threads as it knows them, its primary thread first (its `threads` query)."""
    threads: list[ThreadInfo] = await query_session(session, QUERY_THREADS, list[ThreadInfo])
    return threads


async def session_thread(session: WorkflowHandle, thread_id: str) -> ThreadInfo | None:
    """The thread `thread_id` of the session, or None when the session has no such thread."""
    if not is_thread_id(thread_id):
        return None
    return next((thread for thread in await session_threads(session) if thread.id == thread_id), None)


def thread_log(client: Client, session: WorkflowHandle, thread_id: str) -> WorkflowHandle:
    """The handle whose `events` and `session` queries read the thread's log: the session's own for its primary
    thread, the thread's workflow for any other. Ask only for a thread `session_thread` found."""
    if thread_id == primary_thread_id(session.id):
        return session
    return client.get_workflow_handle(thread_id)


async def archive_thread(session: WorkflowHandle, thread_id: str) -> ThreadInfo:
    """The session's `archive_thread` update: the thread's work stops and it takes no more messages (archiving it
    again answers with its info). Refusals are the update's (`ThreadNotFound`, `ThreadArchived` for the primary
    thread, `NotMultiagent`): nothing is written."""
    change = ArchiveThreadInput(thread_id=thread_id)
    return await until_taken(
        session, lambda: session.execute_update(UPDATE_ARCHIVE_THREAD, change, result_type=ThreadInfo)
    )


async def spawn_thread(session: WorkflowHandle, spawn: SpawnThreadInput) -> ThreadInfo:
    """The session's `spawn_thread` update, as a Temporal client starts a thread: the thread's info once it is
    started (refused by the update, nothing written, when the session may not spawn it)."""
    return await until_taken(
        session, lambda: session.execute_update(UPDATE_SPAWN_THREAD, spawn, result_type=ThreadInfo)
    )
