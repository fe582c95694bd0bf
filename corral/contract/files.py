"""What crosses the file expiry workflow's boundary (workflows/file_expiry.py): persisted schemas, so fields are
only ever added, optional."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


def file_expiry_workflow_id(file_id: str) -> str:
    """The id of a file's expiry timer: one per file, so scheduling it twice starts it once."""
    return f"file-expiry-{file_id}"


class FileExpiryInput(BaseModel):
    """Which file to remove when its time comes, and where the activity that removes it runs."""

    model_config = ConfigDict(extra="forbid")
    file_id: str = Field(min_length=1, max_length=128)
    workspace: str
    model_task_queue: str
    """The model workers' queue: they hold the blob store and the knowledge database."""


class ExpireFileResult(BaseModel):
    """Whether the activity removed the file, or how long it still has (a clock behind the timer's)."""

    model_config = ConfigDict(extra="forbid")
    removed: bool = False
    seconds_left: float = 0.0
