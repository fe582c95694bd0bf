"""The session's MCP servers as the workflow sees them: a proxy reference and the discovered tool list, both data.

Discovery runs once, before the first model turn, through proxy activities; its result is recorded in history,
so replay never calls a server. Calls go through the proxy too. No credential ever passes through here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError, TimeoutType

from workflows.policies import INFRASTRUCTURE_RETRY, MCP_CALL_TIMEOUT, PROXY_SCHEDULE_TO_START

with workflow.unsafe.imports_passed_through():
    from corral.contract.carry import McpCarry
    from corral.contract.events import AgentMcpToolUse, ErrorType
    from corral.contract.proxy import (
        MCP_AUTHENTICATION_FAILED,
        PROXY_REJECTED,
        BindSessionInput,
        BindSessionResult,
        GitRepositoryResource,
        McpCallToolInput,
        McpCallToolResult,
        McpListToolsInput,
        McpToolSpec,
        ReleaseSessionInput,
        mcp_tool_name,
    )
    from corral.contract.sandbox import RepositoryClone
    from corral.contract.session import AgentConfig
    from corral.names import (
        ACTIVITY_MCP_CALL_TOOL,
        ACTIVITY_MCP_LIST_TOOLS,
        ACTIVITY_PROXY_BIND_SESSION,
        ACTIVITY_PROXY_RELEASE_SESSION,
        PROXY_TASK_QUEUE,
    )
    from workflows._outcomes import failure_message

DISCOVERY_ATTEMPTS = 3
HEARTBEAT_TIMEOUT = "TemporalTimeout:Heartbeat"
"""How the Temporal server names a heartbeat timeout among a retry policy's non-retryable error types: the prefix
and the type's short name (the long enum name, `TIMEOUT_TYPE_HEARTBEAT`, is silently ignored)."""
MCP_CALL_RETRY = dataclasses.replace(
    INFRASTRUCTURE_RETRY,
    non_retryable_error_types=[*(INFRASTRUCTURE_RETRY.non_retryable_error_types or []), HEARTBEAT_TIMEOUT],
)
"""As for every proxy call, except that a call whose worker stopped heartbeating (it died, or hung) is not made
again: the MCP server may already have acted on it (docs/invariants.md, invariant 5)."""
OUTCOME_UNKNOWN = (
    "the proxy worker making this call stopped while the call was in flight, so its outcome is unknown; "
    "it was not made again (check whether it took effect before calling it again)"
)

BIND_AGAIN = "mcp-bind-again-after-a-passing-failure"
"""The patch that stopped a bind failing for a passing reason (Vault away) from ending MCP for the session."""

RetryState = Literal["retrying", "exhausted"]
ReportError = Callable[[ErrorType, str, RetryState], None]
"""(error type, message, retry status) -> appends a `session.error`."""


class SessionMcp:
    """Discovered MCP tools by the name the model sees (`mcp__<server>__<tool>`), and the proxy reference."""

    def __init__(self, session_id: str, agent: AgentConfig, vault_ids: list[str], needs_binding: bool = False) -> None:
        self._session_id = session_id
        self._vault_ids = vault_ids
        self._toolsets = agent.mcp_toolsets()
        self._servers = {server.name: server for server, _ in self._toolsets}
        self.reference: str | None = None
        self.tools: dict[str, McpToolSpec] = {}
        self.ready = not self._toolsets and not needs_binding

    def carried(self) -> McpCarry:
        return McpCarry(ready=self.ready, reference=self.reference, tools=self.tools)

    def resume(self, carry: McpCarry) -> None:
        self.ready, self.reference, self.tools = carry.ready, carry.reference, dict(carry.tools)

    async def prepare(self, report: ReportError) -> None:
        """Bind the session at the proxy and list each server's tools; a server that fails is reported and
        left out, the session goes on with the others."""
        if self.ready:
            return
        try:
            self.ready = await self._bind_and_discover(report)
        except (asyncio.CancelledError, ActivityError):  # an interrupt: bind and discover again on the next turn
            self.tools = {}
            raise

    async def _bind_and_discover(self, report: ReportError) -> bool:
        """Whether it is done: False when the bind met something that passes (Vault or the proxy away), so that
        the next turn binds again. Raises only when cancelled (an interrupt), with an ActivityError or
        CancelledError."""
        try:
            bound: BindSessionResult = await self._proxy(
                ACTIVITY_PROXY_BIND_SESSION,
                BindSessionInput(session_id=self._session_id, vault_ids=self._vault_ids),
                BindSessionResult,
                "bind session to its vaults",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            _, passes = _classify(err)
            if passes and workflow.patched(BIND_AGAIN):
                report(
                    "mcp_connection_failed_error",
                    f"the proxy could not serve the session: {_message(err)}; its MCP tools are not available in "
                    "this turn, and the next turn tries again",
                    "exhausted",
                )
                return False
            report("mcp_authentication_failed_error", f"the proxy refused the session: {_message(err)}", "exhausted")
            return True
        self.reference = bound.reference
        for server, toolset in self._toolsets:
            specs = await self._discover(server.name, report)
            for spec in specs:
                if toolset.enabled(spec.name):
                    self.tools[spec.model_name] = spec
        return True

    async def _discover(self, server_name: str, report: ReportError) -> list[McpToolSpec]:
        assert self.reference is not None
        server = self._servers[server_name]
        for attempt in range(1, DISCOVERY_ATTEMPTS + 1):
            try:
                specs: list[McpToolSpec] = await self._proxy(
                    ACTIVITY_MCP_LIST_TOOLS,
                    McpListToolsInput(session_id=self._session_id, reference=self.reference, server=server),
                    list[McpToolSpec],
                    f"list tools of MCP server {server.name}",
                )
                return specs
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    raise
                error_type, retryable = _classify(err)
                last = attempt == DISCOVERY_ATTEMPTS or not retryable
                message = f"MCP server {server.name} ({server.url}): {_message(err)}"
                if last:
                    report(error_type, f"{message}; its tools are not available in this session", "exhausted")
                    return []
                report(error_type, message, "retrying")
                await workflow.sleep(timedelta(seconds=2 ** (attempt - 1)), summary="retry MCP discovery")
        return []

    def clones(self, resources: list[GitRepositoryResource]) -> list[RepositoryClone]:
        """The session's repositories as the sandbox clones them: through the proxy, by this session's reference."""
        if self.reference is None:
            return []
        return [
            RepositoryClone(
                repository_id=resource.repository_id,
                reference=self.reference,
                mount_path=resource.mount(),
                checkout=resource.checkout.ref() if resource.checkout else None,
            )
            for resource in resources
        ]

    def spec(self, model_name: str) -> McpToolSpec | None:
        return self.tools.get(model_name)

    async def call(self, use: AgentMcpToolUse, report: ReportError) -> tuple[str, bool]:
        """One tool call through the proxy; failures become an error result and a typed `session.error`."""
        server = self._servers.get(use.mcp_server_name)
        if server is None or self.reference is None:
            return f"MCP server {use.mcp_server_name!r} is not available in this session.", True
        try:
            result: McpCallToolResult = await self._proxy(
                ACTIVITY_MCP_CALL_TOOL,
                McpCallToolInput(
                    session_id=self._session_id,
                    reference=self.reference,
                    server=server,
                    tool=use.name,
                    arguments=use.input,
                    tool_use_id=use.id,
                ),
                McpCallToolResult,
                f"tool {mcp_tool_name(server.name, use.name)}",
                timeout=MCP_CALL_TIMEOUT,
                retry=MCP_CALL_RETRY,
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            error_type, _ = _classify(err)
            lost = isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.HEARTBEAT
            message = f"MCP server {server.name}: {OUTCOME_UNKNOWN if lost else _message(err)}"
            report(error_type, message, "exhausted")
            return f"Tool error: {message}", True
        return result.text, result.is_error

    async def release(self) -> None:
        if self.reference is None:
            return
        try:
            await self._proxy(
                ACTIVITY_PROXY_RELEASE_SESSION,
                ReleaseSessionInput(session_id=self._session_id),
                None,
                "revoke the session's proxy reference",
            )
        except ActivityError:
            workflow.logger.warning("could not revoke the proxy reference of %s", self._session_id)

    async def _proxy(
        self,
        activity: str,
        arg: object,
        result_type: Any,
        summary: str,
        timeout: timedelta = timedelta(minutes=1),
        retry: RetryPolicy = INFRASTRUCTURE_RETRY,
    ) -> Any:
        return await workflow.execute_activity(
            activity,
            arg,
            task_queue=PROXY_TASK_QUEUE,
            result_type=result_type,
            start_to_close_timeout=timeout,
            schedule_to_start_timeout=PROXY_SCHEDULE_TO_START,
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=retry,
            summary=summary,
        )


def _classify(err: ActivityError) -> tuple[ErrorType, bool]:
    """A rejected credential or session is final; anything else (a server down, a timeout) may pass."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (MCP_AUTHENTICATION_FAILED, PROXY_REJECTED):
        return "mcp_authentication_failed_error", False
    return "mcp_connection_failed_error", True


def _message(err: ActivityError) -> str:
    return failure_message(err, timed_out="the proxy did not answer in time (is a corral-proxy worker running?)")
