"""A dream's activities, on the model workers (which read sessions' logs and hold the blob store and the knowledge
database): its session's transcripts and store, the wait for that session's turn, and the write of the dreamed
store in one transaction. Each is idempotent: a retried prepare writes the transcripts again as new files of the
same session, a retried wait waits again, a retried apply finds the store already as dreamed."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from corral.blobs import BlobStore, open_blob_store
from corral.contract.dreams import ApplyDreamInput, DreamResult, PrepareDreamInput
from corral.contract.knowledge import MEMORY_DIR, FileMount, MemoryStoreMount, SessionKnowledge, memory_slug
from corral.contract.session import SessionInfo
from corral.dreaming import dreamed_contents, transcript
from corral.files import FileStore
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.memory_dreams import create_with_contents, replace_contents
from corral.memory_records import session_actor
from corral.memory_stores import MemoryStoreNotFound, MemoryStores
from corral.names import (
    ACTIVITY_APPLY_DREAM,
    ACTIVITY_AWAIT_IDLE,
    ACTIVITY_PREPARE_DREAM,
    FILE_RESOURCE_ID_PREFIX,
    QUERY_OUTPUTS,
)
from corral.reading import read_events, session_info

log = logging.getLogger(__name__)

INPUT_GONE = "DreamInputGone"
"""A session or store the dream reads is gone: not retried."""
IDLE_POLL_SECONDS = 1.0


class DreamActivities:
    def __init__(self, client: Client, blobs: BlobStore | None = None, db: KnowledgeDB | None = None) -> None:
        self._client = client
        self._blobs = blobs or open_blob_store()
        self._db = db or open_knowledge_db()

    @activity.defn(name=ACTIVITY_PREPARE_DREAM)
    async def prepare_dream(self, input: PrepareDreamInput) -> SessionKnowledge:
        """Each session's transcript as a file of the dream's session, and the store to mount read-only."""
        files = FileStore(self._db, self._blobs)
        mounts = []
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        for session_id in input.session_ids:
            handle = self._client.get_workflow_handle(session_id)
            try:
                info = await session_info(handle)
                events = await read_events(handle, blobs=self._blobs)
            except Exception as exc:
                raise ApplicationError(f"session {session_id!r} cannot be read: {exc}", type=INPUT_GONE) from exc
            text = transcript(session_id, info.title, events).encode()
            made = await asyncio.to_thread(files.create, input.workspace, f"{session_id}.md", text, "text/markdown",
                                           scope_session_id=input.session_id)  # fmt: skip
            mounts.append(FileMount(
                id=f"{FILE_RESOURCE_ID_PREFIX}{uuid.uuid4().hex[:24]}", file_id=made.id,
                mount_path=f"/mnt/session/uploads/{session_id}.md", blob_key=made.blob_key, size_bytes=made.size_bytes,
                created_at=now, updated_at=now,
            ))  # fmt: skip
            activity.heartbeat(session_id)
        try:
            store = await asyncio.to_thread(MemoryStores(self._db).get_store, input.workspace, input.memory_store_id)
        except MemoryStoreNotFound as exc:
            raise ApplicationError(f"memory store {input.memory_store_id!r} is gone", type=INPUT_GONE) from exc
        mount = MemoryStoreMount(
            memory_store_id=store.id,
            access="read_only",
            name=store.name,
            description=store.description or "",
            mount_path=f"{MEMORY_DIR}/{memory_slug(store.name)}",
        )
        return SessionKnowledge(workspace=input.workspace, files=mounts, memory_stores=[mount])

    @activity.defn(name=ACTIVITY_AWAIT_IDLE)
    async def await_session_idle(self, session_id: str) -> SessionInfo:
        """The session's state once its turn has ended (idle, at least one model turn, nothing queued)."""
        handle = self._client.get_workflow_handle(session_id)
        while True:
            description = await handle.describe()
            if description.status != WorkflowExecutionStatus.RUNNING:
                raise ApplicationError(f"the dream's session {session_id} ended", type=INPUT_GONE)
            info = await session_info(handle)
            if info.status == "idle" and info.turns >= 1 and info.queued_user_events == 0:
                return info
            activity.heartbeat(info.status, info.turns)
            await asyncio.sleep(IDLE_POLL_SECONDS)

    @activity.defn(name=ACTIVITY_APPLY_DREAM)
    async def apply_dream(self, input: ApplyDreamInput) -> DreamResult:
        """The dream session's `memory/` outputs as the output store, written in one transaction."""
        outputs: dict[str, str] = await self._client.get_workflow_handle(input.session_id).query(
            QUERY_OUTPUTS, result_type=dict[str, str]
        )
        return await asyncio.to_thread(self._apply, input, outputs)

    def _apply(self, input: ApplyDreamInput, outputs: dict[str, str]) -> DreamResult:
        files = FileStore(self._db, self._blobs)
        found = {path: files.read(files.get(input.workspace, file_id)) for path, file_id in outputs.items()}
        contents, skipped = dreamed_contents(found)
        for problem in skipped:
            log.warning("dream %s: %s", input.dream_id, problem)
        if not contents:
            raise ApplicationError("the dream's session wrote no memories under its outputs' memory/ directory: "
                                   "the store is left as it was", type=INPUT_GONE)  # fmt: skip
        stores = MemoryStores(self._db)
        session_actor_of = session_actor(input.session_id)
        if input.output_behavior.type == "update_existing":
            written = replace_contents(stores, input.workspace, input.memory_store_id, contents, session_actor_of)
            return DreamResult(memory_store_id=input.memory_store_id, written=written)
        store_id, written = create_with_contents(stores, input.workspace, input.name, contents, session_actor_of,
                                                 input.dream_id)  # fmt: skip
        return DreamResult(memory_store_id=store_id, written=written)
