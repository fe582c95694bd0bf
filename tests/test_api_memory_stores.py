"""Memory stores over the API, driven by the official `anthropic` SDK's own calls (`client.beta.memory_stores`,
`.memories`, `.memory_versions`) against a real gateway process: stores' fields, archive and delete; memories'
create, rename, preconditions (409 that the SDK does not retry), listings by prefix and depth with `memory_prefix`
items and pages, views; versions with their filters, actors and redaction; every bad value a 400; and a memory
written at once by the API and by two writers through the library (a person's CLI and a session), where nothing
is lost. Every route's isolation between workspaces is in test_gateway_isolation.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from datetime import UTC, datetime, timedelta

import anthropic
import pytest

from corral.knowledge_db import open_knowledge_db
from corral.memory_records import MemoryChange, MemoryConflict, user_actor
from corral.memory_stores import MemoryStores
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_store_fields_listing_archive_and_delete(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("memory-stores")
    first = await client.beta.memory_stores.create(name="Team notes", description="lessons",
                                                   metadata={"team": "core", "tier": "1"})  # fmt: skip
    assert (first.type, first.name, first.description, first.archived_at) == ("memory_store", "Team notes",
                                                                              "lessons", None)  # fmt: skip
    assert first.id.startswith("memstore_")
    changed = await client.beta.memory_stores.update(first.id, description="", metadata={"tier": None, "x": "y"})
    assert changed.description == "" and changed.metadata == {"team": "core", "x": "y"} and changed.name == "Team notes"
    second = await client.beta.memory_stores.create(name="Scratch")
    listed = [s.id async for s in client.beta.memory_stores.list(limit=1)]  # pages of one, followed by the SDK
    assert listed == [second.id, first.id]
    archived = await client.beta.memory_stores.archive(second.id)
    assert archived.archived_at is not None
    assert (await client.beta.memory_stores.archive(second.id)).archived_at == archived.archived_at
    assert [s.id async for s in client.beta.memory_stores.list()] == [first.id]
    assert [s.id async for s in client.beta.memory_stores.list(include_archived=True)] == [second.id, first.id]
    later = datetime.now(UTC) + timedelta(hours=1)
    assert [s.id async for s in client.beta.memory_stores.list(created_at_gte=later)] == []
    assert len([s async for s in client.beta.memory_stores.list(created_at_lte=later)]) == 1
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await client.beta.memory_stores.update(second.id, name="again")
    deleted = await client.beta.memory_stores.delete(second.id)
    assert (deleted.id, deleted.type) == (second.id, "memory_store_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.memory_stores.retrieve(second.id)
    for bad in (lambda: client.beta.memory_stores.create(name=""),
                lambda: client.beta.memory_stores.create(name="x", description="d" * 1025),
                lambda: client.beta.memory_stores.create(name="x", metadata={f"k{i}": "v" for i in range(17)}),
                lambda: client.beta.memory_stores.list(limit=0),
                lambda: client.beta.memory_stores.list(limit=101),
                lambda: client.beta.memory_stores.list(page="not-a-cursor"),
                lambda: client.beta.memory_stores.list(extra_query={"created_at[gte]": "yesterday"}),
                lambda: client.beta.memory_stores.create(name="x", extra_body={"colour": "red"})):  # fmt: skip
        with pytest.raises(anthropic.BadRequestError):
            await bad()
    assert [s.id async for s in client.beta.memory_stores.list(include_archived=True)] == [first.id]


async def test_memories_paths_preconditions_listings_and_archive(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("memories")
    memories = client.beta.memory_stores.memories
    store = await client.beta.memory_stores.create(name="notes")
    made = await memories.create(store.id, path="/projects/foo/notes.md", content="hello")
    assert made.content is None and made.content_sha256 == sha("hello") and made.content_size_bytes == 5
    assert (await memories.create(store.id, path="/empty.md", content=None, view="full")).content == ""
    got = await memories.retrieve(made.id, memory_store_id=store.id)
    assert got.content == "hello" and got.memory_version_id == made.memory_version_id
    with pytest.raises(anthropic.ConflictError) as taken:
        await memories.create(store.id, path="/projects/foo/notes.md", content="again")
    assert taken.value.response.headers["x-should-retry"] == "false"
    renamed = await memories.update(made.id, memory_store_id=store.id, path="/projects/bar/notes.md", view="full")
    assert (renamed.id, renamed.path, renamed.content) == (made.id, "/projects/bar/notes.md", "hello")
    with pytest.raises(anthropic.ConflictError) as stale:
        await memories.update(made.id, memory_store_id=store.id, content="x",
                              precondition={"type": "content_sha256", "content_sha256": sha("not it")})  # fmt: skip
    assert stale.value.response.headers["x-should-retry"] == "false"
    assert isinstance(stale.value.body, dict) and stale.value.body["error"]["details"]["error_code"] == (
        "memory_precondition_failed"
    )
    hello = {"type": "content_sha256", "content_sha256": sha("hello")}
    updated = await memories.update(made.id, memory_store_id=store.id, content="bye", precondition=hello)  # type: ignore[arg-type]
    assert updated.content_sha256 == sha("bye") and updated.memory_version_id != made.memory_version_id
    for path in ("/projects/bar/todo.md", "/projects/bar/deep/er.md", "/top.md", "/projects-archive/x.md"):
        await memories.create(store.id, path=path, content=path)
    top = [(item.type, item.path) async for item in memories.list(store.id, depth=1, limit=2)]
    assert top == [("memory", "/empty.md"), ("memory_prefix", "/projects-archive/"), ("memory_prefix", "/projects/"),
                   ("memory", "/top.md")]  # fmt: skip
    bar = [(item.type, item.path) async for item in memories.list(store.id, path_prefix="/projects/bar/", depth=1)]
    assert bar == [("memory_prefix", "/projects/bar/deep/"), ("memory", "/projects/bar/notes.md"),
                   ("memory", "/projects/bar/todo.md")]  # fmt: skip
    everything = [item async for item in memories.list(store.id, path_prefix="/projects/")]
    assert [i.path for i in everything] == ["/projects/bar/deep/er.md", "/projects/bar/notes.md",
                                            "/projects/bar/todo.md"]  # fmt: skip
    assert all(i.type == "memory" and i.content is None for i in everything)
    page = await memories.list(store.id, view="full", limit=100)
    assert all(i.type == "memory" and i.content is not None for i in page.data) and len(page.data) == 6
    etag = {"type": "etag"}
    for bad in (lambda: memories.create(store.id, path="relative.md", content="x"),
                lambda: memories.create(store.id, path="/a/../b", content="x"),
                lambda: memories.create(store.id, path="/big", content="x" * 102_401),
                lambda: memories.list(store.id, path_prefix="/projects"),
                lambda: memories.list(store.id, depth=-1),
                lambda: memories.list(store.id, view="everything"),  # type: ignore[arg-type]
                lambda: memories.update(made.id, memory_store_id=store.id, precondition=etag),  # type: ignore[arg-type]
                lambda: memories.delete(made.id, memory_store_id=store.id, expected_content_sha256="short"),
                ):  # fmt: skip
        with pytest.raises(anthropic.BadRequestError):
            await bad()
    with pytest.raises(anthropic.ConflictError) as wrong_sha:
        await memories.delete(made.id, memory_store_id=store.id, expected_content_sha256=sha("hello"))
    assert wrong_sha.value.response.headers["x-should-retry"] == "false"
    await client.beta.memory_stores.archive(store.id)
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await memories.create(store.id, path="/new.md", content="x")
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await memories.update(made.id, memory_store_id=store.id, content="x")
    assert (await memories.retrieve(made.id, memory_store_id=store.id)).content == "bye"
    gone = await memories.delete(made.id, memory_store_id=store.id, expected_content_sha256=sha("bye"))
    assert (gone.id, gone.type) == (made.id, "memory_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await memories.retrieve(made.id, memory_store_id=store.id)
    with pytest.raises(anthropic.BadRequestError, match="memory_id"):
        await memories.retrieve(store.id, memory_store_id=store.id)


async def test_versions_actors_filters_and_redaction(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("memory-versions")
    workspace = f"memory-versions-{gateway.suffix}"
    store = await client.beta.memory_stores.create(name="audited")
    memory = await client.beta.memory_stores.memories.create(store.id, path="/m.md", content="v1")
    await client.beta.memory_stores.memories.update(memory.id, memory_store_id=store.id, content="v2")
    library = MemoryStores(open_knowledge_db())
    await asyncio.to_thread(library.apply_session_changes, workspace, store.id, "sesn_writer",
                            [MemoryChange("/m.md", sha("v2"), "v3")])  # fmt: skip
    await asyncio.to_thread(library.update_memory, workspace, store.id, memory.id, user_actor("ada"), "v4")
    versions = client.beta.memory_stores.memory_versions
    history = [v async for v in versions.list(store.id, memory_id=memory.id, limit=2)]
    assert [v.operation for v in history] == ["modified", "modified", "modified", "created"]
    assert [v.content for v in history] == [None] * 4 and history[0].content_sha256 == sha("v4")
    actors = [v.created_by.model_dump() if v.created_by else None for v in history]
    assert actors[0] == {"type": "user_actor", "user_id": "ada"}
    assert actors[1] == {"type": "session_actor", "session_id": "sesn_writer"}
    assert actors[2] is not None and actors[2]["type"] == "api_actor" and actors[2] == actors[3]
    key_id = actors[2]["api_key_id"]
    assert [v.id async for v in versions.list(store.id, api_key_id=key_id)] == [history[2].id, history[3].id]
    assert [v.id async for v in versions.list(store.id, session_id="sesn_writer")] == [history[1].id]
    assert [v.id async for v in versions.list(store.id, operation="created")] == [history[3].id]
    since = history[1].created_at
    assert [v.id async for v in versions.list(store.id, created_at_gte=since)] == [history[0].id, history[1].id]
    assert [v.id async for v in versions.list(store.id, created_at_lte=since)] == [h.id for h in history[1:]]
    full = await versions.list(store.id, view="full", limit=100)
    assert [v.content for v in full.data] == ["v4", "v3", "v2", "v1"]
    oldest = await versions.retrieve(history[3].id, memory_store_id=store.id)
    assert oldest.content == "v1" and oldest.path == "/m.md"
    redacted = await versions.redact(history[3].id, memory_store_id=store.id)
    assert redacted.redacted_at is not None and redacted.redacted_by is not None
    assert redacted.redacted_by.model_dump() == {"type": "api_actor", "api_key_id": key_id}
    assert (redacted.path, redacted.content, redacted.content_sha256, redacted.content_size_bytes) == (None,) * 4
    assert (await versions.retrieve(history[3].id, memory_store_id=store.id)).redacted_at == redacted.redacted_at
    with pytest.raises(anthropic.BadRequestError, match="current content"):
        await versions.redact(history[0].id, memory_store_id=store.id)
    for bad in (lambda: versions.list(store.id, operation="renamed"),  # type: ignore[arg-type]
                lambda: versions.list(store.id, memory_id=store.id),
                lambda: versions.list(store.id, session_id="mem_x"),
                lambda: versions.retrieve(memory.id, memory_store_id=store.id)):  # fmt: skip
        with pytest.raises(anthropic.BadRequestError):
            await bad()
    with pytest.raises(anthropic.NotFoundError):
        await versions.retrieve("memver_nope", memory_store_id=store.id)


async def test_the_api_a_person_and_a_session_write_one_memory_at_once(gateway: Gateway) -> None:  # noqa: F811
    """Three writers of one memory at once, each reading it then writing: the API (under its digest every other
    time; its 409s are final: the SDK does not retry them), a person through the library under its digest, and a
    session's write-back. Every write that
    was not refused is one version, the final content is the newest version's, and nothing else was raised."""
    client = await gateway.client("memory-race")
    workspace = f"memory-race-{gateway.suffix}"
    store = await client.beta.memory_stores.create(name="contended")
    memory = await client.beta.memory_stores.memories.create(store.id, path="/shared.md", content="start")
    library = MemoryStores(open_knowledge_db())
    written: list[str] = []
    refused = [0]
    lock = threading.Lock()
    rounds = 25

    def library_writer(name: str) -> None:
        for n in range(rounds):
            current = library.get_memory(workspace, store.id, memory.id)
            content = f"{name} {n}"
            try:
                if name == "session":
                    change = MemoryChange("/shared.md", current.content_sha256, content)
                    library.apply_session_changes(workspace, store.id, "sesn_race", [change])
                else:
                    library.update_memory(workspace, store.id, memory.id, user_actor(name), content,
                                          expected_sha256=current.content_sha256)  # fmt: skip
            except MemoryConflict:
                with lock:
                    refused[0] += 1
                continue
            with lock:
                written.append(content)

    async def api_writer() -> None:
        for n in range(rounds):
            current = await client.beta.memory_stores.memories.retrieve(memory.id, memory_store_id=store.id)
            content = f"api {n}"
            condition = {"type": "content_sha256", "content_sha256": current.content_sha256}
            try:  # every other write is unconditional: it always applies, as the last writer's
                await client.beta.memory_stores.memories.update(memory.id, memory_store_id=store.id, content=content,
                                                                **({"precondition": condition} if n % 2 else {}))  # type: ignore[arg-type]  # fmt: skip
            except anthropic.ConflictError as exc:
                assert exc.response.headers["x-should-retry"] == "false"
                refused[0] += 1
                continue
            written.append(content)

    await asyncio.gather(asyncio.to_thread(library_writer, "ada"), asyncio.to_thread(library_writer, "session"),
                         api_writer())  # fmt: skip
    assert len(written) + refused[0] == 3 * rounds
    history = [v async for v in client.beta.memory_stores.memory_versions.list(store.id, memory_id=memory.id,
                                                                              view="full")]  # fmt: skip
    assert sorted(v.content or "" for v in history[:-1]) == sorted(written)
    assert history[-1].content == "start" and history[-1].operation == "created"
    final = await client.beta.memory_stores.memories.retrieve(memory.id, memory_store_id=store.id)
    assert final.content == history[0].content and final.memory_version_id == history[0].id
    assert any(w.startswith("api") for w in written) and any(w.startswith("session") for w in written)
