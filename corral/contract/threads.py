"""Session threads: what a multi-agent session's threads are, as the session's `threads` query shows them and its
`spawn_thread` and `archive_thread` updates take them.

A session's primary thread is the session itself; every other thread is a durable child workflow whose id is the
thread's id (`sthr_<hex>`) and whose history is the thread's log: its `events` query pages it as a session's does.
Persisted schemas: add optional fields, never repurpose one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.contract.agent import AgentConfig
from corral.contract.coordinator import InlineAgent
from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolUse,
    AgentToolUse,
    ContentBlock,
    ModelUsage,
    RefusalStopDetails,
    StopReason,
)
from corral.contract.user_events import (
    MessageContent,
    UserCustomToolResultParams,
    UserToolConfirmationParams,
    normalize_content,
)
from corral.names import SESSION_ID_PREFIX, THREAD_ID_PREFIX, SessionStatus

ThreadStatus = SessionStatus
"""A thread has a session's statuses."""
CrossPosted = Annotated[AgentToolUse | AgentMcpToolUse | AgentCustomToolUse, Field(discriminator="type")]
Answer = Annotated[UserCustomToolResultParams | UserToolConfirmationParams, Field(discriminator="type")]


def primary_thread_id(session_id: str) -> str:
    """The primary thread's id, made from its session's: `sesn_abc` -> `sthr_abc` (no state to keep)."""
    return THREAD_ID_PREFIX + session_id.removeprefix(SESSION_ID_PREFIX)


class SpawnedAgent(BaseModel):
    """What a thread runs: a saved agent at a version, the coordinator itself, an inline agent, or the advisor
    (the primary thread shows `primary`). `config` is the configuration the thread runs."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["agent", "self", "inline", "primary"]
    name: str
    id: str | None = None
    version: int | None = None
    config: AgentConfig


class ThreadStats(BaseModel):
    """Seconds a thread spent working (turns) and since it was made."""

    active_seconds: float = 0.0
    duration_seconds: float = 0.0


class ThreadInfo(BaseModel):
    """One thread of a session, as its session knows it (the `threads` query)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    session_id: str
    parent_thread_id: str | None = None
    """None for the primary thread."""
    workflow_run_id: str | None = None
    """The workflow run that spawned it (None: the coordinator, or a client, did)."""
    agent: SpawnedAgent
    status: ThreadStatus = "running"
    stop_reason: str | None = None
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None = None
    usage: ModelUsage = Field(default_factory=ModelUsage)
    list_cost: int | None = None
    """What its model turns cost at list price, US cents (None: the model has no price)."""
    stats: ThreadStats = Field(default_factory=ThreadStats)
    turns: int = 0


class SpawnThreadInput(BaseModel):
    """Start a thread (the `spawn_thread` update): a predefined agent by name or id (or `self`), or an inline one,
    with the message it starts on."""

    model_config = ConfigDict(extra="forbid")
    agent: str | None = Field(default=None, min_length=1)
    inline_agent: InlineAgent | None = None
    message: MessageContent

    @model_validator(mode="after")
    def _one_agent(self) -> SpawnThreadInput:
        if (self.agent is None) == (self.inline_agent is None):
            raise ValueError("spawn a thread with exactly one of `agent` and `inline_agent`")
        normalize_content(self.message)
        return self


class ArchiveThreadInput(BaseModel):
    """Archive a thread (the `archive_thread` update): its work stops, it takes no more messages."""

    model_config = ConfigDict(extra="forbid")
    thread_id: str = Field(min_length=1)


# ---- between a session and its threads (internal signals; persisted in history) -------------------------------


class ThreadSeat(BaseModel):
    """A thread's place, on its start input (`SessionInput.thread`): whose thread it is, what it runs, and the
    message it starts on (from its parent)."""

    model_config = ConfigDict(extra="forbid")
    session_id: str
    thread_id: str
    parent_thread_id: str
    agent: SpawnedAgent
    message: list[ContentBlock] = Field(default_factory=list)
    message_id: str | None = None
    """The id of the parent's `agent.thread_message_sent` that carried `message`."""


class HandResult(BaseModel):
    """What the session's hands returned for a thread's call."""

    tool_use_id: str
    text: str
    is_error: bool = False


class ThreadReport(BaseModel):
    """What a thread tells its session (signal `thread_report`); each field set is one thing to act on."""

    thread_id: str
    status: ThreadStatus | None = None
    stop_reason: StopReason | None = None
    stop_details: RefusalStopDetails | None = None
    reply: list[ContentBlock] | None = None
    """The thread's reply when its turn ended: its last message's text."""
    reply_id: str | None = None
    """The id of the thread's `agent.thread_message_sent` for `reply`: a reply is taken once."""
    uses: list[CrossPosted] = Field(default_factory=list)
    """Tool calls to cross-post to the primary thread's log (their permission already evaluated)."""
    hand_call: AgentToolUse | None = None
    """A sandbox call for the session's hands to run."""
    cancel_call: str | None = None
    """The tool-use id of a sandbox call the thread no longer waits for (interrupted): stop it."""
    usage: ModelUsage | None = None
    """The thread's usage so far, with `turns` and `active_seconds`."""
    turns: int | None = None
    active_seconds: float | None = None


class ThreadMessage(BaseModel):
    """A message from another thread."""

    from_thread_id: str
    from_agent_name: str | None = None
    content: list[ContentBlock]
    message_id: str
    """The sender's `agent.thread_message_sent` id: a message is taken once."""


class ThreadInput(BaseModel):
    """What a session tells one of its threads (signal `thread_input`); each field set is one thing to act on."""

    message: ThreadMessage | None = None
    answer: Answer | None = None
    """A client's custom tool result or confirmation for one of the thread's calls, routed by tool-use id."""
    interrupt: bool = False
    archive: bool = False
    hand_result: HandResult | None = None


class ThreadHandCall(BaseModel):
    """A thread's sandbox call the session was running when it handed over: the next run runs it again (the sandbox
    answers a call id it has seen with its recorded result)."""

    thread_id: str
    use: AgentToolUse


class ThreadsCarry(BaseModel):
    """A session's threads across a hand-over: what it knows of each, and where waiting calls' answers go."""

    threads: list[ThreadInfo] = Field(default_factory=list)
    custom_routes: dict[str, str] = Field(default_factory=dict)
    """Tool-use id of a subagent's custom tool call waiting for the client's result -> its thread id."""
    confirm_routes: dict[str, str] = Field(default_factory=dict)
    """Tool-use id of a subagent's call waiting for the client's confirmation -> its thread id."""
    replies: dict[str, int] = Field(default_factory=dict)
    """Replies received so far, by thread id."""
    hand_calls: list[ThreadHandCall] = Field(default_factory=list)
