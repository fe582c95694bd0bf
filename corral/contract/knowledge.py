"""What a session carries of the knowledge that outlives it: file mounts, pinned skills and memory stores.

The gateway resolves each from the knowledge database (corral.knowledge_db) when the session is created, or when a
file resource is added later, and the session's workflow input carries only what the sandbox needs to place it: a
blob key and a path. No content is in history. The sandbox worker reads the bytes from the blob store when the
sandbox is made (lazily, at the first tool call that needs it) or, for a file added later, before the next tool call.

Paths in the sandbox (the hosted service's, where it has one):
- a file resource: `mount_path`, default `/mnt/session/uploads/<file_id>`, read-only;
- what the agent writes under `/mnt/session/outputs/` becomes a file of the session's scope after each turn;
- a skill: `/mnt/skills/<name>/`, its `SKILL.md` at the root, read-only; the system prompt names each skill and its
  description, and the agent reads the rest when it needs it;
- a memory store: `/mnt/memory/<slug>/` (`memory_slug`), read-only or writable as its `access` says; what the agent
  writes there becomes new versions attributed to the session at the end of each turn and before the sandbox stops.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

UPLOADS_DIR = "/mnt/session/uploads"
OUTPUTS_DIR = "/mnt/session/outputs"
SKILLS_DIR = "/mnt/skills"
MEMORY_DIR = "/mnt/memory"
MAX_MOUNT_PATH_CHARS = 1024
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
MOUNT_ROOTS = ("/mnt/", "/workspace/")
"""Where a file resource may be mounted: under `/mnt/` (the hosted service's places) or the workspace volume."""


def mount_path_problem(path: str) -> str | None:
    """Why `path` is not an absolute path under one of `MOUNT_ROOTS` in safe segments (never a shell string)."""
    if not isinstance(path, str) or not path.startswith(MOUNT_ROOTS):
        return f"must be an absolute path under {' or '.join(MOUNT_ROOTS)}"
    if len(path) > MAX_MOUNT_PATH_CHARS:
        return f"is at most {MAX_MOUNT_PATH_CHARS} characters"
    for segment in path[1:].split("/"):
        if segment in ("", ".", "..") or not _SAFE_SEGMENT.match(segment):
            return "has segments of letters, digits, '.', '_' and '-' only, with no empty, '.' or '..' segment"
    for reserved in (OUTPUTS_DIR, SKILLS_DIR, MEMORY_DIR):
        if path == reserved or path.startswith(reserved + "/"):
            return f"must not be under {reserved}, which corral manages"
    return None


def default_file_mount(file_id: str) -> str:
    return f"{UPLOADS_DIR}/{file_id}"


def memory_slug(name: str) -> str:
    """A store's directory name: the name lowercased, each run of other characters than a-z and 0-9 made one `-`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "memory"


class FileMount(BaseModel):
    """A session's `file` resource: one file placed read-only at `mount_path`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["file"] = "file"
    id: str
    """The resource's id (`sres_…`)."""
    file_id: str
    mount_path: str
    blob_key: str
    """Where the file's bytes are in the blob store (corral.files)."""
    size_bytes: int = Field(ge=0)
    created_at: str
    updated_at: str

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, path: str) -> str:
        problem = mount_path_problem(path)
        if problem is not None:
            raise ValueError(f"mount_path {problem}")
        return path


class SkillPin(BaseModel):
    """One skill at the version the session was started with."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["custom", "anthropic"] = "custom"
    skill_id: str
    version: str
    name: str
    """The kebab-case name from `SKILL.md`'s frontmatter: its directory, `/mnt/skills/<name>/`."""
    description: str
    blob_key: str
    """A tar archive of the skill's folder, `SKILL.md` at its root (corral.skills)."""


class MemoryStoreMount(BaseModel):
    """A session's `memory_store` resource: the store's name and description are a snapshot taken at attach."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["memory_store"] = "memory_store"
    memory_store_id: str
    access: Literal["read_write", "read_only"] = "read_write"
    instructions: str | None = Field(default=None, max_length=4096)
    name: str
    description: str = ""
    mount_path: str
    """`/mnt/memory/<slug>`, output-only in the API."""


class SessionKnowledge(BaseModel):
    """Everything of the knowledge stores a session's sandbox is given (empty for most sessions)."""

    model_config = ConfigDict(extra="forbid")
    files: list[FileMount] = Field(default_factory=list, max_length=100)
    skills: list[SkillPin] = Field(default_factory=list, max_length=64)
    memory_stores: list[MemoryStoreMount] = Field(default_factory=list, max_length=8)

    def __bool__(self) -> bool:
        return bool(self.files or self.skills or self.memory_stores)
