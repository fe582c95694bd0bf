"""Dreams: a job that reads past sessions' logs and one memory store with a model, and writes the store reorganised
(the Managed Agents API's dreams). A dream is a `DreamWorkflow` (workflows/dreams.py) whose id is the dream's
id; the work is done by a session of its own (a child `SessionWorkflow`, whose events stream like any session's),
with the transcripts mounted as files and the store read-only; the agent writes the whole new store under
`/mnt/session/outputs/memory/`, and the dream writes it into the output store in one transaction once the
session's turn has ended. A cancelled or failed dream writes nothing: no store is ever half-written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.contract.events import ModelUsage

DreamStatus = Literal["pending", "running", "completed", "failed", "canceled"]
TERMINAL_DREAM_STATUSES = frozenset({"completed", "failed", "canceled"})
DREAM_OUTPUT_DIR = "memory"
"""Under the dream session's outputs: the reorganised store, one file per memory, by path."""
MAX_DREAM_SESSIONS = 100
MAX_DREAM_INSTRUCTIONS = 4096


class DreamModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    speed: Literal["standard"] = "standard"


class DreamOutputBehavior(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["create_new", "update_existing"] = "create_new"
    memory_store_id: str | None = None


class DreamInput(BaseModel):
    """Start input of `DreamWorkflow`, as the gateway checked it."""

    dream_id: str
    workspace: str
    memory_store_id: str
    memory_store_name: str
    session_ids: list[str] = Field(min_length=1, max_length=MAX_DREAM_SESSIONS)
    model: DreamModel
    instructions: str | None = Field(default=None, max_length=MAX_DREAM_INSTRUCTIONS)
    output_behavior: DreamOutputBehavior = Field(default_factory=DreamOutputBehavior)
    model_task_queue: str
    created_at: datetime


class DreamError(BaseModel):
    type: str
    message: str


class DreamState(BaseModel):
    """What the `dream` query answers: where the dream stands."""

    status: DreamStatus = "pending"
    session_id: str | None = None
    outputs: list[str] = Field(default_factory=list)
    """The memory store written (0 or 1)."""
    usage: ModelUsage = Field(default_factory=ModelUsage)
    error: DreamError | None = None
    ended_at: datetime | None = None
    archived_at: datetime | None = None
    written: int = 0
    """How many memories the dream created, changed or deleted (corral's, for the CLI and the Web UI)."""


class DreamResult(BaseModel):
    """What `apply_dream` wrote."""

    memory_store_id: str
    written: int


class ApplyDreamInput(BaseModel):
    dream_id: str
    workspace: str
    session_id: str
    memory_store_id: str
    output_behavior: DreamOutputBehavior
    name: str
    """The new store's name, for `create_new`."""


class PrepareDreamInput(BaseModel):
    dream_id: str
    workspace: str
    session_id: str
    session_ids: list[str]
    memory_store_id: str


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def dream_view(input: DreamInput, state: DreamState) -> dict[str, Any]:
    """The API's `dream` object."""
    output = input.output_behavior.model_dump(exclude_none=True)
    return {
        "type": "dream",
        "id": input.dream_id,
        "status": state.status,
        "inputs": [
            {"type": "memory_store", "memory_store_id": input.memory_store_id},
            {"type": "sessions", "session_ids": sorted(input.session_ids)},
        ],
        "model": input.model.model_dump(),
        "instructions": input.instructions,
        "output_behavior": output,
        "outputs": [{"type": "memory_store", "memory_store_id": store} for store in state.outputs],
        "session_id": state.session_id,
        "usage": {
            "input_tokens": state.usage.input_tokens,
            "output_tokens": state.usage.output_tokens,
            "cache_read_input_tokens": state.usage.cache_read_input_tokens,
            "cache_creation_input_tokens": state.usage.cache_creation_input_tokens,
        },
        "error": state.error.model_dump() if state.error else None,
        "created_at": _when(input.created_at),
        "ended_at": _when(state.ended_at),
        "archived_at": _when(state.archived_at),
    }
