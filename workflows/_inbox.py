"""Accepting user input: validation, de-duplication by client id, and the queue of what waits for the harness.

The workflow's signal and update handlers hand every user event here. Nothing is written to the log before it is
valid (the update's validator calls `validate` first); an event with a client id seen before returns the id it
already has, so a resend is harmless. Messages queue until the next model call takes them, in arrival order.
Pure state: no Temporal calls but the workflow's clock, which the session passes in.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, cast

from temporalio.exceptions import ApplicationError

from corral.contract.carry import SessionCarry
from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolUse,
    AgentThreadMessageReceived,
    AgentToolUse,
    SystemMessage,
    UserCustomToolResult,
    UserDefineOutcome,
    UserInterrupt,
    UserMessage,
    UserToolConfirmation,
    UserToolResult,
    WorkflowRunStatusEnded,
)
from corral.contract.session import (
    SendEventsInput,
    SystemMessageParams,
    UserCustomToolResultParams,
    UserDefineOutcomeParams,
    UserEventParams,
    UserInterruptParams,
    UserMessageParams,
    UserToolConfirmationParams,
    UserToolResultParams,
    normalize_content,
    parse_user_events,
)
from workflows._log import SessionLog, check_answers


class Router(Protocol):
    """Where the client's events for a multi-agent session's other threads go (workflows/_threads.py)."""

    custom_routes: dict[str, str]
    confirm_routes: dict[str, str]

    def routed(self, params: UserCustomToolResultParams | UserToolConfirmationParams) -> str | None: ...

    def check_interrupt(self, params: UserInterruptParams) -> None: ...

    def interrupt(self, params: UserInterruptParams) -> str | None: ...


class Goals(Protocol):
    """Where a session's outcomes are pursued (workflows/_grading.py)."""

    def check(self, params: UserDefineOutcomeParams) -> None: ...

    def accept(self, params: UserDefineOutcomeParams, client_id: str | None) -> UserDefineOutcome: ...

    def interrupted(self) -> None: ...


class WorkerCalls(Protocol):
    """The calls a self-hosted worker runs for the session (workflows/_self_hosted.py)."""

    def waiting_for_result(self) -> set[str]: ...

    def answered(self, result: UserToolResult) -> None: ...


NOT_SELF_HOSTED = (
    "user.tool_result answers a built-in call that the session routed to a self-hosted environment's worker; this "
    "session's built-in tools run in corral's own sandbox (a custom tool's call takes user.custom_tool_result)"
)


class UserInbox:
    """The user's events on their way in: queued messages, interrupts in flight, answers to custom tool calls and
    confirmations of the calls whose permission policy asks for one."""

    def __init__(
        self,
        log: SessionLog,
        now: Callable[[], datetime],
        interrupt_turn: Callable[[], bool],
        changed: Callable[[], None],
    ) -> None:
        """`interrupt_turn` cancels the turn in progress and says whether there was one; `changed` is called when
        the queue changes (the session updates what the Web UI shows)."""
        self._log = log
        self._now = now
        self._interrupt_turn = interrupt_turn
        self._changed = changed
        self._client_ids: dict[str, str] = {}
        self.pending: list[UserMessage | AgentThreadMessageReceived | UserDefineOutcome | WorkflowRunStatusEnded] = []
        """Input waiting for the next model call: the user's messages and outcomes, other threads' messages, the
        ends of workflow runs."""
        self.interrupts: list[UserInterrupt] = []
        self.system_messages: list[SystemMessage] = []
        """`system.message` events waiting to join the conversation with the next model call (they join after
        the event each accompanies: a message, or a tool result that joins when its call is answered)."""
        self.awaiting_custom: dict[str, AgentCustomToolUse] = {}
        self.custom_results: dict[str, UserCustomToolResult] = {}
        self.awaiting_confirmation: dict[str, AgentToolUse | AgentMcpToolUse] = {}
        self.confirmations: dict[str, UserToolConfirmation] = {}
        self._held: list[UserEventParams] | None = None
        self.router: Router | None = None
        """Set by a session that has threads to route to; a thread routes nothing."""
        self.goals: Goals | None = None
        """Set by a session (a thread takes no outcomes)."""
        self.worker_calls: WorkerCalls | None = None
        """Set by a session in a self-hosted environment: the calls a `user.tool_result` may answer."""

    def carried(self, window: int) -> dict[str, Any]:
        """This inbox's part of a hand-over (SessionCarry fields): events by position, the newest client ids."""
        return {
            "pending": [message.position for message in self.pending],
            "interrupts": [interrupt.position for interrupt in self.interrupts],
            "system_messages": [message.position for message in self.system_messages],
            "awaiting_custom": list(self.awaiting_custom.values()),
            "custom_results": {use_id: result.position for use_id, result in self.custom_results.items()},
            "awaiting_confirmation": list(self.awaiting_confirmation.values()),
            "confirmations": {use_id: answer.position for use_id, answer in self.confirmations.items()},
            "client_ids": dict(list(self._client_ids.items())[-window:]),
        }

    def resume(self, carry: SessionCarry) -> None:
        """Take over the inbox of the run that handed over (its events are in the log's tail)."""
        self.pending = [
            cast(
                UserMessage | AgentThreadMessageReceived | UserDefineOutcome | WorkflowRunStatusEnded,
                self._log.at(position),
            )
            for position in carry.pending
        ]
        self.interrupts = [cast(UserInterrupt, self._log.at(position)) for position in carry.interrupts]
        self.system_messages = [cast(SystemMessage, self._log.at(position)) for position in carry.system_messages]
        self.awaiting_custom = {use.id: use for use in carry.awaiting_custom}
        self.custom_results = {
            use_id: cast(UserCustomToolResult, self._log.at(at)) for use_id, at in carry.custom_results.items()
        }
        self.awaiting_confirmation = {use.id: use for use in carry.awaiting_confirmation}
        self.confirmations = {
            use_id: cast(UserToolConfirmation, self._log.at(at)) for use_id, at in carry.confirmations.items()
        }
        self._client_ids = dict(carry.client_ids)

    def hold(self) -> None:
        """Keep what signals bring until `release` (while a fork copies its log: positions are not free yet)."""
        self._held = []

    def release(self) -> None:
        """Accept what was held, in arrival order."""
        held, self._held = self._held or [], None
        for params in held:
            self.accept(params)

    def validate(self, input: SendEventsInput) -> None:
        """Raise ValueError (the update is rejected, nothing is written) for a malformed batch or a stray answer."""
        if self._held is not None:
            raise ValueError("this session is still copying the log it was forked from: send again in a moment")
        events = parse_user_events(input)
        routes = self.router
        check_answers(
            events,
            waiting=set(self.awaiting_custom) - set(self.custom_results) | set(routes.custom_routes if routes else ()),
            confirming=set(self.awaiting_confirmation) - set(self.confirmations)
            | set(routes.confirm_routes if routes else ()),
        )
        self._check_tool_results([params for params in events if isinstance(params, UserToolResultParams)])
        outcomes = [params for params in events if isinstance(params, UserDefineOutcomeParams)]
        if outcomes:
            if self.goals is None:
                raise ValueError("user.define_outcome: a session thread takes no outcomes; send it to the session")
            if len(outcomes) > 1:
                raise ValueError("events: one user.define_outcome at a time (a session pursues one outcome at once)")
            self.goals.check(outcomes[0])
        if routes is not None and len(events) > 1 and isinstance(events[-1], SystemMessageParams):
            accompanied = events[-2]
            if isinstance(accompanied, UserCustomToolResultParams) and accompanied.custom_tool_use_id in (
                routes.custom_routes
            ):
                raise ValueError(
                    "system.message: it may not accompany a result routed to another thread (this session's "
                    "system context is its primary thread's); send it with a user.message"
                )
        for params in events:
            if isinstance(params, UserInterruptParams) and params.session_thread_id is not None:
                if routes is None:
                    raise ValueError("session_thread_id: this thread has no threads of its own to interrupt")
                routes.check_interrupt(params)

    def _check_tool_results(self, results: list[UserToolResultParams]) -> None:
        """Each `user.tool_result` answers one call that waits for a self-hosted worker's result, once."""
        if results and self.worker_calls is None:
            raise ValueError(NOT_SELF_HOSTED)
        waiting = self.worker_calls.waiting_for_result() if self.worker_calls is not None else set()
        seen: set[str] = set()
        for params in results:
            if params.tool_use_id not in waiting or params.tool_use_id in seen:
                raise ValueError(
                    f"user.tool_result: no call {params.tool_use_id!r} is waiting for a self-hosted worker's result "
                    f"(waiting: {', '.join(sorted(waiting)) or 'none'}); a call is answered once"
                )
            seen.add(params.tool_use_id)

    def accept_batch(self, input: SendEventsInput) -> list[str]:
        events = parse_user_events(input)
        last = events[-1]
        if isinstance(last, SystemMessageParams) and last.id is None and events[-2].id is not None:
            # A resent batch must not add its system message twice: it is known by the id of the one it follows.
            events[-1] = last.model_copy(update={"id": f"{events[-2].id}/system.message"})
        return [self.accept(params) for params in events]

    def accept(self, params: UserEventParams) -> str:
        """Append one validated user event (or return the id it already has) and act on it."""
        if self._held is not None:  # only signals get here while holding: the update's validator refuses
            self._held.append(params)
            return ""
        if params.id is not None and params.id in self._client_ids:
            return self._client_ids[params.id]
        event_id: str
        if isinstance(params, UserMessageParams):
            return self.accept_message(params)
        routed = self._route(params)
        if routed is not None:
            event_id = routed
        elif isinstance(params, UserInterruptParams):
            interrupt = self._log.append(UserInterrupt, processed=False, client_id=params.id)
            event_id = interrupt.id
            if self._interrupt_turn():
                self.interrupts.append(interrupt)
            else:
                interrupt.processed_at = self._now()
            if self.goals is not None:
                self.goals.interrupted()
        elif isinstance(params, UserCustomToolResultParams):
            result = self._log.append(
                UserCustomToolResult,
                processed=False,
                custom_tool_use_id=params.custom_tool_use_id,
                content=normalize_content(params.content) if params.content else [],
                is_error=params.is_error,
                client_id=params.id,
            )
            self.custom_results[params.custom_tool_use_id] = result
            event_id = result.id
        elif isinstance(params, UserToolResultParams) and self.worker_calls is not None:
            tool_result = self._log.append(
                UserToolResult,
                processed=False,
                tool_use_id=params.tool_use_id,
                content=normalize_content(params.content) if params.content else [],
                is_error=params.is_error,
                client_id=params.id,
            )
            self.worker_calls.answered(tool_result)
            event_id = tool_result.id
        elif isinstance(params, UserDefineOutcomeParams) and self.goals is not None:
            outcome = self.goals.accept(params, params.id)
            self.pending.append(outcome)
            self._changed()
            event_id = outcome.id
        elif isinstance(params, SystemMessageParams):
            system = self._log.append(SystemMessage, processed=False, content=params.content, client_id=params.id)
            self.system_messages.append(system)
            event_id = system.id
        elif isinstance(params, UserToolConfirmationParams):
            confirmation = self._log.append(
                UserToolConfirmation,
                processed=False,
                tool_use_id=params.tool_use_id,
                result=params.result,
                deny_message=params.deny_message,
                client_id=params.id,
            )
            self.confirmations[params.tool_use_id] = confirmation
            event_id = confirmation.id
        else:  # unreachable while UserEventParams has these four types; a new one must be handled above
            raise ApplicationError(f"{params.type}: not taken by this session", non_retryable=True)
        if params.id is not None:
            self._client_ids[params.id] = event_id
        return event_id

    def _route(self, params: UserEventParams) -> str | None:
        """The event id of a user event for another thread, which the router logged and routed."""
        if self.router is None:
            return None
        if isinstance(params, UserInterruptParams):
            return self.router.interrupt(params)
        if isinstance(params, UserCustomToolResultParams | UserToolConfirmationParams):
            return self.router.routed(params)
        return None

    def accept_message(self, params: UserMessageParams) -> str:
        if self._held is not None:
            self._held.append(params)
            return ""
        if params.id is not None and params.id in self._client_ids:
            return self._client_ids[params.id]
        message = self._log.append(
            UserMessage, processed=False, content=normalize_content(params.content), client_id=params.id
        )
        self.pending.append(message)
        if params.id is not None:
            self._client_ids[params.id] = message.id
        self._changed()
        return message.id

    def accept_thread_message(self, from_thread_id: str, from_agent_name: str | None, content: list[Any],
                              message_id: str) -> AgentThreadMessageReceived | None:  # fmt: skip
        """Queue another thread's message as input (it starts a turn when idle); None when this message, by its
        sender's event id, was taken already."""
        key = f"thread:{message_id}"
        if key in self._client_ids:
            return None
        received = self._log.append(
            AgentThreadMessageReceived,
            processed=False,
            from_session_thread_id=from_thread_id,
            from_agent_name=from_agent_name,
            content=content,
        )
        self._client_ids[key] = received.id
        self.pending.append(received)
        self._changed()
        return received

    def queue(self, event: WorkflowRunStatusEnded) -> None:
        """Queue a logged event (not yet processed) as input: it starts a turn when idle."""
        self.pending.append(event)
        self._changed()

    def take_pending(self) -> None:
        """Move queued user messages into the conversation, in arrival order, then the system messages that
        came with them or with tool results already in it."""
        for message in self.pending:
            message.processed_at = self._now()
            self._log.add_to_conversation(message)
        self.pending.clear()
        self._take_system_messages(self._log.last_position + 1)

    def _take_system_messages(self, before: int) -> None:
        """System messages written before log position `before` join the conversation (the model request shows
        them in its system prompt, activities/context.py)."""
        for system in [m for m in self.system_messages if m.position < before]:
            system.processed_at = self._now()
            self._log.add_to_conversation(system)
            self.system_messages.remove(system)

    def settle_interrupts(self) -> None:
        """After an interrupt ended the turn: messages queued before the latest interrupt join the conversation
        without starting a new turn; later ones stay queued and do. Open custom tool calls and calls waiting for
        confirmation are dropped (the interrupt answers them); answers already in count as processed."""
        for answer in [*self.custom_results.values(), *self.confirmations.values()]:
            answer.processed_at = self._now()
        self.awaiting_custom.clear()
        self.custom_results.clear()
        self.awaiting_confirmation.clear()
        self.confirmations.clear()
        latest = self.interrupts[-1].position
        for message in [m for m in self.pending if m.position < latest]:
            message.processed_at = self._now()
            self._log.add_to_conversation(message)
            self.pending.remove(message)
        self._take_system_messages(latest)
        for interrupt in self.interrupts:
            interrupt.processed_at = self._now()
        self.interrupts.clear()
