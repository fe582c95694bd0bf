"""Turn a session's conversation entries into Messages API `messages` (pure: no I/O).

Tool-use ids sent to the model are the ids of the `agent.*_tool_use` events, so a tool result in the log and
the tool use it answers always match, whatever ids the model produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolResult,
    AgentMcpToolUse,
    AgentMessage,
    AgentThreadContextCompacted,
    AgentThreadMessageReceived,
    AgentToolResult,
    AgentToolUse,
    ContentBlock,
    SessionEvent,
    SpanOutcomeEvaluationEnd,
    SystemMessage,
    TextBlock,
    UserCustomToolResult,
    UserDefineOutcome,
    UserMessage,
    UserToolResult,
    WorkflowRunStatusEnded,
)
from corral.contract.outcomes import outcome_text
from corral.contract.proxy import McpToolSpec, mcp_tool_name
from corral.contract.session import AgentConfig

MessageParam = dict[str, Any]


def _block(block: ContentBlock) -> dict[str, Any]:
    return block.model_dump(exclude_none=True)


def _blocks(content: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    """The blocks the API takes: it refuses a text block that is empty or only whitespace (a 400 no retry fixes),
    which a user's message beside an image, a tool's output or a model's reply may hold."""
    return [_block(b) for b in content if not (isinstance(b, TextBlock) and not b.text.strip())]


def _tool_result(tool_use_id: str, content: Sequence[ContentBlock], is_error: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id}
    result["content"] = _blocks(content) or [{"type": "text", "text": "(empty)"}]
    if is_error:
        result["is_error"] = True
    return result


def _entry_blocks(entry: SessionEvent) -> tuple[str, list[dict[str, Any]]] | None:
    """The role and blocks an entry contributes, or None for entries the model does not see."""
    match entry:
        case UserMessage():
            blocks = _blocks(entry.content)
            return ("user", blocks) if blocks else None
        case AgentThreadMessageReceived():
            sender = entry.from_agent_name or "the coordinator"
            header = {"type": "text", "text": f"Message from thread {entry.from_session_thread_id} ({sender}):"}
            return "user", [header, *_blocks(entry.content)]
        case WorkflowRunStatusEnded():
            result = entry.result.type + (f": {entry.result.error.message}" if entry.result.error else "")
            note = f"Workflow run {entry.workflow_run_id} ended ({result}). Its report:\n{entry.report or '(none)'}"
            return "user", [{"type": "text", "text": note}]
        case UserCustomToolResult():
            return "user", [_tool_result(entry.custom_tool_use_id, entry.content, entry.is_error)]
        case AgentToolResult() | UserToolResult():
            return "user", [_tool_result(entry.tool_use_id, entry.content, entry.is_error)]
        case AgentMcpToolResult():
            return "user", [_tool_result(entry.mcp_tool_use_id, entry.content, entry.is_error)]
        case UserDefineOutcome() | SpanOutcomeEvaluationEnd():
            return "user", [{"type": "text", "text": outcome_text(entry) or ""}]
        case AgentThreadContextCompacted():
            note = (
                f"[A summary of the conversation from its start to log position {entry.end_position}, written when "
                f"it outgrew the context; the whole of it is still in the session log.]\n{entry.summary}"
            )
            return "user", [{"type": "text", "text": note}]
        case AgentMessage():
            blocks = _blocks(entry.content)
            return ("assistant", blocks) if blocks else None
        case AgentToolUse() | AgentCustomToolUse():
            return "assistant", [{"type": "tool_use", "id": entry.id, "name": entry.name, "input": entry.input}]
        case AgentMcpToolUse():
            name = mcp_tool_name(entry.mcp_server_name, entry.name)
            return "assistant", [{"type": "tool_use", "id": entry.id, "name": name, "input": entry.input}]
    return None


def build_messages(entries: list[SessionEvent]) -> list[MessageParam]:
    """Merge consecutive entries of the same role; in a user message, tool results come first (API rule)."""
    messages: list[MessageParam] = []
    for entry in entries:
        contributed = _entry_blocks(entry)
        if contributed is None:
            continue
        role, blocks = contributed
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    return messages


def build_system(agent_system: str | None, entries: list[SessionEvent]) -> str | list[dict[str, Any]] | None:
    """The request's top-level `system`: the agent's prompt, then each `system.message` of the conversation, in
    order, as a text block of its own (the session's system context grows; it is never a message, and never
    replaces the prompt). Just the prompt, as before, when the conversation has none."""
    added = [block for entry in entries if isinstance(entry, SystemMessage) for block in _blocks(entry.content)]
    if not added:
        return agent_system
    prompt = [{"type": "text", "text": agent_system}] if agent_system else []
    return [*prompt, *added]


def build_tools(agent: AgentConfig, mcp_tools: list[McpToolSpec] | None = None) -> list[dict[str, Any]]:
    """Tool definitions for the Messages API: the agent's own, then the MCP tools discovered for the session."""
    tools = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in agent.resolved_tools()
    ]
    tools += [
        {"name": spec.model_name, "description": spec.description, "input_schema": spec.input_schema}
        for spec in mcp_tools or []
    ]
    return tools


CACHE_CONTROL = {"type": "ephemeral"}


def with_cache_breakpoints(request: dict[str, Any]) -> dict[str, Any]:
    """Mark the stable prefix for prompt caching: the end of the tools, the end of the system prompt, and the end
    of the conversation so far (the next turn's request begins with all of it, and reads it from the cache)."""
    if request.get("tools"):
        request["tools"][-1] = {**request["tools"][-1], "cache_control": CACHE_CONTROL}
    if isinstance(request.get("system"), str):
        request["system"] = [{"type": "text", "text": request["system"], "cache_control": CACHE_CONTROL}]
    elif request.get("system"):
        request["system"][-1] = {**request["system"][-1], "cache_control": CACHE_CONTROL}
    messages = request.get("messages") or []
    if messages and messages[-1]["content"]:
        content = messages[-1]["content"]
        content[-1] = {**content[-1], "cache_control": CACHE_CONTROL}
    return request
