"""`corral files` (cli/file_commands.py) on the test run's knowledge database and blob store, which the API's files
are on too: upload (the id alone when captured, an expiry's timer started on Temporal), ls, info, download, rm."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from corral.blobs import open_blob_store
from corral.contract.files import file_expiry_workflow_id
from corral.files import FileNotFound, FileStore
from corral.knowledge_db import open_knowledge_db
from tests.conftest import Stack, unique
from tests.test_threads_api import corral

pytestmark = pytest.mark.timeout(300)


async def test_files_are_uploaded_listed_shown_downloaded_and_removed(stack: Stack, tmp_path: Path) -> None:
    workspace = unique("cli-files")
    source = tmp_path / "notes.md"
    text = f"# Notes {uuid.uuid4().hex}\n"
    source.write_text(text)
    uploaded = await corral(stack, "files", "upload", str(source), "--workspace", workspace)
    assert uploaded.returncode == 0, uploaded.stderr
    file_id = uploaded.stdout.strip()
    assert file_id.startswith("file_") and "\n" not in file_id, "captured: the id alone"
    record = FileStore(open_knowledge_db(), open_blob_store()).get(workspace, file_id)
    assert (record.filename, record.mime_type, record.size_bytes) == ("notes.md", "text/markdown", len(text))

    listed = await corral(stack, "files", "ls", "--workspace", workspace, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [file_id]
    table = await corral(stack, "files", "ls", "--workspace", workspace)
    assert file_id in table.stdout and "notes.md" in table.stdout
    output = FileStore(open_knowledge_db(), open_blob_store()).create(workspace, "day.txt", b"friday",
                                                                      scope_session_id="sesn_cli")  # fmt: skip
    scoped = await corral(stack, "files", "ls", "--workspace", workspace, "--session", "sesn_cli", "--json")
    assert [json.loads(line)["id"] for line in scoped.stdout.splitlines()] == [output.id]
    shown = await corral(stack, "files", "info", file_id, "--workspace", workspace)
    assert shown.returncode == 0 and json.loads(shown.stdout) == record.view()
    elsewhere = await corral(stack, "files", "info", file_id, "--workspace", unique("cli-other"))
    assert elsewhere.returncode == 1 and "no file" in elsewhere.stderr

    target = tmp_path / "copy.md"
    copied = await corral(stack, "files", "download", file_id, "-o", str(target), "--workspace", workspace)
    assert copied.returncode == 0, copied.stderr
    assert target.read_text() == text
    printed = await corral(stack, "files", "download", file_id, "-o", "-", "--workspace", workspace)
    assert printed.stdout == text

    expiring = await corral(stack, "files", "upload", str(source), "--expires-in", "3600", "--workspace", workspace)
    assert expiring.returncode == 0, expiring.stderr
    timer = await stack.client.get_workflow_handle(file_expiry_workflow_id(expiring.stdout.strip())).describe()
    assert timer.workflow_type == "FileExpiryWorkflow"
    too_soon = await corral(stack, "files", "upload", str(source), "--expires-in", "5", "--workspace", workspace)
    assert too_soon.returncode == 2 and "--expires-in must be from 3600" in too_soon.stderr

    removed = await corral(stack, "files", "rm", file_id, "--workspace", workspace)
    assert removed.returncode == 0, removed.stderr
    with pytest.raises(FileNotFound):
        FileStore(open_knowledge_db(), open_blob_store()).get(workspace, file_id)
    again = await corral(stack, "files", "rm", file_id, "--workspace", workspace)
    assert again.returncode == 1 and "no file" in again.stderr
