# Over 400 lines because the event union must be declared beside every member it holds.
"""Session events: the typed, append-only log of a session, in the Managed Agents vocabulary.

Every event carries a stable id, its position in the session (1, 2, 3, ... with no gaps), its type and the
workflow time at which it was written. User events also carry `processed_at`, null while they wait behind
earlier work. These models are persisted in workflow history: add optional fields, never repurpose one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field


class TextBlock(BaseModel):
    """A block of text, in a message or a tool result."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"] = "text"
    text: str


class ImageBlock(BaseModel):
    """An image given by the user, passed to the model as is (`source` follows the Messages API)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image"] = "image"
    source: dict[str, Any]


class DocumentBlock(BaseModel):
    """A document given by the user, passed to the model as is (`source` follows the Messages API)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["document"] = "document"
    source: dict[str, Any]
    title: str | None = None


ContentBlock = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    id: str
    position: int
    created_at: datetime
    processed_at: datetime | None = None


# ---- user events (client -> session) -------------------------------------------------------------------


class UserMessage(_Event):
    """A message from the user; `client_id` is the optional id the client sent for de-duplication."""

    type: Literal["user.message"] = "user.message"
    content: list[ContentBlock]
    client_id: str | None = None


class SystemMessage(_Event):
    """Privileged context the user sent with the event before it (a message or a tool result): the model sees it
    appended to the system prompt from that turn on, never as a message (activities/context.py)."""

    type: Literal["system.message"] = "system.message"
    content: list[TextBlock]
    client_id: str | None = None


class UserInterrupt(_Event):
    """Stop the current work; the session goes idle (a message in the same batch redirects it)."""

    type: Literal["user.interrupt"] = "user.interrupt"
    client_id: str | None = None
    session_thread_id: str | None = None
    """The thread it was routed to (None: the primary thread, or every thread for an interrupt)."""


class UserToolConfirmation(_Event):
    """Allow or deny a tool call that waits for confirmation."""

    type: Literal["user.tool_confirmation"] = "user.tool_confirmation"
    tool_use_id: str
    result: Literal["allow", "deny"]
    deny_message: str | None = None
    client_id: str | None = None
    session_thread_id: str | None = None
    """The thread it was routed to (None: the primary thread, or every thread for an interrupt)."""


class UserCustomToolResult(_Event):
    """The client's answer to an `agent.custom_tool_use`."""

    type: Literal["user.custom_tool_result"] = "user.custom_tool_result"
    custom_tool_use_id: str
    content: list[ContentBlock] = Field(default_factory=list)
    is_error: bool = False
    client_id: str | None = None
    session_thread_id: str | None = None
    """The thread it was routed to (None: the primary thread, or every thread for an interrupt)."""


class UserToolResult(_Event):
    """A self-hosted worker's result of a built-in tool call (corral.contract.work): it answers the call, as an
    `agent.tool_result` does for a call corral's own sandbox ran."""

    type: Literal["user.tool_result"] = "user.tool_result"
    tool_use_id: str
    content: list[ContentBlock] = Field(default_factory=list)
    is_error: bool = False
    client_id: str | None = None


# ---- agent events ----------------------------------------------------------------------------------------


class AgentMessage(_Event):
    """Text the agent produced in one model response."""

    type: Literal["agent.message"] = "agent.message"
    content: list[TextBlock]


class AgentThinking(_Event):
    """A progress signal: the model spent this response thinking (content is not carried)."""

    type: Literal["agent.thinking"] = "agent.thinking"


EvaluatedPermission = Literal["allow", "ask", "deny"]
"""What a call's permission policy decided: run it, wait for a `user.tool_confirmation`, or never run it (a tool the
agent does not have is refused before any policy)."""


class PermissionEvaluation(BaseModel):
    """The policy that decided a call's permission (corral has no `auto` classifier, so only these two)."""

    type: Literal["always_allow", "always_ask"]


class AgentToolUse(_Event):
    """A call to a tool served by a hand; its `id` is the tool-use id the model sees."""

    type: Literal["agent.tool_use"] = "agent.tool_use"
    name: str
    input: dict[str, Any]
    evaluated_permission: EvaluatedPermission | None = None
    evaluation: PermissionEvaluation | None = None
    """None in events written before permissions were evaluated (and for a tool the agent does not have)."""
    session_thread_id: str | None = None
    """Set on the copy cross-posted to the primary thread's log by a subagent's thread (None: this thread's own)."""


class AgentToolResult(_Event):
    """The string a hand returned for an `agent.tool_use` (or the error that stood in for it)."""

    type: Literal["agent.tool_result"] = "agent.tool_result"
    tool_use_id: str
    content: list[TextBlock]
    is_error: bool = False


class AgentMcpToolUse(_Event):
    """A call to a tool of an MCP server, made through the proxy."""

    type: Literal["agent.mcp_tool_use"] = "agent.mcp_tool_use"
    mcp_server_name: str
    name: str
    input: dict[str, Any]
    evaluated_permission: EvaluatedPermission | None = None
    evaluation: PermissionEvaluation | None = None
    session_thread_id: str | None = None
    """Set on the copy cross-posted to the primary thread's log by a subagent's thread."""


class AgentMcpToolResult(_Event):
    """The result of an `agent.mcp_tool_use`."""

    type: Literal["agent.mcp_tool_result"] = "agent.mcp_tool_result"
    mcp_tool_use_id: str
    content: list[TextBlock]
    is_error: bool = False


class AgentCustomToolUse(_Event):
    """A call to a custom tool: the session waits for the client's `user.custom_tool_result`."""

    type: Literal["agent.custom_tool_use"] = "agent.custom_tool_use"
    name: str
    input: dict[str, Any]
    session_thread_id: str | None = None
    """Set on the copy cross-posted to the primary thread's log by a subagent's thread."""


class AgentThreadContextCompacted(_Event):
    """Older turns were summarised for the model's context: `summary` stands for positions `start_position` to
    `end_position`, whose events stay in the log untouched. Part of the conversation, so the model sees the summary
    in their place (corral.contract.context.view)."""

    type: Literal["agent.thread_context_compacted"] = "agent.thread_context_compacted"
    summary: str
    start_position: int
    end_position: int


# ---- session events --------------------------------------------------------------------------------------


class EndTurn(BaseModel):
    """The agent finished its turn."""

    type: Literal["end_turn"] = "end_turn"


class RequiresAction(BaseModel):
    """The agent waits for the listed user events (custom tool results, confirmations)."""

    type: Literal["requires_action"] = "requires_action"
    event_ids: list[str]


class RetriesExhausted(BaseModel):
    """The turn ended because an error could not be retried, or retries ran out."""

    type: Literal["retries_exhausted"] = "retries_exhausted"


class BudgetReached(BaseModel):
    """The session's model turns have cost its budget: it takes no more (corral.contract.session.SessionBudget)."""

    type: Literal["budget_reached"] = "budget_reached"


class Refusal(BaseModel):
    """The model refused the request (e.g. a safety classifier intervened); the idle's `stop_details` says more."""

    type: Literal["refusal"] = "refusal"


class RefusalStopDetails(BaseModel):
    """What the model said of its refusal: the policy category (None: no named one) and an explanation for people
    (its wording can change: do not parse it)."""

    type: Literal["refusal"] = "refusal"
    category: str | None = None
    explanation: str | None = None


StopReason = Annotated[
    EndTurn | RequiresAction | RetriesExhausted | BudgetReached | Refusal, Field(discriminator="type")
]


class SessionStatusRunning(_Event):
    """The agent started working."""

    type: Literal["session.status_running"] = "session.status_running"


class SessionStatusIdle(_Event):
    """The agent stopped working; `stop_reason` says why."""

    type: Literal["session.status_idle"] = "session.status_idle"
    stop_reason: StopReason
    stop_details: RefusalStopDetails | None = None


class SessionStatusRescheduled(_Event):
    """A transient error is being retried."""

    type: Literal["session.status_rescheduled"] = "session.status_rescheduled"


class SessionStatusTerminated(_Event):
    """The session ended and accepts no more events."""

    type: Literal["session.status_terminated"] = "session.status_terminated"


class SessionDeleted(_Event):
    """The session is being deleted: the last event of its log, which ends every stream that follows it."""

    type: Literal["session.deleted"] = "session.deleted"


ErrorType = Literal[
    "unknown_error",
    "model_overloaded_error",
    "model_rate_limited_error",
    "model_request_failed_error",
    "mcp_connection_failed_error",
    "mcp_authentication_failed_error",
    "billing_error",
]


class RetryStatus(BaseModel):
    """What the client should do next: wait (`retrying`), or act (`exhausted`, `terminal`)."""

    type: Literal["retrying", "exhausted", "terminal"]


class SessionErrorDetail(BaseModel):
    """A typed error, with what happens next."""

    type: ErrorType
    message: str
    retry_status: RetryStatus


class SessionError(_Event):
    """Something went wrong; the session itself goes on unless `retry_status` is `terminal`."""

    type: Literal["session.error"] = "session.error"
    error: SessionErrorDetail


class ModelUsage(BaseModel):
    """Token usage of one model request."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class SpanModelRequestStart(_Event):
    """A model request began."""

    type: Literal["span.model_request_start"] = "span.model_request_start"


def message_id_of(request_id: str) -> str:
    """The id of the `agent.message` a model request writes, made from its `span.model_request_start` id: a live
    preview of the message carries it before the message is written."""
    return f"{request_id}_message"


def thinking_id_of(request_id: str) -> str:
    """The id of the `agent.thinking` a model request writes (see `message_id_of`)."""
    return f"{request_id}_thinking"


class SpanModelRequestEnd(_Event):
    """A model request ended, with its usage."""

    type: Literal["span.model_request_end"] = "span.model_request_end"
    model_request_start_id: str
    model_usage: ModelUsage
    is_error: bool = False


# ---- thread events (multi-agent sessions) -------------------------------------------------------------------


class _ThreadEvent(_Event):
    """An event about one thread, on its parent's log."""

    session_thread_id: str
    agent_name: str


class SessionThreadCreated(_ThreadEvent):
    """A thread was spawned (on its parent's log)."""

    type: Literal["session.thread_created"] = "session.thread_created"
    workflow_run_id: str | None = None


class SessionThreadStatusRunning(_ThreadEvent):
    """A thread started working."""

    type: Literal["session.thread_status_running"] = "session.thread_status_running"


class SessionThreadStatusIdle(_ThreadEvent):
    """A thread stopped working; `stop_reason` says why."""

    type: Literal["session.thread_status_idle"] = "session.thread_status_idle"
    stop_reason: StopReason
    stop_details: RefusalStopDetails | None = None


class SessionThreadStatusRescheduled(_ThreadEvent):
    """A thread's transient error is being retried."""

    type: Literal["session.thread_status_rescheduled"] = "session.thread_status_rescheduled"


class SessionThreadStatusTerminated(_ThreadEvent):
    """A thread ended (archived, or its session ended) and takes no more messages."""

    type: Literal["session.thread_status_terminated"] = "session.thread_status_terminated"


class AgentThreadMessageSent(_Event):
    """A message this thread sent to another (`to_agent_name` is absent when the target is the primary thread)."""

    type: Literal["agent.thread_message_sent"] = "agent.thread_message_sent"
    to_session_thread_id: str
    to_agent_name: str | None = None
    content: list[ContentBlock]


class AgentThreadMessageReceived(_Event):
    """A message another thread sent this one: input, as a user message is (it starts a turn when idle)."""

    type: Literal["agent.thread_message_received"] = "agent.thread_message_received"
    from_session_thread_id: str
    from_agent_name: str | None = None
    content: list[ContentBlock]


# ---- outcomes and workflow runs -------------------------------------------------------------------------------


class TextRubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"] = "text"
    content: str


class UserDefineOutcome(_Event):
    """An outcome the agent works toward until a grader finds it met (`outcome_id` names it in its spans); input, as
    a user message is: the agent starts on it. A file rubric is stored resolved to its text."""

    type: Literal["user.define_outcome"] = "user.define_outcome"
    outcome_id: str
    description: str
    rubric: TextRubric
    max_iterations: int = 3
    client_id: str | None = None


class _OutcomeSpan(_Event):
    outcome_id: str
    iteration: int
    """0-based revision cycle."""


class SpanOutcomeEvaluationStart(_OutcomeSpan):
    type: Literal["span.outcome_evaluation_start"] = "span.outcome_evaluation_start"


class SpanOutcomeEvaluationOngoing(_OutcomeSpan):
    """A heartbeat while the grader works."""

    type: Literal["span.outcome_evaluation_ongoing"] = "span.outcome_evaluation_ongoing"


OutcomeVerdict = Literal["satisfied", "needs_revision", "max_iterations_reached", "failed", "interrupted"]


class SpanOutcomeEvaluationEnd(_OutcomeSpan):
    """The grader's verdict on one cycle; `needs_revision` (the agent revises, with `explanation`) and
    `max_iterations_reached` (one acknowledgment turn) are also input to the agent."""

    type: Literal["span.outcome_evaluation_end"] = "span.outcome_evaluation_end"
    outcome_evaluation_start_id: str
    result: OutcomeVerdict
    explanation: str
    usage: ModelUsage


class _RunEvent(_Event):
    workflow_run_id: str


class WorkflowRunPhase(BaseModel):
    id: str
    name: str
    description: str | None = None


class WorkflowRunCreated(_RunEvent):
    type: Literal["workflow_run.created"] = "workflow_run.created"
    name: str
    description: str | None = None
    phases: list[WorkflowRunPhase]


class WorkflowRunStatusRunning(_RunEvent):
    type: Literal["workflow_run.status_running"] = "workflow_run.status_running"


class WorkflowRunStatusIdle(_RunEvent):
    type: Literal["workflow_run.status_idle"] = "workflow_run.status_idle"


class WorkflowRunPhaseStarted(_RunEvent):
    type: Literal["workflow_run.phase_started"] = "workflow_run.phase_started"
    workflow_run_phase_id: str


class WorkflowRunPhaseEnded(_RunEvent):
    type: Literal["workflow_run.phase_ended"] = "workflow_run.phase_ended"
    workflow_run_phase_id: str
    phase_started_id: str


RunErrorType = Literal[
    "timeout_error", "program_error", "thread_limit_error", "max_workflow_runs_error", "unknown_error"
]


class WorkflowRunErrorObject(BaseModel):
    type: RunErrorType
    message: str


class WorkflowRunError(_Event):
    """A run met an error, or an error kept one from being created (`workflow_run_id` null)."""

    type: Literal["workflow_run.error"] = "workflow_run.error"
    workflow_run_id: str | None = None
    error: WorkflowRunErrorObject


class WorkflowRunResult(BaseModel):
    type: Literal["completed", "stopped", "error"]
    error: WorkflowRunErrorObject | None = None


class WorkflowRunStatusEnded(_RunEvent):
    """A run ended, last of its events. It is input to the coordinator, which reads `report` (corral's: what the
    run's last phase produced, or why it stopped); the API shows `result` only."""

    type: Literal["workflow_run.status_ended"] = "workflow_run.status_ended"
    result: WorkflowRunResult
    report: str | None = None


SessionEvent = Annotated[
    UserMessage
    | SystemMessage
    | UserInterrupt
    | UserToolConfirmation
    | UserCustomToolResult
    | UserToolResult
    | AgentMessage
    | AgentThinking
    | AgentToolUse
    | AgentToolResult
    | AgentMcpToolUse
    | AgentMcpToolResult
    | AgentCustomToolUse
    | AgentThreadContextCompacted
    | SessionStatusRunning
    | SessionStatusIdle
    | SessionStatusRescheduled
    | SessionStatusTerminated
    | SessionDeleted
    | SessionError
    | SpanModelRequestStart
    | SpanModelRequestEnd
    | SessionThreadCreated
    | SessionThreadStatusRunning
    | SessionThreadStatusIdle
    | SessionThreadStatusRescheduled
    | SessionThreadStatusTerminated
    | AgentThreadMessageSent
    | AgentThreadMessageReceived
    | UserDefineOutcome
    | SpanOutcomeEvaluationStart
    | SpanOutcomeEvaluationOngoing
    | SpanOutcomeEvaluationEnd
    | WorkflowRunCreated
    | WorkflowRunStatusRunning
    | WorkflowRunStatusIdle
    | WorkflowRunPhaseStarted
    | WorkflowRunPhaseEnded
    | WorkflowRunError
    | WorkflowRunStatusEnded,
    Field(discriminator="type"),
]

EVENT_TYPES: frozenset[str] = frozenset(
    member.model_fields["type"].default for member in get_args(get_args(SessionEvent)[0])
)
