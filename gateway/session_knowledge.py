"""A session's `file` and `memory_store` resources and its agent's skills, resolved when the session is created (or,
for a file, added later) into what the session carries (corral.contract.knowledge): a blob key and a mount path for
each file, a pinned version for each skill, a snapshot of each store's name and description.

Each id is checked for its kind and its workspace like every other (400 for another kind, 404 for another
workspace's object, as for none). The resources' views are what `/v1/sessions/{id}/resources` shows, kept in the
session's memo with its repositories'.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from corral.blobs import BlobStore
from corral.contract.knowledge import (
    MEMORY_DIR,
    FileMount,
    MemoryStoreMount,
    SessionKnowledge,
    SkillPin,
    default_file_mount,
    memory_slug,
)
from corral.errors import SkillNotFound
from corral.files import FileExpired, FileNotFound, FileStore
from corral.knowledge_db import KnowledgeDB
from corral.memory_stores import MemoryStoreNotFound, MemoryStores
from corral.names import FILE_RESOURCE_ID_PREFIX
from corral.skills import Skills
from gateway.errors import ApiError, invalid, not_found
from gateway.owned import id_of
from gateway.shapes import problem, when

KNOWLEDGE_RESOURCE_TYPES = ("file", "memory_store")
MAX_MEMORY_STORES = 8
MAX_FILES = 100


def _only(resource: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(resource) - known)
    if unknown:
        raise invalid(f"unknown {where} field(s): {', '.join(unknown)}")


def file_view(mount: FileMount) -> dict[str, Any]:
    return {"type": "file", "id": mount.id, "file_id": mount.file_id, "mount_path": mount.mount_path,
            "created_at": mount.created_at, "updated_at": mount.updated_at}  # fmt: skip


def store_view(mount: MemoryStoreMount) -> dict[str, Any]:
    return {"type": "memory_store", "memory_store_id": mount.memory_store_id, "access": mount.access,
            "instructions": mount.instructions, "name": mount.name, "description": mount.description,
            "mount_path": mount.mount_path}  # fmt: skip


class KnowledgeResolver:
    """Resolves ids into mounts and pins, on the gateway's knowledge database and blob store."""

    def __init__(self, db: KnowledgeDB, blobs: BlobStore) -> None:
        self.db = db
        self.files = FileStore(db, blobs)
        self.stores = MemoryStores(db)
        self.skills = Skills(db, blobs)

    async def session(
        self, workspace: str, resources: list[tuple[int, dict[str, Any]]], skills: list[Any]
    ) -> tuple[SessionKnowledge, list[dict[str, Any]], list[dict[str, Any]]]:
        """The session's knowledge, the views of its file and store resources, and its skills as pinned (the agent
        snapshot's `skills`)."""
        files: list[FileMount] = []
        stores: list[MemoryStoreMount] = []
        for index, resource in resources:
            where = f"resources[{index}]"
            if resource["type"] == "file":
                files.append(await self.file_mount(workspace, resource, where))
            else:
                stores.append(await self._store_mount(workspace, resource, where, {s.mount_path for s in stores}))
        if len(files) > MAX_FILES or len(stores) > MAX_MEMORY_STORES:
            raise invalid(f"resources: at most {MAX_FILES} files and {MAX_MEMORY_STORES} memory stores per session")
        paths = [mount.mount_path for mount in files]
        if len(set(paths)) != len(paths):
            raise invalid("resources: two files have the same mount_path")
        pins = [await self._pin(workspace, skill, f"agent.skills[{index}]") for index, skill in enumerate(skills)]
        knowledge = SessionKnowledge(workspace=workspace, files=files, skills=pins, memory_stores=stores)
        views = [file_view(mount) for mount in files] + [store_view(mount) for mount in stores]
        pinned = [{"type": pin.type, "skill_id": pin.skill_id, "version": pin.version} for pin in pins]
        return knowledge, views, pinned

    async def file_mount(self, workspace: str, resource: dict[str, Any], where: str) -> FileMount:
        _only(resource, {"type", "file_id", "mount_path"}, where)
        file_id = id_of(resource.get("file_id"), f"{where}.file_id", "file")
        try:
            record = await self.db.run(self.files.get, workspace, file_id)
        except FileExpired as exc:
            raise ApiError(404, f"{where}: file {file_id!r} has expired", error_code="file_expired") from exc
        except FileNotFound as exc:
            raise not_found("file", file_id) from exc
        now = when(datetime.now(UTC))
        try:
            return FileMount(
                id=f"{FILE_RESOURCE_ID_PREFIX}{uuid.uuid4().hex[:24]}", file_id=file_id,
                mount_path=resource.get("mount_path") or default_file_mount(file_id), blob_key=record.blob_key,
                size_bytes=record.size_bytes, created_at=now or "", updated_at=now or "",
            )  # fmt: skip
        except ValidationError as exc:
            raise invalid(problem(exc, where)) from exc

    async def _store_mount(
        self, workspace: str, resource: dict[str, Any], where: str, taken: set[str]
    ) -> MemoryStoreMount:
        _only(resource, {"type", "memory_store_id", "access", "instructions"}, where)
        store_id = await self.own_store(workspace, resource.get("memory_store_id"), f"{where}.memory_store_id")
        store = await self.db.run(self.stores.get_store, workspace, store_id)
        if store.archived_at is not None:
            raise ApiError(
                400,
                f"{where}: memory store {store_id!r} is archived: it cannot be attached",
                error_code="memory_store_archived",
            )
        slug, mount_path = memory_slug(store.name), ""
        for suffix in range(1, MAX_MEMORY_STORES + 2):
            mount_path = f"{MEMORY_DIR}/{slug}" + (f"-{suffix}" if suffix > 1 else "")
            if mount_path not in taken:
                break
        try:
            return MemoryStoreMount(
                memory_store_id=store_id, access=resource.get("access") or "read_write",
                instructions=resource.get("instructions"), name=store.name, description=store.description or "",
                mount_path=mount_path,
            )  # fmt: skip
        except ValidationError as exc:
            raise invalid(problem(exc, where)) from exc

    async def own_store(self, workspace: str, value: Any, field: str) -> str:
        """`value` as a memory store id of `workspace` (400 for another kind of id, 404 for no such store)."""
        store_id = id_of(value, field, "memory store")
        try:
            await self.db.run(self.stores.get_store, workspace, store_id)
        except MemoryStoreNotFound as exc:
            raise not_found("memory store", store_id) from exc
        return store_id

    async def _pin(self, workspace: str, skill: Any, where: str) -> SkillPin:
        if not isinstance(skill, dict):
            raise invalid(f"{where} must be an object: {{type, skill_id, version?}}")
        skill_id = id_of(skill.get("skill_id"), f"{where}.skill_id", "skill")
        version = skill.get("version")
        try:
            pin: SkillPin = await self.db.run(self.skills.pin, workspace, skill_id, version)
        except SkillNotFound as exc:
            raise ApiError(404, f"{where}: {exc}", error_code="skill_not_found") from exc
        return pin


def knowledge_resources(resources: Any) -> tuple[list[Any], list[tuple[int, dict[str, Any]]]]:
    """`resources` split: the repositories (checked by gateway.repositories) and the files and memory stores, each
    with its index (for errors)."""
    if resources is None:
        return [], []
    if not isinstance(resources, list):
        raise invalid("resources must be a list")
    repositories, knowledge = [], []
    for index, resource in enumerate(resources):
        if isinstance(resource, dict) and resource.get("type") in KNOWLEDGE_RESOURCE_TYPES:
            knowledge.append((index, resource))
        else:
            repositories.append(resource)
    return repositories, knowledge
