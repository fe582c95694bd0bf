"""What a finished activity means for the session: its events, its error message, its usage (pure functions of
activity errors and results, and of the log they are appended to)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from corral.contract.activities import ModelTextOutput, ModelThinkingOutput, ModelToolUseOutput, ModelTurnResult
from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE, TOOL_ERROR, ModelErrorInfo
from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolUse,
    AgentMessage,
    AgentThinking,
    AgentToolUse,
    ModelUsage,
    TextBlock,
    message_id_of,
    thinking_id_of,
)
from corral.contract.proxy import McpToolSpec
from workflows._log import SessionLog


def model_error_info(err: ActivityError) -> ModelErrorInfo:
    """What a failed model activity means; lost workers and timeouts that outlived retries count as retryable."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (MODEL_RETRYABLE, MODEL_FATAL) and cause.details:
        detail: Any = cause.details[0]
        return detail if isinstance(detail, ModelErrorInfo) else ModelErrorInfo.model_validate(detail)
    retryable = isinstance(cause, TimeoutError) or not (isinstance(cause, ApplicationError) and cause.non_retryable)
    return ModelErrorInfo(error_type="model_request_failed_error", status=None, retryable=retryable)


def not_picked_up(err: ActivityError) -> bool:
    """No worker took the activity from its task queue in time: nobody serves that queue (any more)."""
    cause = err.cause
    return isinstance(cause, TimeoutError) and cause.type is not None and cause.type.name == "SCHEDULE_TO_START"


def failure_message(err: ActivityError, *, timed_out: str | None = None) -> str:
    """What a failed activity's cause says (an activity's own error message, which is written for people);
    `timed_out` replaces it for a timeout, whose own text says only which timeout fired."""
    cause = err.cause
    if timed_out is not None and isinstance(cause, TimeoutError):
        return timed_out
    return str(getattr(cause, "message", None) or cause or err)


def tool_failure(name: str, task_queue: str, err: ActivityError) -> str:
    """A failed hand call as the tool result the model sees."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == TOOL_ERROR:
        return cause.message
    if not_picked_up(err):
        return f"Tool {name!r} is unavailable: no hand is serving task queue {task_queue!r}."
    if isinstance(cause, TimeoutError):
        return f"Tool {name!r} timed out ({cause.type.name.lower() if cause.type else 'timeout'})."
    return f"Tool {name!r} failed: {failure_message(err)}"


def add_usage(total: ModelUsage, usage: ModelUsage) -> ModelUsage:
    return ModelUsage(
        input_tokens=total.input_tokens + usage.input_tokens,
        output_tokens=total.output_tokens + usage.output_tokens,
        cache_creation_input_tokens=total.cache_creation_input_tokens + usage.cache_creation_input_tokens,
        cache_read_input_tokens=total.cache_read_input_tokens + usage.cache_read_input_tokens,
    )


ToolUseEvent = AgentToolUse | AgentCustomToolUse | AgentMcpToolUse


def record_response(
    log: SessionLog,
    result: ModelTurnResult,
    mcp_spec: Callable[[str], McpToolSpec | None],
    is_custom: Callable[[str], bool],
    request_id: str | None = None,
) -> list[ToolUseEvent]:
    """Append a model response's events to the log and the conversation; return the tool calls to run (MCP tools
    by their `mcp__…` name, custom tools run by the client, the rest by hands). With `request_id` (the request's
    `span.model_request_start` id) the message and the thinking get the ids their live previews carried."""
    texts = [block.text for block in result.content if isinstance(block, ModelTextOutput) and block.text]
    if any(isinstance(block, ModelThinkingOutput) for block in result.content):
        log.append(AgentThinking, id=request_id and thinking_id_of(request_id))
    if texts:
        content = [TextBlock(text=text) for text in texts]
        log.add_to_conversation(log.append(AgentMessage, content=content, id=request_id and message_id_of(request_id)))
    uses: list[ToolUseEvent] = []
    for block in result.content:
        if not isinstance(block, ModelToolUseOutput):
            continue
        use: ToolUseEvent
        mcp = mcp_spec(block.name)
        if mcp is not None:
            use = log.append(AgentMcpToolUse, mcp_server_name=mcp.server, name=mcp.name, input=block.input)
        elif is_custom(block.name):
            use = log.append(AgentCustomToolUse, name=block.name, input=block.input)
        else:
            use = log.append(AgentToolUse, name=block.name, input=block.input)
        log.add_to_conversation(use)
        uses.append(use)
    return uses
