"""Files, skills and memory stores in a real sandbox (sandbox/knowledge.py), on the real engine: placed under `/mnt`
with the owners and modes that make them read-only or writable for the agent, and read back as changes only."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from temporalio.exceptions import ApplicationError

from activities.sandbox import SandboxActivities
from corral.blobs import LocalBlobStore
from corral.contract.errors import SANDBOX_UNAVAILABLE
from corral.contract.knowledge import FileMount, MemoryExport, MemoryStoreMount, SessionKnowledge, SkillPin
from corral.contract.sandbox import CollectInput, Environment, ProvisionInput, SandboxHandle
from sandbox.containers import ensure_container
from sandbox.errors import SandboxError
from sandbox.knowledge import collect_knowledge, place_knowledge
from sandbox.sessions import remove_session
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID, hardened_run_options

NOW = "2026-12-06T00:00:00Z"


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def sandbox(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[tuple[str, SandboxHandle]]:
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    made = ensure_container(docker_client, session_id, Environment(), 0, sandbox_image, scope="test/knowledge")
    handle = SandboxHandle(
        session_id=session_id,
        container_id=made.container_id,
        container_name=made.container_name,
        volume=made.volume,
        image=made.image,
        task_queue="unused",
        generation=0,
    )
    yield session_id, handle
    remove_session(docker_client, session_id, remove_volume=True)


def _as_agent(client: docker.DockerClient, container_id: str, *argv: str) -> tuple[int, str]:
    result = client.containers.get(container_id).exec_run(list(argv), user=f"{SANDBOX_UID}:{SANDBOX_GID}")
    return result.exit_code, result.output.decode(errors="replace")


def test_files_skills_and_stores_are_placed_read_only_or_writable_and_only_changes_come_back(
    docker_client: docker.DockerClient, sandbox: tuple[str, SandboxHandle], tmp_path: Path
) -> None:
    session_id, handle = sandbox
    blobs = LocalBlobStore(tmp_path / "blobs")
    blobs.put("files/a", b"quarterly numbers\n")
    blobs.put(
        "skills/pdf",
        _tar(
            {
                "SKILL.md": b"---\nname: pdf\ndescription: read PDFs\n---\nuse pdftotext\n",
                "tools/run.sh": b"#!/bin/sh\necho ran\n",
            }
        ),
    )
    blobs.put("exports/notes", _tar({"prefs.md": b"likes tea\n", "people/ana.md": b"ana: lead\n"}))
    blobs.put("exports/facts", _tar({"pi.md": b"3.14\n"}))
    knowledge = SessionKnowledge(
        workspace="wrkspc_test",
        files=[
            FileMount(
                id="sres_1",
                file_id="file_1",
                mount_path="/mnt/session/uploads/file_1",
                blob_key="files/a",
                size_bytes=18,
                created_at=NOW,
                updated_at=NOW,
            )
        ],
        skills=[SkillPin(skill_id="skill_1", version="1", name="pdf", description="read PDFs", blob_key="skills/pdf")],
        memory_stores=[
            MemoryStoreMount(memory_store_id="memstore_1", name="Notes", mount_path="/mnt/memory/notes"),
            MemoryStoreMount(
                memory_store_id="memstore_2", access="read_only", name="Facts", mount_path="/mnt/memory/facts"
            ),
        ],
    )
    notes = MemoryExport(
        memory_store_id="memstore_1", blob_key="exports/notes", manifest={"prefs.md": "x-old", "people/ana.md": "y-old"}
    )
    facts = MemoryExport(memory_store_id="memstore_2", blob_key="exports/facts", manifest={"pi.md": "z"})

    place_knowledge(docker_client, handle.container_id, blobs, knowledge, [notes, facts])

    cid = handle.container_id
    assert _as_agent(docker_client, cid, "cat", "/mnt/session/uploads/file_1") == (0, "quarterly numbers\n")
    assert _as_agent(docker_client, cid, "cat", "/mnt/skills/pdf/SKILL.md")[1].endswith("use pdftotext\n")
    assert _as_agent(docker_client, cid, "/mnt/skills/pdf/tools/run.sh") == (0, "ran\n")
    assert _as_agent(docker_client, cid, "cat", "/mnt/memory/notes/people/ana.md") == (0, "ana: lead\n")
    # What the agent may not change it cannot: uploads, skills, a read-only store (nor remove or rename its folder).
    for path in ("/mnt/session/uploads/file_1", "/mnt/skills/pdf/SKILL.md", "/mnt/memory/facts/pi.md"):
        code, output = _as_agent(docker_client, cid, "sh", "-c", 'echo changed > "$1"', "sh", path)
        assert code != 0 and "Permission denied" in output, path
    assert _as_agent(docker_client, cid, "rm", "-rf", "/mnt/memory/facts")[0] != 0
    assert _as_agent(docker_client, cid, "mv", "/mnt/memory/facts", "/mnt/memory/gone")[0] != 0
    assert _as_agent(docker_client, cid, "cat", "/mnt/memory/facts/pi.md") == (0, "3.14\n")
    # The agent writes an output, changes one memory, adds one, removes one.
    for argv in (
        ["mkdir", "-p", "/mnt/session/outputs/charts"],
        ["sh", "-c", "echo 1,2 > /mnt/session/outputs/charts/q3.csv"],
        ["sh", "-c", "echo likes coffee > /mnt/memory/notes/prefs.md"],
        ["sh", "-c", "mkdir -p /mnt/memory/notes/people && echo bo: new > /mnt/memory/notes/people/bo.md"],
        ["rm", "/mnt/memory/notes/people/ana.md"],
    ):
        assert _as_agent(docker_client, cid, *argv)[0] == 0, argv

    outputs, stores = collect_knowledge(
        docker_client,
        blobs,
        CollectInput(session_id=session_id, sandbox=handle, memory=[notes], mounts={"memstore_1": "/mnt/memory/notes"}),
    )

    assert [(o.path, blobs.get(o.blob_key or "")) for o in outputs] == [("charts/q3.csv", b"1,2\n")]
    [changed] = stores
    by_path = {change.path: change for change in changed.changed}
    assert set(by_path) == {"prefs.md", "people/bo.md", "people/ana.md"}
    assert blobs.get(by_path["prefs.md"].blob_key or "") == b"likes coffee\n"
    assert by_path["people/ana.md"].blob_key is None and by_path["people/ana.md"].sha256 is None

    # Collected again with what was kept: nothing new comes back; and placing again keeps the agent's writes.
    seen = {o.path: o.sha256 or "" for o in outputs}
    kept = MemoryExport(
        memory_store_id="memstore_1",
        blob_key="exports/notes",
        manifest={c.path: c.sha256 for c in changed.changed if c.sha256},
    )
    place_knowledge(docker_client, cid, blobs, knowledge, [notes, facts])
    again_outputs, again_stores = collect_knowledge(
        docker_client,
        blobs,
        CollectInput(
            session_id=session_id,
            sandbox=handle,
            outputs_seen=seen,
            memory=[kept],
            mounts={"memstore_1": "/mnt/memory/notes"},
        ),
    )
    assert again_outputs == [] and again_stores[0].changed == []


async def test_a_container_with_no_room_under_mnt_is_a_clear_error_not_a_retry(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A container made before sandboxes had `/mnt` (a read-only root, nothing mounted there): placing fails, and
    the provision says why once instead of retrying a tar that would fail again."""
    volume = f"corral-test-knowledge-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(sandbox_image, ["sleep", "60"], detach=True, name=volume,
                                             **hardened_run_options(volume))  # fmt: skip
    try:
        blobs = LocalBlobStore(tmp_path / "blobs")
        blobs.put("files/a", b"a")
        knowledge = SessionKnowledge(workspace="w", files=[FileMount(
            id="sres_1", file_id="file_1", mount_path="/mnt/session/uploads/file_1", blob_key="files/a", size_bytes=1,
            created_at=NOW, updated_at=NOW)])  # fmt: skip
        with pytest.raises(SandboxError, match="tar in the sandbox failed"):
            place_knowledge(docker_client, container.id or "", blobs, knowledge, [])
        activities = SandboxActivities(docker_client, sandbox_image, blobs=blobs)
        provision = ProvisionInput(session_id="sesn_x", environment=Environment(), generation=0, knowledge=knowledge)
        with pytest.raises(ApplicationError, match="could not be placed") as raised:
            await activities._place(container.id or "", provision)
        assert raised.value.non_retryable and raised.value.type == SANDBOX_UNAVAILABLE
        blobs.delete("files/a")
        with pytest.raises(ApplicationError, match="gone from the blob store"):
            await activities._place(container.id or "", provision)
    finally:
        container.remove(force=True)
        docker_client.volumes.get(volume).remove(force=True)
