"""The knowledge stores' side of a session's sandbox, on the model workers (which hold the blob store, and here the
knowledge database; the sandbox workers hold neither credential nor database): a memory store's files exported for
a sandbox to mount, and what the sandbox collected after a turn made into files and memory versions.

Both are idempotent, so Temporal may retry them: an export is a tar named by its content, and a commit compares
each change with what the store holds now (a retried commit finds its own versions there and writes nothing new).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import tarfile

from temporalio import activity

from corral.blobs import BlobStore, open_blob_store
from corral.contract.knowledge import CommitInput, CommitResult, ExportInput, MemoryExport
from corral.files import FileStore, FileTooLarge, StorageQuotaExceeded
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.memory_stores import MemoryChange, MemoryStores
from corral.names import ACTIVITY_COMMIT_KNOWLEDGE, ACTIVITY_EXPORT_MEMORY

log = logging.getLogger(__name__)


class KnowledgeActivities:
    def __init__(self, blobs: BlobStore | None = None, db: KnowledgeDB | None = None) -> None:
        self._blobs = blobs or open_blob_store()
        self._db = db or open_knowledge_db()

    @activity.defn(name=ACTIVITY_EXPORT_MEMORY)
    async def export_memory(self, input: ExportInput) -> list[MemoryExport]:
        """Each store's current memories as a tar in the blob store, with the hash of each (the base of the
        session's later writes)."""
        return await asyncio.to_thread(self._export, input)

    def _export(self, input: ExportInput) -> list[MemoryExport]:
        stores = MemoryStores(self._db)
        exports = []
        for store_id in input.memory_store_ids:
            memories = stores.export(input.workspace, store_id)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for memory in sorted(memories, key=lambda memory: memory.path):
                    data = memory.content.encode()
                    info = tarfile.TarInfo(memory.path.lstrip("/"))
                    info.size, info.mode = len(data), 0o644
                    archive.addfile(info, io.BytesIO(data))
            data = buffer.getvalue()
            key = f"memory-exports/{hashlib.sha256(data).hexdigest()}"
            self._blobs.put(key, data)
            manifest = {memory.path.lstrip("/"): memory.content_sha256 for memory in memories}
            exports.append(MemoryExport(memory_store_id=store_id, blob_key=key, manifest=manifest))
        return exports

    @activity.defn(name=ACTIVITY_COMMIT_KNOWLEDGE)
    async def commit_knowledge(self, input: CommitInput) -> CommitResult:
        """Collected outputs become files scoped to the session; collected memory changes become versions
        attributed to it."""
        result = await asyncio.to_thread(self._commit, input)
        for note in result.notes:
            log.info("session %s: %s", input.session_id, note)
        return result

    def _commit(self, input: CommitInput) -> CommitResult:
        result = CommitResult()
        files = FileStore(self._db, self._blobs)
        for output in input.collected.outputs:
            if output.blob_key is None:
                continue
            try:
                made = files.create(
                    input.workspace, output.path.rsplit("/", 1)[-1], self._blobs.get(output.blob_key),
                    scope_session_id=input.session_id,
                )  # fmt: skip
            except (StorageQuotaExceeded, FileTooLarge) as exc:  # kept next turn if room is made; never retried now
                result.notes.append(f"output {output.path} is not kept as a file: {exc}")
                continue
            result.outputs[output.path] = made.id
        bases = {export.memory_store_id: export.manifest for export in input.memory}
        stores = MemoryStores(self._db)
        for store in input.collected.memory:
            base = bases.get(store.memory_store_id, {})
            changes = [
                MemoryChange(
                    path="/" + change.path,
                    base_sha256=base.get(change.path),
                    content=None if change.blob_key is None else self._text(change.blob_key),
                )
                for change in store.changed
            ]
            if changes:
                result.notes += stores.apply_session_changes(
                    input.workspace, store.memory_store_id, input.session_id, changes
                )
        return result

    def _text(self, key: str) -> str:
        return self._blobs.get(key).decode("utf-8", errors="replace")
