"""Session threads: what a multi-agent session's threads are, as the session's `threads` query shows them and its
`spawn_thread` and `archive_thread` updates take them.

A session's primary thread is the session itself; every other thread is a durable child workflow whose id is the
thread's id (`sthr_<hex>`) and whose history is the thread's log: its `events` query pages it as a session's does.
Persisted schemas: add optional fields, never repurpose one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.contract.agent import AgentConfig
from corral.contract.coordinator import InlineAgent
from corral.contract.events import ModelUsage
from corral.contract.user_events import MessageContent, normalize_content
from corral.names import SESSION_ID_PREFIX, THREAD_ID_PREFIX, SessionStatus

ThreadStatus = SessionStatus
"""A thread has a session's statuses."""


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
