"""What a session carries from one workflow run to the next when it continues as new.

A run's history stays small (what a harness restart replays), the session does not: the state below is all the
next run needs to carry on as if nothing happened. Events already written stay where they are (the archive holds
the earlier runs' events, corral.archive), so the carried state is bounded by the model's context, not by the
session's length. Persisted in history as workflow input: add optional fields, never repurpose one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from corral.contract.events import AgentCustomToolUse, AgentMcpToolUse, AgentToolUse, ModelUsage, SessionEvent
from corral.contract.knowledge import MemoryExport
from corral.contract.outcomes import OutcomesCarry
from corral.contract.plans import RunsCarry
from corral.contract.proxy import McpToolSpec
from corral.contract.sandbox import SandboxHandle
from corral.contract.threads import ThreadsCarry
from corral.names import SessionStatus


class ArchiveIndex(BaseModel):
    """Where the events of a session's earlier runs are: positions `1..through`, in blob-store chunks that begin at
    the positions `chunks` (corral.archive)."""

    through: int = 0
    chunks: list[int] = Field(default_factory=list)


Phase = Literal["idle", "turn", "awaiting_custom", "awaiting_confirmation"]
"""Where the run handed over: waiting for a message, between a tool result and the next model call, waiting for
the client's custom tool results, or waiting for its confirmations (and maybe custom tool results too)."""

ConfirmableToolUse = Annotated[AgentToolUse | AgentMcpToolUse, Field(discriminator="type")]


class KnowledgeCarry(BaseModel):
    """Where a session's outputs and memory stores stand (workflows/_knowledge.py)."""

    exports: list[MemoryExport] = Field(default_factory=list)
    outputs_seen: dict[str, str] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    dirty: bool = False


class SandboxCarry(BaseModel):
    handle: SandboxHandle | None = None
    stopped: bool = False
    generation: int = 0
    volume: str | None = None
    """The workspace volume of the session's sandbox, kept when a dead container is forgotten."""
    knowledge: KnowledgeCarry | None = None


class McpCarry(BaseModel):
    ready: bool = False
    reference: str | None = None
    tools: dict[str, McpToolSpec] = Field(default_factory=dict)


class SessionCarry(BaseModel):
    """The state of a session at a hand-over between workflow runs."""

    run: int
    """The number of the run this state starts (the first run is 1)."""
    phase: Phase
    archive: ArchiveIndex
    tail: list[SessionEvent] = Field(default_factory=list)
    """The events after `archive.through`: written by the run that ended, not final yet (a queued message) or
    written during the hand-over. They stay in the new run's log, at their positions."""
    conversation: list[SessionEvent] = Field(default_factory=list)
    """What the model sees, in order, as it sees it: the latest summary, then the entries after it, with elided
    tool results already stubs (the whole results stay in the log)."""
    unseen_from: int | None = None
    """The first log position the model has not seen yet (what is not seen is never elided)."""
    watermark: int = 0
    pending: list[int] = Field(default_factory=list)
    """Positions (in `tail`) of queued user messages, in arrival order."""
    interrupts: list[int] = Field(default_factory=list)
    system_messages: list[int] = Field(default_factory=list)
    """Positions (in `tail`) of `system.message` events not in the conversation yet, in arrival order."""
    awaiting_custom: list[AgentCustomToolUse] = Field(default_factory=list)
    custom_results: dict[str, int] = Field(default_factory=dict)
    """Custom tool call id -> position (in `tail`) of the result that answers it."""
    awaiting_confirmation: list[ConfirmableToolUse] = Field(default_factory=list)
    confirmations: dict[str, int] = Field(default_factory=dict)
    """Tool call id -> position (in `tail`) of the `user.tool_confirmation` that answers it."""
    client_ids: dict[str, str] = Field(default_factory=dict)
    """The de-duplication window: client id -> event id, the most recent `CLIENT_ID_WINDOW`."""
    sandbox: SandboxCarry = Field(default_factory=SandboxCarry)
    mcp: McpCarry = Field(default_factory=McpCarry)
    archived_at: datetime | None = None
    """When the session was archived (`update_session`): it takes no more events."""
    usage: ModelUsage = Field(default_factory=ModelUsage)
    """All model requests so far: also what the session has spent against its budget, priced at the budget's price
    (recomputed from this, so no separate amount can drift from it)."""
    turns: int = 0
    created_at: datetime
    status: SessionStatus = "idle"
    stop_reason: str | None = None
    threads: ThreadsCarry | None = None
    """A multi-agent session's threads (None for a session that has none)."""
    outcomes: OutcomesCarry | None = None
    """The outcomes defined (None: none was)."""
    runs: RunsCarry | None = None
    """A multi-agent session's workflow runs (None: none was started)."""


CLIENT_ID_WINDOW = 10_000
"""Client ids remembered for de-duplication: a resend of an older one makes a new event."""
