"""How the proxy reads an MCP server's answers and failures (`proxy.mcp`): a failed connection as the proxy's error,
an answer that is not MCP as a JSON-RPC error, a tool listing as `ToolSpec`s, and a tool result as the text the model
gets.
"""

from __future__ import annotations

import json

import httpx2
import mcp_types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from proxy.errors import McpConnectionFailed
from proxy.models import McpServer, ToolSpec


def _connection_failure(
    server: McpServer, statuses: list[int], leaves: list[BaseException], started: bool
) -> McpConnectionFailed | None:
    where = f"MCP server {server.name} ({server.url})"
    server_errors = [status for status in statuses if status >= 500]
    if server_errors:
        return McpConnectionFailed(f"{where} answered HTTP {server_errors[0]}")
    for leaf in leaves:
        if isinstance(leaf, httpx2.TimeoutException | TimeoutError):
            return McpConnectionFailed(f"{where} timed out")
        if isinstance(leaf, httpx2.TransportError | OSError):
            return McpConnectionFailed(f"{where} could not be reached ({type(leaf).__name__})")
        if isinstance(leaf, MCPError) and leaf.code in (mcp_types.REQUEST_TIMEOUT, mcp_types.CONNECTION_CLOSED):
            return McpConnectionFailed(f"{where} did not answer in time or closed the connection ({leaf.code})")
    client_errors = [status for status in statuses if status >= 400]
    if not started and (client_errors or any(isinstance(leaf, MCPError) for leaf in leaves)):
        detail = f"HTTP {client_errors[0]}" if client_errors else "no MCP handshake"
        return McpConnectionFailed(f"{where} could not be connected to ({detail}): is the URL an MCP endpoint?")
    return None


def _malformed_answer(server: McpServer, error: ValidationError) -> MCPError:
    """A JSON-RPC error standing for an answer that does not validate; it names the first fields that are wrong,
    never their values (they are the server's words, of any size)."""
    wrong = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}" for problem in error.errors()[:3]
    )
    message = f"MCP server {server.name} answered with a result that is not valid MCP ({wrong})"
    return MCPError(mcp_types.INTERNAL_ERROR, message)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: anyio task groups wrap the SDK's errors in them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _tool_spec(tool: mcp_types.Tool) -> ToolSpec:
    return ToolSpec(name=tool.name, description=tool.description or "", input_schema=dict(tool.input_schema))


def _result_text(result: mcp_types.CallToolResult) -> str:
    """Text blocks joined by newlines; other blocks summarised in brackets (the model gets text only)."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        size = len(block.data) * 3 // 4
        return f"[{block.type} content: {block.mime_type}, about {size} bytes, not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {block.name} <{block.uri}>]"
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return resource.text
        return f"[embedded resource <{resource.uri}> ({resource.mime_type or 'binary'}), not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"
