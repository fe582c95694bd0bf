"""Every credential against every route a self-hosted worker could reach, driven by the official `anthropic` SDK
(as the SDK's worker does: `Authorization: Bearer`) against a real gateway process on the real Temporal dev server.

One workspace has two self-hosted environments, A and B; sessions S and T in A and U in B; an environment key of
each environment, a revoked key of A, a session token of S's work item and one of T's, a token of an item that
stopped, a forged key and garbage. For each route (one `Row`: adding a route is one line): the session routes a
worker reads and writes, API-key routes, and the work queue's routes, each credential gets exactly its answer: 200
where it may, 404 for a session, environment or work item out of its reach (as another workspace's), 403 with
what it may call where the route is not for it, and 401 for a credential that opens nothing.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pytest

from corral.contract.work import NO_HEARTBEAT, SESSION_TOKEN_PREFIX, ClaimWork, StopWork, WorkRequest
from corral.work_queue import WorkQueues
from tests.conftest import Stack
from tests.test_gateway import Gateway, running_gateway
from tests.test_gateway_isolation import outcome
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

SELF_HOSTED = {"type": "self_hosted"}
JSON = dict[str, Any]
"""What a corral extension (which the SDK has no method for) answers, through the SDK's own client."""
API, ENV_A, ENV_B, TOKEN_S, TOKEN_T = "API key", "env key of A", "env key of B", "token of S", "token of T"
REVOKED, STOPPED, FORGED, GARBAGE = "revoked env key of A", "token of a stopped item", "forged env key", "garbage"
VALID = (API, ENV_A, ENV_B, TOKEN_S, TOKEN_T)
INVALID = (REVOKED, STOPPED, FORGED, GARBAGE)


@dataclass(frozen=True)
class World:
    a: str
    b: str
    s: str
    t: str
    u: str
    agent: str
    s_work: str
    """S's work item (token S's)."""
    queues: WorkQueues
    store: str
    """A memory store attached to S (and to no other session)."""
    other_store: str
    """A memory store of the workspace attached to no session."""
    skill: str
    skill_version: str
    """A skill S's agent uses (T's and U's agent uses none)."""

    async def heartbeat(self, client: anthropic.AsyncAnthropic) -> Any:
        """A heartbeat of S's item that echoes its lease's current token: only the credential decides the answer."""
        item = await self.queues.item(self.a, self.s_work)
        expected = item.last_heartbeat if item is not None and item.last_heartbeat else NO_HEARTBEAT
        return await client.beta.environments.work.heartbeat(self.s_work, environment_id=self.a,
                                                             expected_last_heartbeat=expected)  # fmt: skip


Call = Callable[[anthropic.AsyncAnthropic, World], Awaitable[Any]]


@dataclass(frozen=True)
class Row:
    route: str
    call: Call
    answers: dict[str, int]
    """Each valid credential's status; an invalid one always gets 401."""


def session_route(session: str) -> dict[str, int]:
    """A session route a worker reads and writes: S is A's and token S's; U is B's and no token's."""
    if session == "s":
        return {API: 200, ENV_A: 200, ENV_B: 404, TOKEN_S: 200, TOKEN_T: 404}
    return {API: 200, ENV_A: 404, ENV_B: 200, TOKEN_S: 404, TOKEN_T: 404}


API_ONLY = {API: 200, ENV_A: 403, ENV_B: 403, TOKEN_S: 403, TOKEN_T: 403}
ENV_KEY_ONLY = {API: 403, ENV_A: 200, ENV_B: 404, TOKEN_S: 403, TOKEN_T: 403}
"""A work route of environment A that only its worker's key calls (B's key reaches no environment A)."""
S_ITEM = {API: 403, ENV_A: 200, ENV_B: 404, TOKEN_S: 200, TOKEN_T: 404}
"""S's work item, which its token and A's key reach (T's token reaches T's item only)."""
SYNCED = {API: 200, ENV_A: 403, ENV_B: 403, TOKEN_S: 200, TOKEN_T: 404}
"""What S's worker syncs with S's token (a store attached to S, a skill S's agent uses): T's token reaches none."""
NOT_ATTACHED = {**SYNCED, TOKEN_S: 404}
SKILL_MD = b"---\nname: notes\ndescription: Takes notes.\n---\n"
HELLO: list[Any] = [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]


def rows() -> list[Row]:
    return [
        Row("GET /v1/sessions/{S}", lambda c, w: c.beta.sessions.retrieve(w.s), session_route("s")),
        Row("GET /v1/sessions/{S}/events", lambda c, w: c.beta.sessions.events.list(w.s), session_route("s")),
        Row("GET /v1/sessions/{S}/events/stream", lambda c, w: c.beta.sessions.events.stream(w.s),
            session_route("s")),
        Row("POST /v1/sessions/{S}/events", lambda c, w: c.beta.sessions.events.send(w.s, events=HELLO),
            session_route("s")),
        Row("GET /v1/sessions/{U}", lambda c, w: c.beta.sessions.retrieve(w.u), session_route("u")),
        Row("GET /v1/sessions/{U}/events", lambda c, w: c.beta.sessions.events.list(w.u), session_route("u")),
        Row("POST /v1/sessions/{S} (update)", lambda c, w: c.beta.sessions.update(w.s, title="x"), API_ONLY),
        Row("GET /v1/sessions/{S}/threads", lambda c, w: c.beta.sessions.threads.list(w.s), API_ONLY),
        Row("GET /v1/sessions", lambda c, w: c.beta.sessions.list(), API_ONLY),
        Row("GET /v1/vaults", lambda c, w: c.beta.vaults.list(), API_ONLY),
        Row("GET /v1/agents", lambda c, w: c.beta.agents.list(), API_ONLY),
        Row("GET /v1/agents/{id}", lambda c, w: c.beta.agents.retrieve(w.agent), API_ONLY),
        Row("GET /v1/environments/{A}", lambda c, w: c.beta.environments.retrieve(w.a), API_ONLY),
        Row("GET /v1/environments/{A}/keys", lambda c, w: c.get(f"/v1/environments/{w.a}/keys", cast_to=JSON),
            API_ONLY),
        Row("POST /v1/environments/{A}/keys", lambda c, w: c.post(f"/v1/environments/{w.a}/keys", cast_to=JSON),
            API_ONLY),
        # The work queue's routes (gateway/work.py). They change S's item, in this order: acknowledged by A's
        # key, claimed and extended by heartbeats, and last asked to stop (force=False: its token stays valid).
        Row("GET environment A's work queue stats", lambda c, w: c.beta.environments.work.stats(w.a),
            {**ENV_KEY_ONLY, API: 200}),
        Row("GET environment A's work queue (list)", lambda c, w: c.beta.environments.work.list(w.a), ENV_KEY_ONLY),
        Row("GET environment B's work queue poll", lambda c, w: c.beta.environments.work.poll(w.b, block_ms=1),
            {**ENV_KEY_ONLY, ENV_A: 404, ENV_B: 200}),
        Row("GET environment A's work item of S", lambda c, w: c.beta.environments.work.retrieve(
            w.s_work, environment_id=w.a), API_ONLY),
        Row("POST environment A's work item of S (metadata)", lambda c, w: c.beta.environments.work.update(
            w.s_work, environment_id=w.a, metadata={"seen": "yes"}), API_ONLY),
        Row("POST environment A's work item of S: ack", lambda c, w: c.beta.environments.work.ack(
            w.s_work, environment_id=w.a), ENV_KEY_ONLY),
        Row("POST environment A's work item of S: heartbeat", lambda c, w: w.heartbeat(c), S_ITEM),
        # What a worker syncs for its session (gateway/work_auth.py `for_attached`): memories, skill versions.
        Row("GET the memories of S's store", lambda c, w: c.beta.memory_stores.memories.list(w.store), SYNCED),
        Row("POST a memory to S's store", lambda c, w: c.beta.memory_stores.memories.create(
            w.store, path=f"/{secrets.token_hex(4)}.md", content="noted"), SYNCED),
        Row("GET the memories of a store of no session",
            lambda c, w: c.beta.memory_stores.memories.list(w.other_store), NOT_ATTACHED),
        Row("GET the version of S's agent's skill", lambda c, w: c.beta.skills.versions.retrieve(
            w.skill_version, skill_id=w.skill), SYNCED),
        Row("GET the content of S's agent's skill", lambda c, w: c.beta.skills.versions.download(
            w.skill_version, skill_id=w.skill), SYNCED),
        Row("GET /v1/memory_stores/{store}", lambda c, w: c.beta.memory_stores.retrieve(w.store), API_ONLY),
        Row("GET /v1/skills/{skill}", lambda c, w: c.beta.skills.retrieve(w.skill), API_ONLY),
        Row("POST environment A's work item of S: stop", lambda c, w: c.beta.environments.work.stop(
            w.s_work, environment_id=w.a, force=False), S_ITEM),
    ]  # fmt: skip


async def session_token(queues: WorkQueues, environment_id: str, session_id: str, workspace: str) -> tuple[str, str]:
    """A token of a new item for the session, delivered as a poll delivers it: the gateway's work routes make it
    the same way (its digest is all the queue keeps)."""
    await queues.request(environment_id, WorkRequest(session_id=session_id, workspace=workspace))
    found: list[str] = []

    async def queued() -> bool:
        found[:] = [i.id for i in await queues.items(environment_id)
                    if i.session_id == session_id and i.state == "queued"]  # fmt: skip
        return bool(found)

    await until(queued, f"{session_id}'s item is queued")
    token = f"{SESSION_TOKEN_PREFIX}{environment_id}-{found[0]}-{secrets.token_urlsafe(32)}"
    digest = hashlib.sha256(token.encode()).hexdigest()
    item = await queues.claim(environment_id, ClaimWork(worker_id="scope-test", token_sha256=digest, work_id=found[0]))
    assert item is not None and item.id == found[0]
    return token, item.id


@pytest.fixture
async def served(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(stack, tmp_path) as gateway:
        yield gateway


async def test_each_credential_opens_exactly_its_routes(stack: Stack, served: Gateway) -> None:
    workspace = f"scopes-{served.suffix}"
    client = await served.client("scopes")
    api_key = client.api_key
    assert api_key is not None
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "ok"}], loop=True))
    a = await client.beta.environments.create(name="a", config=SELF_HOSTED)  # type: ignore[arg-type]
    b = await client.beta.environments.create(name="b", config=SELF_HOSTED)  # type: ignore[arg-type]
    skill = await client.beta.skills.create(files=[("notes/SKILL.md", SKILL_MD)])
    skilled = await client.beta.agents.create(name="noter", model=stack.script([{"text": "ok"}], loop=True),
                                              skills=[{"type": "custom", "skill_id": skill.id}])  # fmt: skip
    store = await client.beta.memory_stores.create(name="S's notes")
    other_store = await client.beta.memory_stores.create(name="nobody's")
    attached: Any = [{"type": "memory_store", "memory_store_id": store.id}]
    s = await client.beta.sessions.create(agent=skilled.id, environment_id=a.id, resources=attached)
    t = await client.beta.sessions.create(agent=agent.id, environment_id=a.id)
    u = await client.beta.sessions.create(agent=agent.id, environment_id=b.id)

    async def key_of(environment_id: str) -> dict[str, Any]:
        made: dict[str, Any] = await client.post(f"/v1/environments/{environment_id}/keys", cast_to=JSON)
        return made

    queues = WorkQueues(stack.client, task_queue=stack.harness_queue)
    revoked = await key_of(a.id)
    stopped, stopped_work = await session_token(queues, b.id, u.id, workspace)
    token_s, s_work = await session_token(queues, a.id, s.id, workspace)
    world = World(a.id, b.id, s.id, t.id, u.id, agent.id, s_work, queues, store.id, other_store.id, skill.id,
                  skill.latest_version_id or "")  # fmt: skip
    credentials = {
        API: api_key,
        ENV_A: (await key_of(a.id))["key"],
        ENV_B: (await key_of(b.id))["key"],
        TOKEN_S: token_s,
        TOKEN_T: (await session_token(queues, a.id, t.id, workspace))[0],
        REVOKED: revoked["key"],
        STOPPED: stopped,
        FORGED: f"sk-corral-{revoked['id'][:-4]}0000-{secrets.token_urlsafe(32)}",
        GARBAGE: secrets.token_urlsafe(32),
    }
    as_ = {name: anthropic.AsyncAnthropic(base_url=served.url, auth_token=credential, api_key=None, max_retries=0)
           for name, credential in credentials.items()}  # fmt: skip
    served.clients += as_.values()
    # Both credentials opened S before they stopped: this gateway forgets a key it revoked at once, and a token
    # is checked against its item on every request.
    for name in (REVOKED, STOPPED):
        target = world.s if name == REVOKED else world.u
        assert await outcome(as_[name].beta.sessions.retrieve(target)) == (200, ""), name
    await client.post(f"/v1/environments/{a.id}/keys/{revoked['id']}/revoke", cast_to=JSON)
    await queues.stop(b.id, StopWork(work_id=stopped_work, force=True))

    async def listed() -> bool:  # visibility has caught up: the API key's listing rows mean something
        return len([x async for x in client.beta.sessions.list()]) == 3

    await until(listed, "the three sessions are listed")
    wrong: list[str] = []
    for row in rows():
        for name in (*VALID, *INVALID):
            expected = row.answers[name] if name in row.answers else 401
            status, message = await outcome(row.call(as_[name], world))
            if status != expected:
                wrong.append(f"{row.route} with the {name}: {status} {message} (expected {expected})")
            elif status == 403 and not (message.startswith("permission_error: a") and " opens " in message):
                wrong.append(f"{row.route} with the {name}: a 403 that does not say what it may call: {message}")
            elif status == 404 and not message.startswith("not_found_error"):
                wrong.append(f"{row.route} with the {name}: {message}")
    assert wrong == [], "\n".join(wrong)
    # What S's token wrote is S's: its version names the session, as an agent's write in S's sandbox would.
    by_token = [v async for v in client.beta.memory_stores.memory_versions.list(store.id, session_id=s.id)]
    assert len(by_token) == 1 and by_token[0].created_by is not None
    assert by_token[0].created_by.type == "session_actor"
