"""A turn's tool calls, for `SessionWorkflow`: what each call's permission policy decides, hand and MCP calls run
concurrently, and the wait for the client (its custom tool results, and its confirmations of the calls whose policy
asks), which costs nothing, lasts as long as it must, and carries over to the next run.

Workflow code: no I/O here, only activities (through the hands, the sandbox and the proxy) and workflow waits.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Protocol

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.carry import Phase
    from corral.contract.coordinator import CoordinatorTool
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolUse,
        AgentToolUse,
        PermissionEvaluation,
        RequiresAction,
        StopReason,
    )
    from corral.contract.sandbox import policy_type
    from corral.contract.session import AgentConfig, HandTool, ResolvedTool, SandboxTool
    from workflows._hands import execute_on_hand
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._mcp import ReportError, SessionMcp
    from workflows._outcomes import ToolUseEvent
    from workflows._self_hosted import SelfHostedHands

DENIED_RESULT = "Not run: the user denied this tool call."
NEW_MESSAGE_RESULT = "No result: the user sent a new message instead."

WAITING_LIST_PATCH = "still-waiting-calls"
"""From here a session that gets answers to some of the calls it waits on goes idle again, listing those left (as
the Managed Agents API does): a client that reads only the newest idle knows what is still asked of it."""


class Sandbox(Protocol):
    """A session's sandbox (workflows/_sandbox.py), or a thread's, borrowed from its session (workflows/_seat.py)."""

    async def execute(self, use: AgentToolUse) -> tuple[str, bool]: ...


Coordinate = Callable[[AgentToolUse], Awaitable[tuple[str, bool]]]
"""Runs a coordinator's own tool (workflows/_coordinator.py)."""


class ToolCalls:
    """Runs the tool calls of a session's turns. The session lends it its log, inbox, hands and what it does to
    its status: go idle (`go_idle`), run again (`resume_running`), and hand over to a new run (`hand_over_due`,
    `hand_over`), which a long wait for the client may need."""

    def __init__(
        self,
        agent: AgentConfig,
        tools: dict[str, ResolvedTool],
        log: SessionLog,
        inbox: UserInbox,
        sandbox: Sandbox,
        mcp: SessionMcp,
        report: ReportError,
        go_idle: Callable[[StopReason], None],
        resume_running: Callable[[], None],
        hand_over_due: Callable[[], bool],
        hand_over: Callable[[Phase], Awaitable[None]],
        coordinate: Coordinate | None = None,
    ) -> None:
        self._agent, self._tools, self._log, self._inbox = agent, tools, log, inbox
        self._coordinate = coordinate
        self._sandbox, self._mcp, self._report = sandbox, mcp, report
        self._go_idle, self._resume_running = go_idle, resume_running
        self._hand_over_due, self._hand_over = hand_over_due, hand_over

    def evaluate_permissions(self, uses: list[ToolUseEvent]) -> None:
        """Mark each hand and MCP call with what its permission policy decided (upstream's `evaluated_permission`
        and `evaluation`): `ask` calls wait for the client's confirmation; a tool the agent lacks is denied."""
        toolsets = {server.name: toolset for server, toolset in self._agent.mcp_toolsets()}
        for use in uses:
            if isinstance(use, AgentMcpToolUse):
                toolset = toolsets.get(use.mcp_server_name)
                policy = toolset.permission(use.name) if toolset is not None else None
            elif isinstance(use, AgentToolUse):
                tool = self._tools.get(use.name)
                policy = policy_type(tool.permission_policy) if isinstance(tool, HandTool | SandboxTool) else None
                if isinstance(tool, CoordinatorTool):
                    policy = "always_allow"  # the harness's own tools: nothing leaves the session
            else:
                continue  # a custom tool call is the client's to run: no policy applies
            use.evaluated_permission = "deny" if policy is None else "ask" if policy == "always_ask" else "allow"
            use.evaluation = None if policy is None else PermissionEvaluation(type=policy)

    async def run(self, uses: list[ToolUseEvent]) -> None:
        """Run hand and MCP calls concurrently, then wait for the client: its custom tool results, and its
        confirmations of the calls whose policy asks (those allowed run then)."""
        calls = [use for use in uses if isinstance(use, AgentToolUse | AgentMcpToolUse)]
        asked = [use for use in calls if use.evaluated_permission == "ask"]
        await self._run_calls([use for use in calls if use.evaluated_permission != "ask"])
        custom_uses = [use for use in uses if isinstance(use, AgentCustomToolUse)]
        if not custom_uses and not asked:
            return
        for custom_use in custom_uses:
            self._inbox.awaiting_custom[custom_use.id] = custom_use
        for call in asked:
            self._inbox.awaiting_confirmation[call.id] = call
        waiting = {use.id for use in [*custom_uses, *asked]}
        self._go_idle(RequiresAction(event_ids=[use.id for use in uses if use.id in waiting]))
        await self.await_answers(custom_uses, asked)

    async def await_answers(
        self, custom_uses: list[AgentCustomToolUse], asked: list[AgentToolUse | AgentMcpToolUse]
    ) -> None:
        """Wait for the client's results of `custom_uses` and confirmations of `asked` (or a new message), handing
        over to a new run if the wait outlasts this one; then put the results in the conversation, run the calls
        allowed, answer the others as denied, and go on with the turn."""

        def answered() -> bool:
            inbox = self._inbox
            results = all(use.id in inbox.custom_results for use in custom_uses)
            return (results and all(use.id in inbox.confirmations for use in asked)) or bool(inbox.pending)

        calls: list[ToolUseEvent] = sorted([*custom_uses, *asked], key=lambda use: use.position)

        def still_waiting() -> list[str]:
            inbox = self._inbox
            answers = {*inbox.custom_results, *inbox.confirmations}
            return [use.id for use in calls if use.id not in answers]

        def woken(was: list[str]) -> bool:
            return answered() or self._hand_over_due() or still_waiting() != was

        listed = still_waiting()
        while not answered():
            await workflow.wait_condition(functools.partial(woken, listed))
            if answered():
                break
            if still_waiting() != listed:
                listed = still_waiting()
                if workflow.patched(WAITING_LIST_PATCH):
                    self._go_idle(RequiresAction(event_ids=listed))
                continue
            await self._hand_over("awaiting_confirmation" if asked else "awaiting_custom")
        self._resume_running()
        for custom_use in custom_uses:
            self._inbox.awaiting_custom.pop(custom_use.id, None)
            answer = self._inbox.custom_results.pop(custom_use.id, None)
            if answer is None:
                # Do better than blocking forever: a new message answers the open calls with an error.
                self._log.answer(custom_use, NEW_MESSAGE_RESULT, True)
            else:
                answer.processed_at = workflow.now()
                self._log.add_to_conversation(answer)
        allowed: list[AgentToolUse | AgentMcpToolUse] = []
        for call in asked:
            self._inbox.awaiting_confirmation.pop(call.id, None)
            confirmation = self._inbox.confirmations.pop(call.id, None)
            if confirmation is None:
                self._log.answer(call, NEW_MESSAGE_RESULT, True)
                continue
            confirmation.processed_at = workflow.now()
            if confirmation.result == "allow":
                allowed.append(call)
            else:
                self._log.answer(call, confirmation.deny_message or DENIED_RESULT, True)
        await self._run_calls(allowed)

    async def _run_calls(self, calls: list[AgentToolUse | AgentMcpToolUse]) -> None:
        """Run calls concurrently, hand calls first (the order their activities have always been scheduled in),
        and write their results."""
        hand_uses = [use for use in calls if isinstance(use, AgentToolUse)]
        mcp_uses = [use for use in calls if isinstance(use, AgentMcpToolUse)]
        outputs = await asyncio.gather(
            *(self._execute(use) for use in hand_uses), *(self._mcp.call(use, self._report) for use in mcp_uses)
        )
        ordered: list[AgentToolUse | AgentMcpToolUse] = [*hand_uses, *mcp_uses]
        for call, output in zip(ordered, outputs, strict=True):
            if output is not None:  # None: a self-hosted worker's result, in the conversation already
                self._log.answer(call, *output)

    async def _execute(self, use: AgentToolUse) -> tuple[str, bool] | None:
        """`execute(name, input) -> string` on the hand that serves the tool; errors become error results."""
        tool = self._tools.get(use.name)
        if isinstance(tool, SandboxTool) and isinstance(self._sandbox, SelfHostedHands):
            return await self._sandbox.serve(use)
        if isinstance(tool, SandboxTool):
            return await self._sandbox.execute(use)
        if isinstance(tool, CoordinatorTool) and self._coordinate is not None:
            return await self._coordinate(use)
        if not isinstance(tool, HandTool):
            return f"Unknown tool {use.name!r}. Available tools: {', '.join(sorted(self._tools))}.", True
        return await execute_on_hand(tool, use)
