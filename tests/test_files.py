"""The file library (corral.files) on the test run's knowledge database and blob store: content-addressed,
deduplicated bytes whose blob goes with the last file that uses it, the workspace quota, the largest upload,
expiry (refused on read from its time on) and the durable timer that removes an expiring file
(workflows/file_expiry.py) on the real Temporal dev server."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from corral.blobs import open_blob_store
from corral.contract.files import file_expiry_workflow_id
from corral.errors import BlobNotFound
from corral.file_expiry import schedule_file_expiry
from corral.files import (
    FileExpired,
    FileNotFound,
    FileStore,
    FileTooLarge,
    StorageQuotaExceeded,
    guess_mime_type,
    quota_from_env,
)
from corral.knowledge_db import open_knowledge_db
from corral.names import ENV_FILE_QUOTA_BYTES
from tests.conftest import Stack, unique
from tests.waits import until

pytestmark = pytest.mark.timeout(120)


def store(**limits: int) -> FileStore:
    return FileStore(open_knowledge_db(), open_blob_store(), **limits)


def unique_bytes(label: str = "") -> bytes:
    """Bytes no other test wrote: dedup across a shared store would otherwise count another test's files."""
    return f"{label}{uuid.uuid4().hex}\n".encode()


def test_a_file_is_stored_by_its_content_and_reads_back() -> None:
    files, workspace = store(), unique("files")
    data = unique_bytes("hello ")
    made = files.create(workspace, "notes.md", data)
    sha = hashlib.sha256(data).hexdigest()
    assert (made.id[:5], made.sha256, made.blob_key, made.size_bytes) == (
        "file_",
        sha,
        f"files/sha256/{sha}",
        len(data),
    )
    assert made.mime_type == "text/markdown", "guessed from the name"
    assert files.get(workspace, made.id) == made and files.read(made) == data
    view = made.view()
    assert view["type"] == "file" and view["scope"] is None and view["expires_at"] is None and view["downloadable"]
    scoped = files.create(workspace, "out.bin", data, "application/x-thing", scope_session_id="sesn_abc")
    assert scoped.view()["scope"] == {"type": "session", "id": "sesn_abc"} and scoped.mime_type == "application/x-thing"
    with pytest.raises(FileNotFound):
        files.get(unique("other"), made.id)  # another workspace's file is not found
    with pytest.raises(FileNotFound):
        files.get(workspace, "file_nosuchfile")


def test_equal_bytes_share_one_blob_until_the_last_file_goes() -> None:
    files, workspace = store(), unique("files")
    data = unique_bytes("shared ")
    first = files.create(workspace, "a.txt", data)
    second = files.create(unique("elsewhere"), "b.txt", data)
    assert first.blob_key == second.blob_key and first.id != second.id
    assert files.blob_users(first.sha256) == 2
    files.delete(workspace, first.id)
    assert files.read(files.get(second.workspace, second.id)) == data, "the other file still reads"
    with pytest.raises(FileNotFound):
        files.get(workspace, first.id)
    with pytest.raises(FileNotFound):
        files.delete(workspace, second.id)  # not this workspace's to delete
    files.delete(second.workspace, second.id)
    assert files.blob_users(first.sha256) == 0
    with pytest.raises(BlobNotFound):
        open_blob_store().get(first.blob_key)


def test_the_quota_and_the_largest_file_are_refused_with_what_they_are() -> None:
    files, workspace = store(quota_bytes=100, max_file_bytes=80), unique("quota")
    files.create(workspace, "a.bin", b"a" * 60)
    with pytest.raises(StorageQuotaExceeded, match=r"holds 60 bytes.*quota of 100 bytes"):
        files.create(workspace, "b.bin", b"b" * 50)
    files.create(unique("quota-other"), "b.bin", b"b" * 50)  # each workspace its own quota
    with pytest.raises(FileTooLarge, match="at most 80 bytes"):
        files.create(unique("quota"), "c.bin", b"c" * 81)
    first = files.list(workspace)[0][0]
    files.delete(workspace, first.id)
    assert files.used_bytes(workspace) == 0
    files.create(workspace, "b.bin", b"b" * 50)  # room again


def test_the_quota_comes_from_the_environment() -> None:
    assert quota_from_env({}) == 10 * 1024**3
    assert quota_from_env({ENV_FILE_QUOTA_BYTES: "2048"}) == 2048
    with pytest.raises(ValueError, match=ENV_FILE_QUOTA_BYTES):
        quota_from_env({ENV_FILE_QUOTA_BYTES: "lots"})


def test_mime_types_are_guessed_from_the_name() -> None:
    assert guess_mime_type("report.pdf") == "application/pdf"
    assert guess_mime_type("data.csv") == "text/csv"
    assert guess_mime_type("noextension") == "application/octet-stream"


def test_a_listing_is_newest_first_in_pages_by_scope_and_by_ids() -> None:
    files, workspace = store(), unique("listing")
    made = [files.create(workspace, f"{n}.txt", unique_bytes(), scope_session_id="sesn_one" if n % 2 else None)
            for n in range(5)]  # fmt: skip
    page, following = files.list(workspace, limit=2)
    assert [f.id for f in page] == [made[4].id, made[3].id] and following is not None
    rest, following = files.list(workspace, limit=10, before=following)
    assert [f.id for f in rest] == [made[2].id, made[1].id, made[0].id] and following is None
    scoped, _ = files.list(workspace, scope_session_id="sesn_one")
    assert [f.id for f in scoped] == [made[3].id, made[1].id]
    named, _ = files.list(workspace, ids=[made[0].id, "file_unknown", made[2].id])
    assert [f.id for f in named] == [made[2].id, made[0].id], "unknown ids are dropped"
    assert files.list(unique("listing"))[0] == []


def test_an_expired_file_reads_as_expired_and_is_not_listed() -> None:
    files, workspace = store(), unique("expired")
    past = files.create(workspace, "old.txt", unique_bytes(), expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(FileExpired):
        files.get(workspace, past.id)
    assert files.list(workspace)[0] == [] and files.used_bytes(workspace) == 0
    assert files.expire(past.id) is not None
    with pytest.raises(FileNotFound):
        files.get(workspace, past.id)
    later = files.create(workspace, "new.txt", unique_bytes(), expires_at=datetime.now(UTC) + timedelta(hours=1))
    assert files.expire(later.id) is None, "not due yet"
    assert files.get(workspace, later.id) == later


async def test_the_durable_timer_removes_an_expiring_file_at_its_time(stack: Stack) -> None:
    files, workspace = store(), unique("timer")
    data = unique_bytes("soon ")
    record = await files.db.run(
        lambda: files.create(workspace, "soon.txt", data, expires_at=datetime.now(UTC) + timedelta(seconds=3))
    )
    workflow_id = await schedule_file_expiry(stack.client, record, stack.harness_queue, stack.model_queue)
    assert workflow_id == file_expiry_workflow_id(record.id)
    assert await schedule_file_expiry(stack.client, record, stack.harness_queue, stack.model_queue) == workflow_id
    handle = stack.client.get_workflow_handle(workflow_id)
    description = await handle.describe()
    assert record.id in (await description.static_summary() or "")

    def removed() -> bool:
        return files.list(workspace, ids=[record.id], limit=1)[0] == [] and files.blob_users(record.sha256) == 0

    async def gone() -> bool:
        try:
            await files.db.run(files.get, workspace, record.id)
        except FileExpired:
            return False  # past its time, not yet removed
        except FileNotFound:
            return await files.db.run(removed)
        return False

    await until(gone, "the expired file removed by its timer", within=60)
    assert await handle.result() is True
    with pytest.raises(BlobNotFound):
        open_blob_store().get(record.blob_key)


async def test_a_file_deleted_before_its_time_leaves_its_timer_nothing_to_do(stack: Stack) -> None:
    files, workspace = store(), unique("timer")
    record = await files.db.run(
        lambda: files.create(
            workspace, "brief.txt", unique_bytes(), expires_at=datetime.now(UTC) + timedelta(seconds=1)
        )
    )
    await files.db.run(files.delete, workspace, record.id)
    handle_id = await schedule_file_expiry(stack.client, record, stack.harness_queue, stack.model_queue)
    assert await stack.client.get_workflow_handle(handle_id).result() is False
