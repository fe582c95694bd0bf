"""Files over the API, driven by the official `anthropic` SDK against a real gateway process on the real Temporal
dev server: upload, listing (cursor pages, `scope_id`, `ids[]`), metadata, download, delete, deduplicated bytes,
the workspace quota and the largest upload, expiry (its durable timer started with the upload, 404 `file_expired`
from its time on), bad input (400 naming the problem) and another workspace's ids (404 on every route)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types.beta.beta_file_metadata import BetaFileMetadata
from anthropic.types.file_expired_error import FileExpiredError
from anthropic.types.file_not_downloadable_error import FileNotDownloadableError
from anthropic.types.storage_quota_exceeded_error import StorageQuotaExceededError

from corral.blobs import open_blob_store
from corral.contract.files import file_expiry_workflow_id
from corral.files import FileStore
from corral.knowledge_db import open_knowledge_db
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway, running_gateway  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)

Client = anthropic.AsyncAnthropic


def library() -> FileStore:
    return FileStore(open_knowledge_db(), open_blob_store())


def workspace_of(gateway: Gateway, name: str) -> str:  # noqa: F811
    """The workspace the gateway's client for `name` acts in."""
    return f"{name}-{gateway.suffix}"


async def download(client: Client, file_id: str) -> tuple[bytes, Any]:
    response = await client.beta.files.download(file_id)
    return await response.read(), response.headers


async def test_a_file_is_uploaded_described_downloaded_listed_and_deleted(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("files")
    data = f"# Notes {uuid.uuid4().hex}\nRivers run to the sea.\n".encode()
    made = await client.beta.files.upload(file=("C:\\Users\\me\\docs/notes.md", data))
    assert isinstance(made, BetaFileMetadata) and made.id.startswith("file_")
    assert (made.filename, made.mime_type, made.size_bytes, made.downloadable) == ("notes.md", "text/markdown",
                                                                                   len(data), True)  # fmt: skip
    assert made.expires_at is None and made.scope is None and made.type == "file"
    assert await client.beta.files.retrieve_metadata(made.id) == made
    content, headers = await download(client, made.id)
    assert content == data and headers["content-type"].startswith("text/markdown")
    assert "attachment" in headers["content-disposition"] and "notes.md" in headers["content-disposition"]
    assert headers["x-content-type-options"] == "nosniff"
    odd = await client.beta.files.upload(file=("odd.txt", b"odd", "not a media type"))
    assert odd.mime_type == "text/plain", "a malformed type is guessed from the name instead"
    await client.beta.files.delete(odd.id)

    typed = await client.beta.files.upload(file=("uploads/", b"\x00\x01binary", "application/x-thing"))
    assert (typed.filename, typed.mime_type) == ("unnamed", "application/x-thing")
    assert [f.id async for f in client.beta.files.list()] == [typed.id, made.id], "newest first"

    deleted = await client.beta.files.delete(made.id)
    assert (deleted.id, deleted.type) == (made.id, "file_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.files.retrieve_metadata(made.id)
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.files.delete(made.id)
    assert [f.id async for f in client.beta.files.list()] == [typed.id]


async def test_listings_page_by_cursor_and_filter_by_scope_and_ids(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client, other = await gateway.client("listing"), await gateway.client("listing-other")
    uploaded = [(await client.beta.files.upload(file=(f"{n}.txt", f"{n} {uuid.uuid4()}".encode()))).id
                for n in range(5)]  # fmt: skip
    newest_first = uploaded[::-1]
    first = await client.beta.files.list(limit=2)
    assert [f.id for f in first.data] == newest_first[:2] and first.next_page and first.next_page.startswith("page_")
    assert [f.id async for f in client.beta.files.list(limit=2)] == newest_first, "every page, by its cursor"
    second = await client.beta.files.list(limit=2, page=first.next_page)
    assert [f.id for f in second.data] == newest_first[2:4]

    files = library()
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    scoped = await files.db.run(lambda: files.create(workspace_of(gateway, "listing"), "out.csv", b"a,b\n",
                                                     scope_session_id=session_id))  # fmt: skip
    listed = [f async for f in client.beta.files.list(scope_id=session_id)]
    assert [f.id for f in listed] == [scoped.id] and listed[0].scope is not None
    assert (listed[0].scope.type, listed[0].scope.id, listed[0].mime_type) == ("session", session_id, "text/csv")
    assert [f async for f in other.beta.files.list(scope_id=session_id)] == [], "another workspace sees none"

    theirs = await other.beta.files.upload(file=("theirs.txt", b"theirs"))
    named = await client.beta.files.list(ids=[uploaded[0], "file_nosuchfile", theirs.id, uploaded[3]])
    assert [f.id for f in named.data] == [uploaded[3], uploaded[0]] and named.next_page is None, "unknown dropped"
    with pytest.raises(anthropic.BadRequestError, match="without page or limit"):
        await client.beta.files.list(ids=[uploaded[0]], limit=5)
    with pytest.raises(anthropic.BadRequestError, match="at most 100"):
        await client.beta.files.list(ids=[f"file_{n}" for n in range(101)])
    with pytest.raises(anthropic.BadRequestError, match=r"ids\[0\].*a session id, not a file id"):
        await client.beta.files.list(ids=[session_id])
    with pytest.raises(anthropic.BadRequestError, match="scope_id"):
        await client.beta.files.list(scope_id=uploaded[0])
    for bad in ({"limit": 0}, {"limit": 1001}, {"page": "page_x"}, {"page": "elsewhere"}):
        with pytest.raises(anthropic.BadRequestError):
            await client.beta.files.list(**bad)


async def test_equal_bytes_are_stored_once_and_outlive_one_of_their_files(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("dedup")
    data = f"the same bytes {uuid.uuid4()}".encode()
    first = await client.beta.files.upload(file=("a.txt", data))
    second = await client.beta.files.upload(file=("b.txt", data))
    files = library()
    records = [await files.db.run(files.get, workspace_of(gateway, "dedup"), f.id) for f in (first, second)]
    assert records[0].blob_key == records[1].blob_key and await files.db.run(files.blob_users, records[0].sha256) == 2
    await client.beta.files.delete(first.id)
    assert (await download(client, second.id))[0] == data, "the other file still reads"
    await client.beta.files.delete(second.id)
    assert await files.db.run(files.blob_users, records[0].sha256) == 0


async def test_the_quota_and_the_largest_upload_are_refused(stack: Stack, tmp_path: Path) -> None:
    limits = {"CORRAL_FILE_QUOTA_BYTES": "100", "CORRAL_FILE_MAX_BYTES": "80"}
    async with running_gateway(stack, tmp_path, **limits) as small:
        client = await small.client("quota")
        await client.beta.files.upload(file=("a.bin", b"a" * 60))
        with pytest.raises(StorageQuotaExceededError, match="quota of 100 bytes") as refused:
            await client.beta.files.upload(file=("b.bin", b"b" * 50))
        assert refused.value.status_code == 400
        with pytest.raises(anthropic.ContentTooLargeError, match="at most 80 bytes"):
            await client.beta.files.upload(file=("c.bin", b"c" * 81))
        await (await small.client("quota-other")).beta.files.upload(file=("b.bin", b"b" * 50))  # its own quota
        assert [f.filename async for f in client.beta.files.list()] == ["a.bin"], "nothing refused was kept"


async def test_an_expiring_upload_starts_its_timer_and_an_expired_file_is_gone_to_reads(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("expiry")
    before = datetime.now(UTC)
    made = await client.beta.files.upload(file=("later.txt", b"later"), expires_in_seconds=3600)
    assert made.expires_at is not None
    assert before + timedelta(hours=1) <= made.expires_at <= datetime.now(UTC) + timedelta(hours=1)
    timer = await stack.client.get_workflow_handle(file_expiry_workflow_id(made.id)).describe()
    assert timer.workflow_type == "FileExpiryWorkflow" and timer.task_queue == stack.harness_queue
    for bad in (3599, 7_776_001):
        with pytest.raises(anthropic.BadRequestError, match="expires_in_seconds must be from 3600"):
            await client.beta.files.upload(file=("x.txt", b"x"), expires_in_seconds=bad)

    files = library()
    past = await files.db.run(lambda: files.create(workspace_of(gateway, "expiry"), "old.txt", b"old",
                                                   expires_at=datetime.now(UTC) - timedelta(seconds=1)))  # fmt: skip
    for read in (client.beta.files.retrieve_metadata, client.beta.files.download):
        with pytest.raises(FileExpiredError) as expired:
            await read(past.id)
        assert expired.value.status_code == 404
    assert [f.id async for f in client.beta.files.list()] == [made.id], "an expired file is not listed"
    await client.beta.files.delete(past.id)  # an expired file can be deleted before its timer comes

    hidden = await files.db.run(lambda: files.create(workspace_of(gateway, "expiry"), "mount-only.txt", b"m",
                                                     downloadable=False))  # fmt: skip
    assert (await client.beta.files.retrieve_metadata(hidden.id)).downloadable is False
    with pytest.raises(FileNotDownloadableError):
        await client.beta.files.download(hidden.id)


async def test_bad_uploads_and_ids_are_400s_and_another_workspaces_file_is_404_everywhere(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client, other = await gateway.client("bad"), await gateway.client("bad-other")
    mine = await client.beta.files.upload(file=("mine.txt", b"mine"))
    async with httpx2.AsyncClient(base_url=gateway.url, headers={"x-api-key": client.api_key or ""}) as raw:
        no_file = await raw.post("/v1/files", data={"expires_in_seconds": "3600"}, files={"other": ("a", b"a")})
        as_json = await raw.post("/v1/files", json={"file": "text"})
        bad_number = await raw.post("/v1/files", data={"expires_in_seconds": "soon"}, files={"file": ("a", b"a")})
        no_part = await raw.post("/v1/files", files={"expires_in_seconds": (None, "3600")})
        text_part = await raw.post("/v1/files", files={"file": (None, "not a file")})
    for response, why in ((no_file, "no `file` part"), (as_json, "multipart/form-data"),
                          (bad_number, "whole number"), (no_part, "no `file` part"),
                          (text_part, "no `file` part")):  # fmt: skip
        assert response.status_code == 400 and why in response.json()["error"]["message"], response.text
    routes = (client.beta.files.retrieve_metadata, client.beta.files.download, client.beta.files.delete)
    for route in routes:
        with pytest.raises(anthropic.BadRequestError, match="file_id: 'sesn_abc' is a session id, not a file id"):
            await route("sesn_abc")
    for route in (other.beta.files.retrieve_metadata, other.beta.files.download, other.beta.files.delete):
        with pytest.raises(anthropic.NotFoundError, match="was not found"):
            await route(mine.id)
    assert [f.id async for f in other.beta.files.list(ids=[mine.id])] == []
    assert (await download(client, mine.id))[0] == b"mine", "nothing another workspace sent touched it"
