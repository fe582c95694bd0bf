"""Records (one `RecordWorkflow` per object) and API keys, against the real Temporal dev server.

Each test works in workspaces of its own, so listings see only its records. Visibility (what listings read) is
updated a moment after a write: tests that list wait for it with a bounded retry (`listed_eventually`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from typer.testing import CliRunner

from cli.main import app
from corral.apikeys import API_KEY_KIND, KEY_PREFIX, create_key, list_keys, revoke_key, verify_key
from corral.contract.records import MAX_UPDATES_PER_RUN, UPDATE_PUT, PutRecord, RecordView
from corral.names import HARNESS_TASK_QUEUE
from corral.records import (
    InvalidRecord,
    RecordArchived,
    RecordNotFound,
    Records,
    VersionConflict,
    is_record_id,
    new_record_id,
    record_id_millis,
)
from tests.conftest import Stack, history_text, unique
from workers.roles import harness_worker

AGENT = {"name": "researcher", "model": {"id": "claude-sonnet-4-5"}, "tools": []}


@pytest.fixture
async def records(stack: Stack) -> AsyncIterator[Records]:
    """Records on the test's harness queue; whatever is left running on it is terminated at the end."""
    yield Records(stack.client, stack.harness_queue)
    query = f"WorkflowType = 'RecordWorkflow' AND TaskQueue = '{stack.harness_queue}' AND ExecutionStatus = 'Running'"
    async for execution in stack.client.list_workflows(query):
        with contextlib.suppress(Exception):
            await stack.client.get_workflow_handle(execution.id).terminate("test finished")


def workspace() -> str:
    return unique("ws")


async def listed_eventually(
    list_page: Callable[[], Awaitable[tuple[list[RecordView], str | None]]],
    done: Callable[[list[RecordView]], bool],
    attempts: int = 100,
) -> list[RecordView]:
    """The first page that satisfies `done`, reading again while visibility catches up (at most `attempts` reads,
    a tenth of a second apart); the test fails if it never does."""
    page: list[RecordView] = []
    for _ in range(attempts):
        page, _ = await list_page()
        if done(page):
            return page
        await asyncio.sleep(0.1)
    pytest.fail(f"visibility never showed the expected records; last page: {[view.id for view in page]}")


# ---- one record -----------------------------------------------------------------------------------------------


async def test_a_record_is_created_read_and_versioned(records: Records) -> None:
    ws = workspace()
    created = await records.create("agent", ws, AGENT, "agent")
    assert is_record_id(created.id, "agent") and created.version == 1 and created.body == AGENT
    assert (created.kind, created.workspace, created.archived_at) == ("agent", ws, None)
    assert created.created_at == created.updated_at
    assert await records.get(created.id, ws) == created  # read-your-writes: create returned what get reads

    second = await records.put(created.id, ws, {**AGENT, "name": "writer"})
    third = await records.put(created.id, ws, {**AGENT, "name": "editor"}, expected_version=2)
    assert (second.version, third.version) == (2, 3)
    assert third.created_at == created.created_at and third.updated_at > second.updated_at
    assert (await records.get(created.id, ws)).body["name"] == "editor"
    assert (await records.get(created.id, ws, version=1)).body == AGENT
    assert (await records.get(created.id, ws, version=2)).body["name"] == "writer"
    assert [view.version for view in await records.versions(created.id, ws)] == [1, 2, 3]
    with pytest.raises(RecordNotFound):
        await records.get(created.id, ws, version=4)
    with pytest.raises(RecordNotFound):
        await records.get(created.id, ws, version=0)


async def test_a_stale_version_is_refused_and_nothing_is_written(records: Records, stack: Stack) -> None:
    ws = workspace()
    created = await records.create("agent", ws, AGENT, "agent")
    await records.put(created.id, ws, {**AGENT, "name": "second"}, expected_version=1)
    with pytest.raises(VersionConflict):
        await records.put(created.id, ws, {**AGENT, "name": "stale-write-marker"}, expected_version=1)
    assert [view.body["name"] for view in await records.versions(created.id, ws)] == ["researcher", "second"]
    history = await history_text(stack.client.get_workflow_handle(created.id))
    assert "second" in history  # the scan sees update payloads...
    assert "stale-write-marker" not in history  # ...and the refused one never reached history


async def test_a_put_of_the_same_body_makes_no_version(records: Records) -> None:
    ws = workspace()
    created = await records.create("agent", ws, AGENT, "agent")
    again = await records.put(created.id, ws, dict(AGENT))
    assert again == created
    assert len(await records.versions(created.id, ws)) == 1


async def test_an_archived_record_is_readable_but_refuses_writes(records: Records) -> None:
    ws = workspace()
    kept = await records.create("agent", ws, AGENT, "agent")
    archived = await records.create("agent", ws, {**AGENT, "name": "old"}, "agent")
    first = await records.archive(archived.id, ws)
    assert first.archived_at is not None and first.version == 1
    assert (await records.archive(archived.id, ws)).archived_at == first.archived_at  # idempotent
    with pytest.raises(RecordArchived):
        await records.put(archived.id, ws, {**AGENT, "name": "new"})
    with pytest.raises(RecordArchived):
        await records.put(archived.id, ws, first.body)  # even a put that would change nothing
    assert (await records.get(archived.id, ws)).body["name"] == "old"

    everything = await listed_eventually(
        lambda: records.list("agent", ws, include_archived=True), lambda page: len(page) == 2
    )
    assert {view.id for view in everything} == {kept.id, archived.id}
    current = await listed_eventually(lambda: records.list("agent", ws), lambda page: len(page) == 1)
    assert [view.id for view in current] == [kept.id]


async def test_a_deleted_record_is_not_found_and_its_workflow_ends(records: Records, stack: Stack) -> None:
    ws = workspace()
    created = await records.create("environment", ws, {"name": "env"}, "env")
    await records.delete(created.id, ws)
    for attempt in (
        records.get(created.id, ws),
        records.put(created.id, ws, {"name": "again"}),
        records.archive(created.id, ws),
        records.delete(created.id, ws),
        records.versions(created.id, ws),
        records.get_any(created.id),
    ):
        with pytest.raises(RecordNotFound):
            await attempt
    described = await stack.client.get_workflow_handle(created.id).describe()
    assert described.status == WorkflowExecutionStatus.COMPLETED


async def test_ids_that_are_not_record_ids_are_not_found(records: Records) -> None:
    ws = workspace()
    created = await records.create("agent", ws, AGENT, "agent")
    for bad in ("", "nope", "agent_", "agent_../../etc", created.id.upper(), created.id + "0", "env" + created.id[5:]):
        with pytest.raises(RecordNotFound):
            await records.get(bad, ws)
    with pytest.raises(RecordNotFound):  # the right id, asked for as another kind
        await records.get(created.id, ws, kind="environment")
    for bad_workspace in ("", "UPPER", "-dash", "a" * 64, "with space", "x'y"):
        with pytest.raises(InvalidRecord):
            await records.get(created.id, bad_workspace)
        with pytest.raises(InvalidRecord):
            await records.create("agent", bad_workspace, AGENT, "agent")
    with pytest.raises(InvalidRecord):
        await records.list("agent", ws, page="not a cursor")
    with pytest.raises(InvalidRecord, match="time zone"):  # a naive bound would be read in someone's local time
        await records.list("agent", ws, created_at_gte=datetime(2026, 1, 1))


def test_record_ids_sort_by_creation_time() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_record_id("agent") for _ in range(3)]
    after = time.time_ns() // 1_000_000
    assert all(before <= record_id_millis(id) <= after for id in ids), "the id's time is when it was made"
    assert record_id_millis("agent_0000000001" + "z" * 16) == 1
    assert all(is_record_id(id, "agent") and len(id) == len("agent_") + 26 for id in ids)
    assert len(set(ids)) == 3
    with pytest.raises(InvalidRecord):
        new_record_id("Bad-Prefix")


# ---- workspaces and listings ----------------------------------------------------------------------------------


async def test_another_workspace_sees_nothing(records: Records) -> None:
    ws, other = workspace(), workspace()
    created = await records.create("agent", ws, AGENT, "agent")
    for attempt in (
        records.get(created.id, other),
        records.put(created.id, other, {"name": "hijacked"}),
        records.archive(created.id, other),
        records.delete(created.id, other),
        records.versions(created.id, other),
    ):
        with pytest.raises(RecordNotFound):
            await attempt
    assert await records.get(created.id, ws) == created  # nothing above changed it
    await listed_eventually(lambda: records.list("agent", ws), lambda page: len(page) == 1)
    assert await records.list("agent", other, include_archived=True) == ([], None)
    assert await records.list("environment", ws) == ([], None)  # another kind in the same workspace


async def test_a_listing_pages_newest_first_and_shows_each_record_once(records: Records) -> None:
    ws = workspace()
    made = [await records.create("agent", ws, {**AGENT, "name": f"agent-{n}"}, "agent") for n in range(5)]
    await listed_eventually(lambda: records.list("agent", ws, limit=10), lambda page: len(page) == 5)

    async def all_pages(order: Any) -> list[list[str]]:
        pages: list[list[str]] = []
        cursor: str | None = None
        while True:
            page, cursor = await records.list("agent", ws, limit=2, page=cursor, order=order)
            pages.append([view.id for view in page])
            if cursor is None:
                return pages
            assert len(pages) < 10, "the cursor never ends"

    newest_first = [view.id for view in reversed(made)]
    assert await all_pages("desc") == [newest_first[0:2], newest_first[2:4], newest_first[4:]]
    assert await all_pages("asc") == [[made[0].id, made[1].id], [made[2].id, made[3].id], [made[4].id]]
    page, cursor = await records.list("agent", ws, limit=5)
    assert [view.id for view in page] == newest_first and cursor is None  # an exact fit has no next page
    # Items are read from their workflows, so a listing shows the current version.
    await records.put(made[0].id, ws, {**AGENT, "name": "renamed"})
    page, _ = await records.list("agent", ws, limit=10)
    assert page[-1].body["name"] == "renamed" and page[-1].version == 2


async def test_a_record_continues_as_new_with_every_version(records: Records, stack: Stack) -> None:
    ws = workspace()
    created = await records.create("agent", ws, {"n": 0}, "agent")
    handle = stack.client.get_workflow_handle(created.id)
    first_run = (await handle.describe()).run_id
    puts = MAX_UPDATES_PER_RUN + 5  # past one run's worth of updates (the create's read-back counts as one)
    for n in range(1, puts + 1):  # the update itself, not `Records.put` (which reads first): half the time
        await handle.execute_update(UPDATE_PUT, PutRecord(expected_version=n, body={"n": n}), result_type=RecordView)
    assert (await handle.describe()).run_id != first_run
    with pytest.raises(VersionConflict):  # the new run knows the version too
        await records.put(created.id, ws, {"n": -1}, expected_version=puts)
    versions = await records.versions(created.id, ws)
    assert [view.body["n"] for view in versions] == list(range(puts + 1))
    assert (await records.get(created.id, ws, version=1)).body == {"n": 0}
    current = await records.get(created.id, ws)
    assert (current.version, current.created_at) == (puts + 1, created.created_at)
    listed = await listed_eventually(lambda: records.list("agent", ws), lambda page: len(page) >= 1)
    assert [view.id for view in listed] == [created.id]  # one item, whichever runs visibility still shows
    # Bounded by the record's creation time, not by its current run's start (later, after the continue-as-new).
    bounded, _ = await records.list("agent", ws, created_at_gte=created.created_at, created_at_lte=created.created_at)
    assert [view.id for view in bounded] == [created.id]


# ---- API keys -------------------------------------------------------------------------------------------------


async def test_an_api_key_opens_its_workspace_until_revoked(records: Records, stack: Stack) -> None:
    ws = workspace()
    key, view = await create_key(records, ws, name="ci")
    assert key.startswith(f"{KEY_PREFIX}{view.id}-") and view.kind == API_KEY_KIND
    secret = key.removeprefix(f"{KEY_PREFIX}{view.id}-")
    assert view.body["name"] == "ci" and view.body["prefix"] == secret[:8] and view.body["revoked_at"] is None
    assert secret not in str(view.body)
    assert await verify_key(records, key) == ws

    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert await verify_key(records, wrong) is None
    other_key, other = await create_key(records, ws)
    other_secret = other_key.removeprefix(f"{KEY_PREFIX}{other.id}-")
    assert await verify_key(records, f"{KEY_PREFIX}{view.id}-{other_secret}") is None  # another key's secret
    for malformed in (
        "",
        "sk-ant-api03-abc",
        KEY_PREFIX,
        f"{KEY_PREFIX}{view.id}",
        f"{KEY_PREFIX}{view.id}-",
        f"{KEY_PREFIX}agent_{view.id[7:]}-{secret}",
        f"{KEY_PREFIX}../{view.id}-{secret}",
        key + "é",
        key + "x" * 300,
        None,
        42,
    ):
        assert await verify_key(records, malformed) is None  # type: ignore[arg-type]

    history = await history_text(stack.client.get_workflow_handle(view.id))
    assert view.body["sha256"] in history  # the scan reads the record's payloads...
    assert secret not in history and key not in history  # ...and neither the key nor its secret is there

    await listed_eventually(lambda: records.list(API_KEY_KIND, ws), lambda page: len(page) == 2)
    assert {listed.id for listed in await list_keys(records, ws)} == {view.id, other.id}
    revoked = await revoke_key(records, view.id)
    assert revoked.body["revoked_at"] is not None and revoked.version == 2
    assert (await revoke_key(records, view.id)).version == 2  # revoking again changes nothing
    assert await verify_key(records, key) is None
    assert await verify_key(records, other_key) == ws  # the other key still works
    assert key not in await history_text(stack.client.get_workflow_handle(view.id))
    with pytest.raises(RecordNotFound):
        await revoke_key(records, "apikey_nothing")
    agent = await records.create("agent", ws, AGENT, "agent")
    with pytest.raises(RecordNotFound):  # not a key
        await revoke_key(records, agent.id)


async def test_the_cli_prints_only_the_key_when_captured(stack: Stack) -> None:
    """`corral api-key create|ls|revoke`, in-process, against the public harness queue (which the CLI uses),
    served here for this test only."""
    ws = workspace()
    address = stack.client.service_client.config.target_host
    runner = CliRunner()

    def corral(*args: str) -> Any:
        return runner.invoke(app, ["--address", address, "--namespace", stack.client.namespace, *args])

    records = Records(stack.client)  # the default queue, as the CLI's
    async with harness_worker(stack.client, HARNESS_TASK_QUEUE):
        result = await asyncio.to_thread(corral, "api-key", "create", "--workspace", ws, "--name", "from-cli")
        assert result.exit_code == 0, result.output
        key = result.stdout.removesuffix("\n")
        assert result.stdout == key + "\n" and key.startswith(KEY_PREFIX) and "\n" not in key
        assert await verify_key(records, key) == ws
        key_id = key.removeprefix(KEY_PREFIX).split("-", 1)[0]
        try:
            await listed_eventually(lambda: records.list(API_KEY_KIND, ws), lambda page: len(page) == 1)
            listing = await asyncio.to_thread(corral, "api-key", "ls", "--workspace", ws)
            assert listing.exit_code == 0, listing.output
            assert key_id in listing.stdout and "from-cli" in listing.stdout
            assert key.removeprefix(f"{KEY_PREFIX}{key_id}-") not in listing.stdout  # never the secret
            revoked = await asyncio.to_thread(corral, "api-key", "revoke", key_id)
            assert revoked.exit_code == 0, revoked.output
            assert await verify_key(records, key) is None
            missing = await asyncio.to_thread(corral, "api-key", "revoke", "apikey_nothing")
            assert missing.exit_code == 1 and "no API key apikey_nothing" in missing.output
            bad = await asyncio.to_thread(corral, "api-key", "create", "--workspace", "Not Valid")
            assert bad.exit_code == 2 and "not a workspace name" in bad.output
        finally:
            await records.delete(key_id, ws)  # nothing of this test stays on the public queue
