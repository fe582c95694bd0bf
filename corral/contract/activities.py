"""Inputs and results of activities, and of the query the model activity uses to read the log.

A model turn does not carry the conversation: it carries a reference to the log (session id, run id, how many
conversation entries the request must contain) plus only the entries added since the previous turn. The model
worker keeps the rest cached, and reads what it lacks through the `model_context` query. This keeps history
growth per turn flat (docs/invariants.md, invariant 2).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from corral.contract.events import ModelUsage, RefusalStopDetails, SessionEvent
from corral.contract.proxy import McpToolSpec
from corral.contract.sandbox import SandboxHandle
from corral.contract.session import AgentConfig


class ModelTurnInput(BaseModel):
    """Input of the `model_turn` activity."""

    session_id: str
    run_id: str
    turn: int
    conversation_length: int
    delta_start: int
    delta: list[SessionEvent]
    agent: AgentConfig | None = None
    """Inlined on a session's first turn only, so that turn needs no extra round trip."""
    mcp_tools: list[McpToolSpec] = Field(default_factory=list)
    """The MCP tools discovered at session start; inlined with `agent`."""
    stream_id: str | None = None
    """Live deltas of this turn are published under this id: the turn's first `span.model_request_start` event.
    One id for every attempt, so the relay can keep a retried attempt from showing the user a second copy."""
    stream_attempt: int = 1
    """Which of the workflow's attempts this is (Temporal's own retries count within it)."""
    summarize_through: int | None = None
    """Not a turn but a compaction: the model summarises the conversation up to this log position (its answer is
    the summary; nothing is streamed)."""
    elide_before: int = 0
    """The context view's watermark: large tool results before this log position are sent as stubs (see
    corral.contract.context)."""
    max_block_chars: int | None = None
    """The view's largest whole content block: a larger one (a huge document) is sent as a note that says where it
    is kept (see corral.contract.context.fit_blocks)."""
    delta_by_reference: list[int] = Field(default_factory=list)
    """Indexes into `delta` of entries sent without their content: tool results already in history as the hand's
    own activity result. The model worker reads them through the `model_context` query, so each byte of tool
    output enters history once, and one turn's input stays small however many tools ran in parallel."""
    routed: bool = False
    """Sent to the worker-specific queue of the model worker that served the session's previous turn (see
    workflows/_hands.py `ModelRoute`). Its live deltas are published as an attempt before any on the shared queue,
    so a fallback after it was lost replaces what it streamed."""


class ReadLogInput(BaseModel):
    """Input of the `read_log` activity: a page of a session's events after `after` and before `before`."""

    session_id: str
    after: int = 0
    before: int | None = None


class ArchiveLogInput(BaseModel):
    """Input of the `archive_log` activity: write the run's events `after+1 .. through` to the archive."""

    session_id: str
    run_id: str
    after: int
    through: int


class ModelTextOutput(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ModelToolUseOutput(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    name: str
    input: dict[str, Any]


class ModelThinkingOutput(BaseModel):
    type: Literal["thinking"] = "thinking"


ModelOutputBlock = Annotated[ModelTextOutput | ModelToolUseOutput | ModelThinkingOutput, Field(discriminator="type")]


class ModelTurnResult(BaseModel):
    """What one model response produced; the workflow turns it into events."""

    content: list[ModelOutputBlock]
    usage: ModelUsage
    model: str
    request_id: str | None = None
    stop_reason: str | None = None
    """The API's: `max_tokens` means the reply was cut off, and its tool calls may be incomplete."""
    refusal: RefusalStopDetails | None = None
    """With stop_reason `refusal`: the response's `stop_details`."""
    worker_task_queue: str | None = None
    """The task queue of the model worker that served this turn alone (`<model queue>@<worker id>`): it holds the
    conversation in its cache, so the session sends its next turn there. None: a worker without one."""


class ModelContextQuery(BaseModel):
    """Input of the `model_context` query: conversation entries `[start, end)`, paged by size."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)


class ModelContext(BaseModel):
    """The agent config and a page of conversation entries; `next_start < end` means ask again."""

    agent: AgentConfig
    entries: list[SessionEvent]
    next_start: int
    mcp_tools: list[McpToolSpec] = Field(default_factory=list)


class ExecuteInput(BaseModel):
    """Input of the `execute` activity that every hand serves: `execute(name, input) -> string`."""

    session_id: str
    tool_use_id: str
    name: str
    input: dict[str, Any]
    sandbox: SandboxHandle | None = None
    """Set for the built-in tools: which container runs the call."""
    shell: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The bash shell state (working directory, exported variables) a `bash` call uses and leaves: each thread of a
    multi-agent session has its own (its thread id), so threads' commands run side by side without moving each
    other's `cd`; None is the session's own."""
