"""The file activity: remove one file whose expiry time has come (workflows/file_expiry.py). It runs on the model
workers, which already hold the blob store and the knowledge database."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from corral.blobs import BlobStore, open_blob_store
from corral.contract.files import ExpireFileResult, FileExpiryInput
from corral.files import FileExpired, FileNotFound, FileStore
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.names import ACTIVITY_EXPIRE_FILE


class FileActivities:
    def __init__(self, blobs: BlobStore | None = None, db: KnowledgeDB | None = None) -> None:
        self._blobs = blobs or open_blob_store()
        self._db = db or open_knowledge_db()

    @activity.defn(name=ACTIVITY_EXPIRE_FILE)
    async def expire_file(self, input: FileExpiryInput) -> ExpireFileResult:
        """Remove the file if its time has come; else say how long it still has (this clock is behind)."""
        return await self._db.run(self._expire, input)

    def _expire(self, input: FileExpiryInput) -> ExpireFileResult:
        files = FileStore(self._db, self._blobs)
        now = datetime.now(UTC)
        try:
            record = files.get(input.workspace, input.file_id)
        except FileNotFound:
            return ExpireFileResult(removed=False)  # deleted before its time
        except FileExpired:  # its time has come
            return ExpireFileResult(removed=files.expire(input.file_id, now) is not None)
        if record.expires_at is None:
            return ExpireFileResult(removed=False)  # a file that does not expire is not this timer's
        return ExpireFileResult(seconds_left=max((record.expires_at - now).total_seconds(), 0.001))
