"""A fork's start: its log begins as a copy of its source's, up to a position, then goes its own way.

The copy is read page by page through the `read_log` activity, so each copied event enters this session's
history once, as an activity result. The conversation is rebuilt from the copied events the way the source built
it; a message the source had not answered yet is queued again, and a tool call cut off by the fork point gets an
error result, so the conversation stays valid. The source is only read, never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.policies import INFRASTRUCTURE_RETRY

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ReadLogInput
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolResult,
        AgentMcpToolUse,
        AgentMessage,
        AgentThreadContextCompacted,
        AgentThreadMessageReceived,
        AgentToolResult,
        AgentToolUse,
        ErrorType,
        SystemMessage,
        UserCustomToolResult,
        UserMessage,
        UserToolResult,
    )
    from corral.contract.sandbox import ForkWorkspaceInput
    from corral.contract.session import EventPage, ForkSource, SessionInput
    from corral.names import ACTIVITY_FORK_WORKSPACE, ACTIVITY_READ_LOG, SANDBOX_TASK_QUEUE
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog


_IN_CONVERSATION = (
    UserMessage,
    SystemMessage,
    UserCustomToolResult,
    UserToolResult,
    AgentMessage,
    AgentToolUse,
    AgentToolResult,
    AgentMcpToolUse,
    AgentMcpToolResult,
    AgentCustomToolUse,
    AgentThreadContextCompacted,
    AgentThreadMessageReceived,
)
"""What the source's conversation held: its own events of these types (a multi-agent session's log also holds its
threads' calls and the answers routed to them, which carry `session_thread_id` and were never its own)."""


async def copy_log(log: SessionLog, inbox: UserInbox, source: ForkSource, task_queue: str) -> None:
    """Copy `source`'s log up to its position into `log`; raises ActivityError if it cannot be read."""
    after = 0
    while after < source.position:
        page: EventPage = await workflow.execute_activity(
            ACTIVITY_READ_LOG,
            ReadLogInput(session_id=source.session_id, after=after, before=source.position + 1),
            task_queue=task_queue,
            result_type=EventPage,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=INFRASTRUCTURE_RETRY,
            summary=f"copy the log of {source.session_id} after position {after}",
        )
        for event in page.events:
            log.adopt(event)
            if getattr(event, "session_thread_id", None) is not None:
                continue
            if isinstance(event, UserMessage | AgentThreadMessageReceived) and event.processed_at is None:
                inbox.pending.append(event)
            elif isinstance(event, SystemMessage) and event.processed_at is None:
                inbox.system_messages.append(event)
            elif isinstance(event, _IN_CONVERSATION):
                log.add_to_conversation(event)
        if not page.events:
            break
        after = page.events[-1].position
    for use in log.unanswered_tool_uses():
        log.answer(use, f"Not run here: this session was forked from {source.session_id} before the call ended.", True)


async def copy_workspace(source: ForkSource) -> str | None:
    """Copy the source's sandbox workspace for this fork; None when done, else why the fork starts with a fresh one."""
    copy = ForkWorkspaceInput(
        source_session_id=source.session_id, session_id=workflow.info().workflow_id, namespace=workflow.info().namespace
    )
    try:
        copied: bool = await workflow.execute_activity(
            ACTIVITY_FORK_WORKSPACE,
            copy,
            task_queue=SANDBOX_TASK_QUEUE,
            result_type=bool,
            start_to_close_timeout=timedelta(minutes=10),
            schedule_to_start_timeout=timedelta(seconds=30),
            retry_policy=INFRASTRUCTURE_RETRY,
            summary=f"copy the workspace of {source.session_id}",
        )
    except ActivityError as err:
        return f"the workspace of {source.session_id} could not be copied ({err.cause or err})"
    return None if copied else f"the workspace of {source.session_id} is gone (or on another engine)"


async def start_fork(
    log: SessionLog,
    inbox: UserInbox,
    input: SessionInput,
    sandboxed: bool,
    report: Callable[[ErrorType, str, Literal["retrying", "exhausted"]], None],
) -> None:
    """Copy the log (and, for an agent with the sandbox toolset, the workspace), then let held input in. What could
    not be copied is a `session.error`; the fork goes on."""
    assert input.fork is not None
    # The workspace first: once the copied log is visible, the fork is ready (`fork_session` waits for that). Its
    # report waits for the log, which takes the first positions.
    fresh = await copy_workspace(input.fork) if sandboxed else None
    try:
        await copy_log(log, inbox, input.fork, input.model_task_queue)
    except ActivityError as err:
        report("unknown_error", f"the log of {input.fork.session_id} could not be copied: {err.cause}", "exhausted")
    if fresh is not None:
        report("unknown_error", f"this fork starts with a fresh sandbox workspace: {fresh}", "exhausted")
    inbox.release()
