"""The memory stores library (corral.memory_stores) on a real SQLite knowledge database of the test's own: the path
rules, stores' fields and archive rules, memories' create / rename / preconditions, listings with `depth` roll-ups
and cursors (checked against a plain computation on a few thousand memories, with a page size that lands cursors
inside roll-ups), versions and their filters and redaction, the session write-back, and concurrent writers of one
memory from threads (each in its own connection) where no write is lost and the only errors are 409s.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from corral.knowledge_db import KnowledgeDB
from corral.memory_paths import check_path, check_prefix, content_sha256, rolled_prefix
from corral.memory_records import (
    InvalidMemoryRequest,
    MemoryChange,
    MemoryConflict,
    MemoryNotFound,
    MemoryPrefix,
    MemoryRecord,
    MemoryStoreNotFound,
    MemoryVersionNotFound,
    session_actor,
    user_actor,
)
from corral.memory_stores import MemoryStores

WS = "acme"
ME = user_actor("ada")


@pytest.fixture
def stores(tmp_path: Path) -> MemoryStores:
    return MemoryStores(KnowledgeDB(tmp_path / "knowledge.db"))


@pytest.mark.parametrize(
    "path",
    ["/a", "/notes/todo.md", "/" + "/".join(["s"] * 20), "/Ünïcode/ok", "/a b/c", "/" + "x" * 1023],
)
def test_paths_that_are_accepted(path: str) -> None:
    assert check_path(path) == path


@pytest.mark.parametrize(
    "path",
    ["", "a/b", "/", "/a/", "//a", "/a//b", "/./a", "/a/..", "/" + "/".join(["s"] * 21), "/" + "x" * 1024,
     "/a\nb", "/a\u200bb", "/a\u2028b", "/e\u0301", "/a\x00", 7],
)  # fmt: skip
def test_paths_that_are_refused(path: object) -> None:
    with pytest.raises(InvalidMemoryRequest):
        check_path(path)


def test_prefixes_are_whole_segments() -> None:
    assert check_prefix("/") == "/" and check_prefix("/notes/") == "/notes/"
    for bad in ("/notes", "notes/", "//", "/a//"):
        with pytest.raises(InvalidMemoryRequest):
            check_prefix(bad)
    assert rolled_prefix("/a/b/c", "/", 1) == "/a/" and rolled_prefix("/a/b/c", "/a/", 2) is None
    assert rolled_prefix("/a/b/c/d", "/a/", 2) == "/a/b/c/" and rolled_prefix("/x", "/", 0) is None


def test_store_fields_update_and_archive(stores: MemoryStores) -> None:
    store = stores.create_store(WS, "Team notes", "what we learned", {"team": "core", "tier": "1"})
    assert store.view()["description"] == "what we learned" and store.archived_at is None
    changed = stores.update_store(WS, store.id, description="", metadata={"tier": None, "owner": "ada"})
    assert changed.description == "" and changed.metadata == {"team": "core", "owner": "ada"}
    assert changed.name == "Team notes"
    for bad in ({"name": ""}, {"name": "x" * 256}, {"description": "x" * 1025}, {"metadata": {"k" * 65: "v"}},
                {"metadata": {f"k{i}": "v" for i in range(17)}}, {"metadata": {"k": 3}}):  # fmt: skip
        with pytest.raises(InvalidMemoryRequest):
            stores.update_store(WS, store.id, **bad)
    memory = stores.create_memory(WS, store.id, "/kept.md", "still readable", ME)
    archived = stores.archive_store(WS, store.id)
    assert archived.archived_at is not None
    assert stores.archive_store(WS, store.id).archived_at == archived.archived_at  # idempotent
    with pytest.raises(InvalidMemoryRequest, match="archived"):
        stores.update_store(WS, store.id, name="again")
    with pytest.raises(InvalidMemoryRequest, match="archived"):
        stores.create_memory(WS, store.id, "/new.md", "x", ME)
    with pytest.raises(InvalidMemoryRequest, match="archived"):
        stores.update_memory(WS, store.id, memory.id, ME, content="y")
    assert stores.get_memory(WS, store.id, memory.id).content == "still readable"
    listed = stores.list_stores(WS, limit=100).data
    assert store.id not in [s.id for s in listed]
    assert store.id in [s.id for s in stores.list_stores(WS, include_archived=True, limit=100).data]
    stores.delete_memory(WS, store.id, memory.id, ME)  # delete still works when archived
    stores.delete_store(WS, store.id)
    with pytest.raises(MemoryStoreNotFound):
        stores.get_store(WS, store.id)


def test_another_workspace_sees_nothing(stores: MemoryStores) -> None:
    store = stores.create_store(WS, "private")
    memory = stores.create_memory(WS, store.id, "/secret.md", "s", ME)
    version = memory.memory_version_id
    with pytest.raises(MemoryStoreNotFound):
        stores.get_store("other", store.id)
    with pytest.raises(MemoryStoreNotFound):
        stores.get_memory("other", store.id, memory.id)
    with pytest.raises(MemoryStoreNotFound):
        stores.get_version("other", store.id, version)
    with pytest.raises(MemoryStoreNotFound):
        stores.export("other", store.id)
    other = stores.create_store("other", "theirs")
    with pytest.raises(MemoryNotFound):
        stores.get_memory("other", other.id, memory.id)  # a memory of another store is not found in this one
    with pytest.raises(MemoryVersionNotFound):
        stores.get_version("other", other.id, version)


def test_memory_create_rename_preconditions_and_history(stores: MemoryStores) -> None:
    store = stores.create_store(WS, "s")
    memory = stores.create_memory(WS, store.id, "/a.md", "one", ME)
    assert memory.content_sha256 == content_sha256("one") and memory.content_size_bytes == 3
    with pytest.raises(MemoryConflict) as taken:
        stores.create_memory(WS, store.id, "/a.md", "again", ME)
    assert taken.value.code == "memory_path_conflict"
    renamed = stores.update_memory(WS, store.id, memory.id, ME, path="/b/a.md")
    assert renamed.id == memory.id and renamed.path == "/b/a.md" and renamed.content == "one"
    stores.create_memory(WS, store.id, "/c.md", "", ME)
    with pytest.raises(MemoryConflict):
        stores.update_memory(WS, store.id, memory.id, ME, path="/c.md")
    with pytest.raises(MemoryConflict) as stale:
        stores.update_memory(WS, store.id, memory.id, ME, content="two", expected_sha256=content_sha256("zero"))
    assert stale.value.code == "memory_precondition_failed"
    two = stores.update_memory(WS, store.id, memory.id, ME, content="two", expected_sha256=content_sha256("one"))
    assert stores.update_memory(WS, store.id, memory.id, ME, content="two").memory_version_id == two.memory_version_id
    with pytest.raises(MemoryConflict):
        stores.delete_memory(WS, store.id, memory.id, ME, expected_sha256=content_sha256("one"))
    with pytest.raises(InvalidMemoryRequest):
        stores.delete_memory(WS, store.id, memory.id, ME, expected_sha256="nothex")
    with pytest.raises(InvalidMemoryRequest):
        stores.create_memory(WS, store.id, "/big.md", "x" * 102_401, ME)
    stores.delete_memory(WS, store.id, memory.id, ME, expected_sha256=content_sha256("two"))
    with pytest.raises(MemoryNotFound):
        stores.get_memory(WS, store.id, memory.id)
    history = stores.list_versions(WS, store.id, memory_id=memory.id, full=True).data
    assert [v.operation for v in history] == ["deleted", "modified", "modified", "created"]
    assert [v.path for v in history] == ["/b/a.md", "/b/a.md", "/b/a.md", "/a.md"]
    assert [v.content for v in history] == [None, "two", "one", "one"]
    assert history[0].content_sha256 is None and history[1].content_sha256 == content_sha256("two")
    assert all(v.created_by == ME for v in history)


def test_versions_filters_paging_and_redaction(stores: MemoryStores) -> None:
    store = stores.create_store(WS, "s")
    memory = stores.create_memory(WS, store.id, "/m.md", "v0", ME)
    for n in range(1, 6):
        stores.update_memory(WS, store.id, memory.id, ME, content=f"v{n}")
    stores.apply_session_changes(WS, store.id, "sesn_one", [MemoryChange("/m.md", content_sha256("v5"), "s1")])
    stores.create_memory(WS, store.id, "/other.md", "o", {"type": "api_actor", "api_key_id": "apikey_1"})
    by_session = stores.list_versions(WS, store.id, session_id="sesn_one").data
    assert [v.created_by for v in by_session] == [session_actor("sesn_one")]
    assert [v.path for v in stores.list_versions(WS, store.id, api_key_id="apikey_1").data] == ["/other.md"]
    assert len(stores.list_versions(WS, store.id, operation="created").data) == 2
    seen, page = [], None
    while True:
        listing = stores.list_versions(WS, store.id, memory_id=memory.id, limit=3, page=page)
        seen += listing.data
        if listing.next_page is None:
            break
        page = listing.next_page
    assert [v.operation for v in seen] == ["modified"] * 6 + ["created"]
    oldest = seen[-1]
    redacted = stores.redact_version(WS, store.id, oldest.id, ME)
    assert redacted.redacted_at and redacted.redacted_by == ME and redacted.created_by == ME
    assert (redacted.path, redacted.content, redacted.content_sha256, redacted.content_size_bytes) == (None,) * 4
    assert stores.redact_version(WS, store.id, oldest.id, ME).redacted_at == redacted.redacted_at
    with pytest.raises(InvalidMemoryRequest, match="current content"):
        stores.redact_version(WS, store.id, seen[0].id, ME)
    with pytest.raises(InvalidMemoryRequest):
        stores.list_versions(WS, store.id, operation="renamed")


def test_listing_with_depth_and_cursors_matches_a_plain_computation(stores: MemoryStores) -> None:
    """Thousands of memories in nested directories, listed at every depth and prefix with pages of 7: the items
    and their order are exactly what a computation over all the paths gives, whatever page a roll-up falls in."""
    store = stores.create_store(WS, "big")
    rng = random.Random(27)
    paths = sorted({"/" + "/".join(f"d{rng.randrange(4)}" for _ in range(rng.randrange(0, 4))) + f"/f{n}.md"
                    for n in range(3000)})  # fmt: skip
    paths = [p.replace("//", "/") for p in paths]
    stores.import_memories(WS, store.id, [(path, f"content of {path}") for path in paths], ME)
    for prefix in ("/", "/d1/", "/d2/d3/", "/nothing/"):
        for depth in (0, 1, 2, 3):
            expected: list[str] = []
            for path in sorted(p for p in paths if p.startswith(prefix)):
                rolled = rolled_prefix(path, prefix, depth)
                item = "P" + rolled if rolled else "M" + path
                if not expected or expected[-1] != item:
                    expected.append(item)
            got, page = [], None
            while True:
                listing = stores.list_memories(WS, store.id, path_prefix=prefix, depth=depth, limit=7, page=page)
                got += [("P" if isinstance(i, MemoryPrefix) else "M") + i.path for i in listing.data]
                assert len(listing.data) <= 7
                if listing.next_page is None:
                    break
                page = listing.next_page
            assert got == expected, (prefix, depth)
    full = stores.list_memories(WS, store.id, limit=100, full=True)
    assert len(full.data) == 20 and all(isinstance(m, MemoryRecord) and m.content for m in full.data)
    basic = stores.list_memories(WS, store.id, limit=100)
    assert len(basic.data) == 100 and all(isinstance(m, MemoryRecord) and m.content is None for m in basic.data)
    assert len(stores.export(WS, store.id)) == len(paths)
    with pytest.raises(InvalidMemoryRequest):
        stores.list_memories(WS, store.id, page="garbage")
    with pytest.raises(InvalidMemoryRequest):
        stores.list_memories(WS, store.id, limit=101)
    with pytest.raises(InvalidMemoryRequest):
        stores.list_memories(WS, store.id, path_prefix="/d1")


def test_session_changes_never_lose_a_write(stores: MemoryStores) -> None:
    store = stores.create_store(WS, "shared")
    kept = stores.create_memory(WS, store.id, "/kept.md", "mine", ME)
    raced = stores.create_memory(WS, store.id, "/raced.md", "base", ME)
    plain = stores.create_memory(WS, store.id, "/plain.md", "base", ME)
    gone = stores.create_memory(WS, store.id, "/gone.md", "base", ME)
    mounted = {s.path: s.content_sha256 for s in stores.export(WS, store.id)}
    stores.update_memory(WS, store.id, kept.id, ME, content="a person changed it")
    stores.update_memory(WS, store.id, raced.id, ME, content="a person changed it too")
    report = stores.apply_session_changes(WS, store.id, "sesn_x", [
        MemoryChange("/kept.md", mounted["/kept.md"], None),
        MemoryChange("/raced.md", mounted["/raced.md"], "the session's"),
        MemoryChange("/plain.md", mounted["/plain.md"], "edited"),
        MemoryChange("/gone.md", mounted["/gone.md"], None),
        MemoryChange("/new/file.md", None, "new"),
        MemoryChange("/bad/./path", None, "x"),
        MemoryChange("/huge.md", None, "x" * 200_000),
    ])  # fmt: skip
    assert len(report) == 7
    assert "skipped deleting /kept.md" in report[0] and "both versions" in report[1]
    assert report[2] == "wrote /plain.md" and report[3] == "deleted /gone.md" and report[4] == "created /new/file.md"
    assert report[5].startswith("skipped") and report[6].startswith("skipped")
    assert stores.get_memory(WS, store.id, kept.id).content == "a person changed it"
    assert stores.get_memory(WS, store.id, raced.id).content == "the session's"
    assert stores.get_memory(WS, store.id, plain.id).content == "edited"
    raced_history = stores.list_versions(WS, store.id, memory_id=raced.id, full=True).data
    assert [v.content for v in raced_history] == ["the session's", "a person changed it too", "base"]
    assert raced_history[0].created_by == session_actor("sesn_x")
    with pytest.raises(MemoryNotFound):
        stores.get_memory(WS, store.id, gone.id)


def test_concurrent_writers_of_one_memory(tmp_path: Path) -> None:
    """Three threads, each with its own connection, write one memory under preconditions: every write is either a
    version or a 409 (`MemoryConflict`), never both lost, and the final content is the last version's."""
    stores = MemoryStores(KnowledgeDB(tmp_path / "knowledge.db"))
    store = stores.create_store(WS, "contended")
    memory = stores.create_memory(WS, store.id, "/shared.md", "start", ME)
    written: list[str] = []
    errors: list[BaseException] = []
    conflicts = [0]
    lock = threading.Lock()

    def writer(name: str) -> None:
        try:
            for n in range(30):
                current = stores.get_memory(WS, store.id, memory.id)
                content = f"{name} {n}"
                try:
                    if name == "session":
                        stores.apply_session_changes(WS, store.id, "sesn_w", [
                            MemoryChange("/shared.md", current.content_sha256, content)])  # fmt: skip
                    else:
                        stores.update_memory(WS, store.id, memory.id, user_actor(name), content=content,
                                             expected_sha256=current.content_sha256)  # fmt: skip
                except MemoryConflict:
                    with lock:
                        conflicts[0] += 1
                    continue
                with lock:
                    written.append(content)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("ada", "bob", "session")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    history = stores.list_versions(WS, store.id, memory_id=memory.id, limit=100, full=True)
    versions = list(history.data)
    while history.next_page:
        history = stores.list_versions(WS, store.id, memory_id=memory.id, limit=100, page=history.next_page, full=True)
        versions += history.data
    assert sorted(v.content or "" for v in versions[:-1]) == sorted(written)  # each write is one version
    assert len(written) + conflicts[0] == 90
    final = stores.get_memory(WS, store.id, memory.id)
    assert final.content == versions[0].content and final.memory_version_id == versions[0].id


def test_the_cli_lists_reads_writes_and_shows_history(tmp_path: Path) -> None:
    """`corral memory` on the run's knowledge database (CORRAL_KNOWLEDGE_DB), as an operator uses it: what it
    writes is attributed to the login name, and what the library wrote reads back through it."""
    import getpass
    import uuid

    from typer.testing import CliRunner

    from cli.main import app
    from corral.knowledge_db import open_knowledge_db

    runner = CliRunner()
    workspace = f"cli-{uuid.uuid4().hex[:8]}"

    def corral(*args: str, stdin: str | None = None) -> tuple[int, str]:
        result = runner.invoke(app, ["--state-dir", str(tmp_path), "memory", *args], input=stdin)
        return result.exit_code, result.output

    code, store_id = corral("create-store", "Ops notes", "--workspace", workspace)
    assert code == 0 and store_id.strip().startswith("memstore_"), store_id
    store_id = store_id.strip()
    library = MemoryStores(open_knowledge_db())
    library.create_memory(workspace, store_id, "/runbooks/deploy.md", "step 1", session_actor("sesn_cli"))
    assert corral("put", store_id, "/runbooks/deploy.md", stdin="step 1\nstep 2\n")[0] == 0
    assert corral("put", store_id, "/top.md", stdin="top")[0] == 0
    code, listing = corral("ls", store_id, "--depth", "1")
    assert code == 0 and listing.split() == ["-", "/runbooks/", "3", content_sha256("top")[:12], "/top.md"]
    assert corral("cat", store_id, "/runbooks/deploy.md") == (0, "step 1\nstep 2\n")
    assert corral("rm", store_id, "/top.md")[0] == 0
    code, shown = corral("history", store_id, "/runbooks/deploy.md")
    assert code == 0 and "modified" in shown and "created" in shown
    assert f"user {getpass.getuser()}" in shown and "session sesn_cli" in shown
    code, stores_shown = corral("stores", "--workspace", workspace)
    assert code == 0 and store_id in stores_shown and "Ops notes" in stores_shown
    deleted = library.list_versions(workspace, store_id, operation="deleted").data
    assert [v.path for v in deleted] == ["/top.md"] and deleted[0].created_by == user_actor(getpass.getuser())
    code, said = corral("put", store_id, "/bad/../path", stdin="x")
    assert code == 2 and "'..'" in said
    code, said = corral("cat", store_id, "/missing.md")
    assert code == 1 and "was not found" in said
    code, said = corral("ls", store_id, "--workspace", "someone-else")
    assert code == 1 and f"no memory store {store_id} in workspace someone-else" in said
