"""The Managed Agents HTTP API on corral, driven by the official `anthropic` SDK against a real gateway process,
the real Temporal dev server and the offline model server: agents with versions, an environment, a session, its
events sent, streamed and listed, workspaces kept apart, and bad requests refused with nothing written."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from corral.apikeys import create_key, revoke_key
from corral.contract.session import MAX_MESSAGE_BYTES
from corral.hand_registry import OPERATOR_WORKSPACE, hand_record_id, register_hand
from corral.records import Records
from gateway.http import MAX_BODY_BYTES
from tests.chaos._processes import RoleProcess, role_process, until_healthy
from tests.conftest import Stack
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)


class Gateway:
    def __init__(self, url: str, process: RoleProcess, records: Records) -> None:
        self.url, self.process, self.records = url, process, records
        self.suffix = uuid.uuid4().hex[:8]
        self.clients: list[anthropic.AsyncAnthropic] = []
        self.hands: set[str] = set()

    async def client(self, workspace: str) -> anthropic.AsyncAnthropic:
        """A client with a new key of `workspace`, a name of this test's own: a listing of a workspace reads each of
        its records from its workflow, and an earlier test's records ran on a harness queue that is gone now."""
        key, _ = await create_key(self.records, f"{workspace}-{self.suffix}")
        self.clients.append(anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0))
        return self.clients[-1]

    async def allow_hand(self, queue: str, *workspaces: str) -> None:
        """Register the hand `queue` for `workspaces` (names as given to `client`), as the operator does; its record
        goes when the gateway does, so no listing of a later test reads it from a harness queue that is gone."""
        await register_hand(self.records, queue, [f"{workspace}-{self.suffix}" for workspace in workspaces])
        self.hands.add(queue)


def gateway_argv(stack: Stack, port: int, *options: str) -> list[str]:
    """A gateway process serving `stack`'s Temporal server and task queues on `port`."""
    address = stack.client.service_client.config.target_host
    return [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", stack.harness_queue, "--model-queue", stack.model_queue, *options]  # fmt: skip


@contextlib.asynccontextmanager
async def running_gateway(stack: Stack, log_dir: Path, **env: str) -> AsyncIterator[Gateway]:
    """A real gateway process for `stack` (its environment plus `env`), answering, until the block ends."""
    port = free_port()
    with role_process("gateway", gateway_argv(stack, port), log_dir, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        gateway = Gateway(url, process, Records(stack.client, task_queue=stack.harness_queue))
        try:
            yield gateway
        finally:
            for client in gateway.clients:
                await client.close()
            for queue in gateway.hands:
                await gateway.records.delete(hand_record_id(queue), OPERATOR_WORKSPACE)


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(stack, tmp_path) as running:
        yield running


TOOLSET = {"type": "agent_toolset_20260401", "default_config": {"enabled": False}}


async def agent_and_environment(client: anthropic.AsyncAnthropic, model: str) -> tuple[Any, Any]:
    agent = await client.beta.agents.create(name="helper", model=model, system="be brief")
    environment = await client.beta.environments.create(name="plain")
    return agent, environment


async def until_idle(stream: Any, seen: list[Any]) -> None:
    async for event in stream:
        seen.append(event)
        if event.type == "session.status_idle":
            return


async def test_agents_are_versioned_and_a_stale_version_is_refused(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("team-a")
    agent = await client.beta.agents.create(name="helper", model="claude-sonnet-4-6", metadata={"team": "a"})
    assert (agent.version, agent.model.id, agent.type) == (1, "claude-sonnet-4-6", "agent")
    updated = await client.beta.agents.update(agent.id, version=1, system="be brief", metadata={"team": None})
    assert (updated.version, updated.system, updated.metadata) == (2, "be brief", {})
    with pytest.raises(anthropic.ConflictError, match="version 2, not 1"):
        await client.beta.agents.update(agent.id, version=1, system="lost")
    assert (await client.beta.agents.retrieve(agent.id)).system == "be brief", "the stale update wrote nothing"
    assert (await client.beta.agents.retrieve(agent.id, version=1)).system is None
    versions = [v.version async for v in client.beta.agents.versions.list(agent.id)]
    assert versions == [2, 1]
    with pytest.raises(anthropic.BadRequestError, match="agent"):
        await client.beta.agents.create(name="bad", model="m", tools=[{"type": "mcp_toolset", "mcp_server_name": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="not supported yet"):  # the SDK has no such parameter
        await client.beta.environments.list(extra_query={"created_at[gte]": "2026-01-01T00:00:00Z"})
    archived = await client.beta.agents.archive(agent.id)
    assert archived.archived_at is not None


async def test_agents_are_listed_by_creation_time_in_full_pages(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("team-a")
    made = [await client.beta.agents.create(name=f"agent-{n}", model="claude-sonnet-4-6") for n in range(4)]
    times = [agent.created_at for agent in made]
    assert times == sorted(set(times)), "each agent has a creation time of its own, in order"
    newest_first = [agent.id for agent in reversed(made)]
    for _ in range(100):  # visibility lists a record a moment after it is written
        if [a.id async for a in client.beta.agents.list()] == newest_first:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("visibility never listed the agents")

    async def listed(**bounds: Any) -> list[str]:
        return [a.id async for a in client.beta.agents.list(**bounds)]

    first, second, third, fourth = (agent.id for agent in made)
    # Bounds are inclusive, to the microsecond; a datetime and an RFC 3339 string with another offset alike.
    assert await listed(created_at_gte=times[1], created_at_lte=times[2]) == [third, second]
    assert await listed(created_at_gte=times[1] + timedelta(microseconds=1)) == [fourth, third]
    east = times[1].astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat()
    assert await listed(created_at_lte=east) == [second, first]
    assert await listed(created_at_lte=times[0] - timedelta(microseconds=1)) == []
    # Pages of one: agents out of bounds are passed over, so no page comes back empty and none skips or repeats.
    pages: list[list[str]] = []
    page = await client.beta.agents.list(created_at_lte=times[2], limit=1)
    while True:
        pages.append([a.id for a in page.data])
        if not page.has_next_page():
            break
        page = await page.get_next_page()
        assert len(pages) < 10, "the cursor never ends"
    assert pages == [[third], [second], [first]]
    assert await listed(created_at_gte=times[1], created_at_lte=times[2], limit=1) == [third, second]

    for bounds, name in (
        ({"created_at_gte": "yesterday"}, "created_at[gte]"),
        ({"created_at_lte": "2026-01-01T00:00:00"}, "created_at[lte]"),  # no offset: refused, not guessed
        ({"created_at_lte": datetime(2026, 1, 1)}, "created_at[lte]"),  # a naive datetime, likewise
        ({"created_at_gte": "2026-02-30T00:00:00Z"}, "created_at[gte]"),
    ):
        with pytest.raises(anthropic.BadRequestError, match=re.escape(name)) as refused:
            await client.beta.agents.list(**bounds)
        assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


async def test_a_session_sends_streams_and_lists_its_events_with_no_gap(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("team-a")
    model = stack.script([{"text": "first answer"}, {"text": "second answer"}])
    agent, environment = await agent_and_environment(client, model)
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, title="gateway test")
    assert (session.status, session.title, session.agent.id, session.agent.version) == (
        "idle", "gateway test", agent.id, 1
    )  # fmt: skip

    for turn, text in enumerate(["hello", "again"]):
        seen: list[Any] = []
        # The SDK's own runner's pattern: open the stream, then list; together they show every event once.
        async with await client.beta.sessions.events.stream(session.id) as stream:
            listening = asyncio.create_task(until_idle(stream, seen))  # open: it holds what is written from now
            sent = await client.beta.sessions.events.send(
                session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
            )
            assert [e.type for e in sent.data or []] == ["user.message"]
            await asyncio.wait_for(listening, 60)
        streamed = [e.type for e in seen]
        assert streamed[0] == "user.message" and streamed[-1] == "session.status_idle", streamed
        assert "agent.message" in streamed
        listed = [e async for e in client.beta.sessions.events.list(session.id, limit=3)]  # pages of 3
        ids = [e.id for e in listed]
        assert len(ids) == len(set(ids)), "a page repeated an event"
        assert [e.id for e in seen] == ids[-len(seen) :], "the stream showed exactly the newest events, in order"
        messages = [e.model_dump() for e in listed if e.type == "agent.message"]
        assert [m["content"][0]["text"] for m in messages] == ["first answer", "second answer"][: turn + 1]

    newest = [e async for e in client.beta.sessions.events.list(session.id, order="desc", limit=2)]
    assert [e.type for e in newest][:1] == ["session.status_idle"]
    only = [e async for e in client.beta.sessions.events.list(session.id, types=["user.message"])]
    assert len(only) == 2
    retrieved = await client.beta.sessions.retrieve(session.id)
    assert retrieved.status == "idle" and (retrieved.usage.output_tokens or 0) > 0
    listed_sessions = [s.id async for s in client.beta.sessions.list()]
    assert session.id in listed_sessions


async def test_a_bad_batch_writes_nothing_and_bad_requests_say_why(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("team-a")
    agent, environment = await agent_and_environment(client, stack.script([{"text": "ok"}]))
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    before = [e.id async for e in client.beta.sessions.events.list(session.id)]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.beta.sessions.events.send(
            session.id,
            events=[{"type": "user.message", "content": [{"type": "text", "text": "fine"}]},
                    {"type": "user.tool_confirmation", "tool_use_id": "nope", "result": "allow"}],
        )  # fmt: skip
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    after = [e.id async for e in client.beta.sessions.events.list(session.id)]
    assert after == before, "half of a refused batch was written"
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.sessions.create(agent="agent_nosuchagent", environment_id=environment.id)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.beta.sessions.create(agent=agent.id, environment_id="env_missing")
    assert "environment" in str(missing.value)
    with pytest.raises(anthropic.BadRequestError, match="unknown session field"):
        await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, extra_body={"colour": 1})
    with pytest.raises(anthropic.BadRequestError, match="apt and pip"):
        await client.beta.environments.create(name="rusty", config={"type": "cloud", "packages": {"cargo": ["x"]}})


async def test_workspaces_see_nothing_of_each_other_and_a_bad_key_is_401(stack: Stack, gateway: Gateway) -> None:
    first, second = await gateway.client("team-a"), await gateway.client("team-b")
    agent, environment = await agent_and_environment(first, stack.script([{"text": "ok"}]))
    session = await first.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    for lookup in (
        second.beta.agents.retrieve(agent.id),
        second.beta.environments.retrieve(environment.id),
        second.beta.sessions.retrieve(session.id),
        second.beta.sessions.events.list(session.id),
        second.beta.sessions.create(agent=agent.id, environment_id=environment.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            await lookup
    assert session.id not in [s.id async for s in second.beta.sessions.list()]
    assert agent.id not in [a.id async for a in second.beta.agents.list()]

    wrong = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-corral-apikey_nope-secret", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await wrong.beta.agents.list()
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    key, record = await create_key(gateway.records, f"team-c-{gateway.suffix}")
    await revoke_key(gateway.records, record.id)
    with pytest.raises(anthropic.AuthenticationError):
        await anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0).beta.agents.list()
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{gateway.url}/v1/agents")
    assert response.status_code == 401 and response.json()["type"] == "error"


async def test_a_body_over_the_limit_is_refused_as_it_arrives(stack: Stack, gateway: Gateway) -> None:
    """413 in the upstream shape, whether the body declares its length or comes in chunks; a batch of events at the
    content limit still fits."""
    client = await gateway.client("team-big")
    headers = {"x-api-key": str(client.api_key), "content-type": "application/json"}
    oversized = b'{"name": "' + b"x" * MAX_BODY_BYTES + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(oversized), 1 << 20):
            yield oversized[start : start + (1 << 20)]

    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        declared = await http.post("/v1/agents", content=oversized, headers=headers)
        streamed = await http.post("/v1/agents", content=chunks(), headers=headers)
    for response in (declared, streamed):
        assert response.status_code == 413, response.text
        assert response.json()["error"]["type"] == "request_too_large"
    assert MAX_BODY_BYTES > MAX_MESSAGE_BYTES, "a batch of events at its content limit fits in a body"
    assert [a async for a in client.beta.agents.list()] == [], "nothing was made"
