"""A fork's start: its log begins as a copy of its source's, up to a position, then goes its own way.

The copy is read page by page through the `read_log` activity, so each copied event enters this session's
history once, as an activity result. The conversation is rebuilt from the copied events the way the source built
it; a message the source had not answered yet is queued again, and a tool call cut off by the fork point gets an
error result, so the conversation stays valid. The source is only read, never changed.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ReadLogInput
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolResult,
        AgentMcpToolUse,
        AgentMessage,
        AgentThreadContextCompacted,
        AgentToolResult,
        AgentToolUse,
        UserCustomToolResult,
        UserMessage,
    )
    from corral.contract.session import EventPage, ForkSource
    from corral.names import ACTIVITY_READ_LOG
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._outcomes import INFRASTRUCTURE_RETRY

_IN_CONVERSATION = (
    UserMessage,
    UserCustomToolResult,
    AgentMessage,
    AgentToolUse,
    AgentToolResult,
    AgentMcpToolUse,
    AgentMcpToolResult,
    AgentCustomToolUse,
    AgentThreadContextCompacted,
)


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
            if isinstance(event, UserMessage) and event.processed_at is None:
                inbox.pending.append(event)
            elif isinstance(event, _IN_CONVERSATION):
                log.add_to_conversation(event)
        if not page.events:
            break
        after = page.events[-1].position
    for use in log.unanswered_tool_uses():
        log.answer(use, f"Not run here: this session was forked from {source.session_id} before the call ended.", True)
