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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

UPLOADS_DIR = "/mnt/session/uploads"
OUTPUTS_DIR = "/mnt/session/outputs"
SKILLS_DIR = "/mnt/skills"
MEMORY_DIR = "/mnt/memory"
MAX_MOUNT_PATH_CHARS = 1024
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
MOUNT_ROOTS = ("/mnt/",)
"""Where a file resource may be mounted: under `/mnt/`, the hosted service's place for them (a file in the
workspace volume would be the agent's to change, not a read-only mount)."""


def mount_path_problem(path: str) -> str | None:
    """Why `path` is not an absolute path under one of `MOUNT_ROOTS` in safe segments (never a shell string)."""
    if not isinstance(path, str) or not path.startswith(MOUNT_ROOTS):
        return f"must be an absolute path under {' or '.join(MOUNT_ROOTS)} (default {UPLOADS_DIR}/<file_id>)"
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
    """Everything of the knowledge stores a session's sandbox is given. Set by the gateway on every session it starts
    (a session started from a Temporal client has none, and keeps no outputs: it has no workspace to file them in)."""

    model_config = ConfigDict(extra="forbid")
    workspace: str = Field(min_length=1)
    """Whose files and memory stores these are: outputs are filed here, memory versions written here."""
    skills_dir: str = SKILLS_DIR
    """Where the skills' folders are, as the system prompt says it: a self-hosted environment's worker unpacks them
    under `skills/` in its own directory."""
    files: list[FileMount] = Field(default_factory=list, max_length=100)
    skills: list[SkillPin] = Field(default_factory=list, max_length=64)
    memory_stores: list[MemoryStoreMount] = Field(default_factory=list, max_length=8)

    def __bool__(self) -> bool:
        return bool(self.files or self.skills or self.memory_stores)


def knowledge_prompt(knowledge: SessionKnowledge | None) -> str:
    """What the system prompt says of the session's skills and memory stores (empty when it has neither): each
    skill's name and description and where its folder is, read only when needed; each store's mount, description
    and instructions."""
    if knowledge is None:
        return ""
    parts: list[str] = []
    if knowledge.skills:
        lines = [
            "# Skills",
            f"You have these skills. Each is a folder under {knowledge.skills_dir}/ with a SKILL.md that says how to "
            "use it: when a task calls for a skill, read its SKILL.md first (with the read tool or `cat`), then "
            "the other files it names, only as you need them.",
        ]
        lines += [
            f"- {skill.name} ({SKILLS_DIR}/{skill.name}/SKILL.md): {skill.description}" for skill in knowledge.skills
        ]
        parts.append("\n".join(lines))
    if knowledge.memory_stores:
        lines = [
            "# Memory",
            "Memory stores persist across sessions. Each is a directory of files; read what is relevant before you "
            "start, and, where you may write, keep what you learn there for the sessions to come.",
        ]
        for store in knowledge.memory_stores:
            access = "read and write" if store.access == "read_write" else "read only"
            line = f"- {store.mount_path}/ ({store.name}; {access})"
            if store.description:
                line += f": {store.description}"
            lines.append(line)
            if store.instructions:
                lines.append(f"  Instructions: {store.instructions}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def with_knowledge_prompt(system: str | None, knowledge: SessionKnowledge | None) -> str | None:
    """The agent's system prompt followed by `knowledge_prompt` (the agent's own, unchanged, when there is none)."""
    extra = knowledge_prompt(knowledge)
    if not extra:
        return system
    return f"{system}\n\n{extra}" if system else extra


class FileResourceChange(BaseModel):
    """Input of the `add_file_resource` and `remove_file_resource` updates: the mount (to add) or the resource id (to
    remove), and the session's resources as the API shows them afterwards (the workflow keeps them in its memo)."""

    mount: FileMount | None = None
    resource_id: str = ""
    resources: list[dict[str, Any]] = Field(default_factory=list)


# ---- between the workflow and its activities ------------------------------------------------------------------------


class MemoryExport(BaseModel):
    """A memory store as it was when a sandbox was made: a tar of its files in the blob store, and each file's
    content hash (what the session's later writes are compared against)."""

    memory_store_id: str
    blob_key: str
    manifest: dict[str, str] = Field(default_factory=dict)
    """Relative path in the mount (no leading `/`) -> content_sha256."""


class ExportInput(BaseModel):
    workspace: str
    session_id: str
    memory_store_ids: list[str]


class CollectedFile(BaseModel):
    """One file changed under a collected directory: its bytes in the blob store, or None when it was removed."""

    path: str
    """Relative to the directory (no leading `/`)."""
    sha256: str | None = None
    size_bytes: int = 0
    blob_key: str | None = None


class CollectedStore(BaseModel):
    memory_store_id: str
    changed: list[CollectedFile] = Field(default_factory=list)


class Collected(BaseModel):
    outputs: list[CollectedFile] = Field(default_factory=list)
    memory: list[CollectedStore] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.outputs or any(store.changed for store in self.memory))


class CommitInput(BaseModel):
    workspace: str
    session_id: str
    collected: Collected
    memory: list[MemoryExport] = Field(default_factory=list)
    """The hashes each change is compared against (its base)."""


class CommitResult(BaseModel):
    outputs: dict[str, str] = Field(default_factory=dict)
    """Output path -> the id of the file it is now."""
    notes: list[str] = Field(default_factory=list)
    """One line per memory change written or skipped (for the worker's log)."""
