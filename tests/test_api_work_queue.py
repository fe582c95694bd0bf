"""A self-hosted environment's work queue over the API, driven by the official `anthropic` SDK's own calls
(`client.beta.environments.work.*`) against a real gateway process on the real Temporal dev server: the long poll
and its JSON `null`, delivery with a session token in `secret`, ack, the heartbeat lease (claim, echo, the 412 the
SDK raises as `BetaHeartbeatPreconditionFailedError` with the lease's `current_state`), stop and its 409 that the
SDK does not retry, redelivery of an item nobody acknowledged, list, retrieve, update and stats in the SDK's own
types, who may call what, and every bad value refused with a 400 naming it and nothing written.

Items are made as a session makes them, by its request for hands (`WorkQueues.request`), and once by a session's
first built-in call; the session side is tested in test_work_queue.py, the official worker end to end on its own.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.environments import (
    BetaHeartbeatPreconditionFailedError,
    BetaSelfHostedWork,
    BetaSelfHostedWorkHeartbeatResponse,
    BetaSelfHostedWorkQueueStats,
)

from corral.contract.work import NO_HEARTBEAT, SESSION_TOKEN_PREFIX, WorkItem, WorkRequest
from corral.names import ENV_WORK_LEASE_SECONDS
from corral.work_queue import WorkQueues
from tests.conftest import Stack
from tests.test_api_workflow_runs import corral
from tests.test_gateway import Gateway, running_gateway
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

Client = anthropic.AsyncAnthropic
LEASE_SECONDS = 40
"""The gateway's lease in these tests: long enough that no lease lapses while a test runs."""


@dataclass
class Queue:
    """A self-hosted environment of a workspace of its own, its environment key, and the clients that call it."""

    gateway: Gateway
    stack: Stack
    queues: WorkQueues
    workspace: str
    environment_id: str
    api: Client
    """An API key of the workspace."""
    worker: Client
    """The environment's key, as the SDK's worker holds it."""

    def client(self, token: str, max_retries: int = 0) -> Client:
        """A client with `token` as its bearer credential, as the SDK's worker uses a session token."""
        client = Client(base_url=self.gateway.url, api_key=token, max_retries=max_retries)
        self.gateway.clients.append(client)
        return client

    async def request_hands(self) -> str:
        """What a session's first built-in call does: ask the queue for hands. Returns the session's id once its item
        is queued."""
        session_id = f"sesn_{uuid.uuid4().hex[:26]}"
        await self.queues.request(self.environment_id, WorkRequest(session_id=session_id, workspace=self.workspace))

        async def queued() -> bool:
            return any(item.session_id == session_id for item in await self.items())

        await until(queued, f"a work item for {session_id}")
        return session_id

    async def items(self) -> list[WorkItem]:
        return await self.queues.items(self.environment_id)

    async def poll(self, worker_id: str = "worker-a", **query: Any) -> BetaSelfHostedWork | None:
        return await self.worker.beta.environments.work.poll(self.environment_id, anthropic_worker_id=worker_id,
                                                             **query)  # fmt: skip

    async def poll_until_delivered(self, worker_id: str = "worker-a", **query: Any) -> BetaSelfHostedWork:
        found: list[BetaSelfHostedWork] = []

        async def delivered() -> bool:
            work = await self.poll(worker_id, block_ms=999, **query)
            found[:] = [work] if work is not None else []
            return bool(found)

        await until(delivered, f"a poll of {worker_id} delivered an item")
        return found[0]


def token_of(work: BetaSelfHostedWork) -> str:
    """The session token in a delivery's `secret`, read as the SDK reads it (URL-safe base64 of JSON)."""
    assert work.secret is not None, "a poll's delivery carries its secret"
    payload = json.loads(base64.urlsafe_b64decode(work.secret + "=" * (-len(work.secret) % 4)))
    token = payload["sessions_token"]
    assert isinstance(token, str) and token.startswith(f"{SESSION_TOKEN_PREFIX}{work.environment_id}-{work.id}-")
    return token


async def environment_key(client: Client, environment_id: str) -> str:
    """A new key of the environment, from corral's keys route (the SDK has none: upstream issues them in Console)."""
    made = await client.post(f"/v1/environments/{environment_id}/keys", body={"name": "laptop"},
                             cast_to=dict[str, Any])  # fmt: skip
    key = made["key"]
    assert isinstance(key, str)
    return key


@pytest.fixture
async def queue(stack: Stack, tmp_path: Path) -> AsyncIterator[Queue]:
    async with running_gateway(stack, tmp_path, **{ENV_WORK_LEASE_SECONDS: str(LEASE_SECONDS)}) as gateway:
        api = await gateway.client("hands")
        workspace = f"hands-{gateway.suffix}"
        environment = await api.beta.environments.create(name="my laptop", config={"type": "self_hosted"})
        worker = Client(base_url=gateway.url, api_key=await environment_key(api, environment.id), max_retries=0)
        gateway.clients.append(worker)
        queues = WorkQueues(stack.client, stack.harness_queue)
        yield Queue(gateway, stack, queues, workspace, environment.id, api, worker)


async def test_an_item_is_delivered_acknowledged_claimed_heartbeated_and_stopped(queue: Queue) -> None:
    work_api = queue.worker.beta.environments.work

    # An empty poll is held open for about block_ms, then answers 200 with JSON null (a 204 breaks the SDK).
    started = time.monotonic()
    raw = await work_api.with_raw_response.poll(queue.environment_id, block_ms=400, anthropic_worker_id="worker-a")
    held = time.monotonic() - started
    assert (raw.status_code, raw.http_response.text, await raw.parse()) == (200, "null", None)
    assert held >= 0.35, f"an empty poll with block_ms=400 answered after {held:.2f} s"
    assert await queue.poll() is None, "a poll without block_ms does not wait, and is empty too"

    session_id = await queue.request_hands()
    work = await queue.poll_until_delivered()
    assert (work.type, work.state, work.data.type, work.data.id) == ("work", "queued", "session", session_id)
    assert work.environment_id == queue.environment_id and work.metadata == {}
    token = token_of(work)
    assert await queue.poll(block_ms=200) is None, "a delivered item is not delivered again at once"

    acked = await work_api.ack(work.id, environment_id=queue.environment_id)
    assert (acked.state, acked.secret) == ("starting", None) and acked.acknowledged_at is not None
    with pytest.raises(anthropic.ConflictError):
        await work_api.ack(work.id, environment_id=queue.environment_id)

    # The session token claims the lease with NO_HEARTBEAT, then each heartbeat echoes the last one's token.
    item_api = queue.client(token).beta.environments.work
    claimed = await item_api.heartbeat(work.id, environment_id=queue.environment_id,
                                       expected_last_heartbeat=NO_HEARTBEAT)  # fmt: skip
    assert isinstance(claimed, BetaSelfHostedWorkHeartbeatResponse)
    assert (claimed.type, claimed.lease_extended, claimed.state, claimed.ttl_seconds) == (
        "work_heartbeat", True, "active", LEASE_SECONDS)  # fmt: skip
    assert claimed.last_heartbeat
    extended = await item_api.heartbeat(work.id, environment_id=queue.environment_id,
                                        expected_last_heartbeat=claimed.last_heartbeat)  # fmt: skip
    assert extended.lease_extended and extended.last_heartbeat != claimed.last_heartbeat

    # A stale heartbeat (or a second claim) is the 412 the SDK raises as BetaHeartbeatPreconditionFailedError.
    for stale in (claimed.last_heartbeat, NO_HEARTBEAT):
        with pytest.raises(BetaHeartbeatPreconditionFailedError) as lost:
            await item_api.heartbeat(work.id, environment_id=queue.environment_id, expected_last_heartbeat=stale)
        current = lost.value.details.current_state
        assert (current.state, current.last_heartbeat, current.lease_extended, current.ttl_seconds) == (
            "active", extended.last_heartbeat, False, LEASE_SECONDS)  # fmt: skip
        assert lost.value.response.headers["x-should-retry"] == "false"

    # A desired TTL is held within the queue's bounds.
    longest = await item_api.heartbeat(work.id, environment_id=queue.environment_id, desired_ttl_seconds=99_999,
                                       expected_last_heartbeat=extended.last_heartbeat)  # fmt: skip
    assert longest.ttl_seconds == 3600
    started_item = await queue.api.beta.environments.work.retrieve(work.id, environment_id=queue.environment_id)
    assert started_item.state == "active" and started_item.started_at and started_item.latest_heartbeat_at

    # A session token opens its own item only, and heartbeats and stops it only.
    await queue.request_hands()
    other = await queue.poll_until_delivered()
    assert other.id != work.id
    with pytest.raises(anthropic.NotFoundError):  # as for no such item: a token never learns what else exists
        await item_api.heartbeat(other.id, environment_id=queue.environment_id, expected_last_heartbeat=NO_HEARTBEAT)
    with pytest.raises(anthropic.PermissionDeniedError):
        await item_api.poll(queue.environment_id)

    # Stop: gracefully first (the next heartbeat tells the worker to end), then for good; again is a 409 that the
    # SDK does not retry, and the token opens nothing once its item stopped.
    stopping = await item_api.stop(work.id, environment_id=queue.environment_id)
    assert stopping.state == "stopping" and stopping.stop_requested_at is not None
    told = await item_api.heartbeat(work.id, environment_id=queue.environment_id, expected_last_heartbeat="stale")
    assert (told.lease_extended, told.state) == (False, "stopping")
    stopped = await item_api.stop(work.id, environment_id=queue.environment_id, force=True)
    assert stopped.state == "stopped" and stopped.stopped_at is not None
    with pytest.raises(anthropic.AuthenticationError):
        await item_api.stop(work.id, environment_id=queue.environment_id, force=True)
    retrying = queue.client(queue.worker.api_key or "", max_retries=3).beta.environments.work
    with pytest.raises(anthropic.ConflictError) as again:
        await retrying.stop(work.id, environment_id=queue.environment_id, force=False)
    assert again.value.response.headers["x-should-retry"] == "false"
    assert again.value.response.request.headers["x-stainless-retry-count"] == "0", "the SDK retried the 409"


async def test_an_item_nobody_acknowledged_is_delivered_again_with_a_new_token(queue: Queue) -> None:
    await queue.request_hands()
    first = await queue.poll_until_delivered("worker-a")
    assert await queue.poll("worker-b", block_ms=100, reclaim_older_than_ms=60_000) is None

    second = await queue.poll_until_delivered("worker-b", reclaim_older_than_ms=300)
    assert second.id == first.id and token_of(second) != token_of(first)
    [item] = [item for item in await queue.items() if item.id == first.id]
    assert (item.deliveries, item.delivered_to) == (2, "worker-b")

    # Only the latest delivery's token opens the item.
    with pytest.raises(anthropic.AuthenticationError):
        await queue.client(token_of(first)).beta.environments.work.heartbeat(
            first.id, environment_id=queue.environment_id, expected_last_heartbeat=NO_HEARTBEAT)  # fmt: skip
    claimed = await queue.client(token_of(second)).beta.environments.work.heartbeat(
        second.id, environment_id=queue.environment_id, expected_last_heartbeat=NO_HEARTBEAT)  # fmt: skip
    assert claimed.lease_extended and claimed.state == "active"


async def test_list_retrieve_update_and_stats_in_the_sdks_types(queue: Queue) -> None:
    sessions = [await queue.request_hands() for _ in range(3)]
    work_api, admin = queue.worker.beta.environments.work, queue.api.beta.environments.work

    stats = await admin.stats(queue.environment_id)
    assert isinstance(stats, BetaSelfHostedWorkQueueStats)
    assert (stats.type, stats.depth, stats.pending, stats.workers_polling) == ("work_queue_stats", 3, 0, 0)
    assert stats.oldest_queued_at is not None

    # Listing pages through every item, newest first.
    first_page = await work_api.list(queue.environment_id, limit=2)
    assert len(first_page.data) == 2 and first_page.next_page is not None
    listed = [work async for work in work_api.list(queue.environment_id, limit=2)]
    assert all(isinstance(work, BetaSelfHostedWork) and work.secret is None for work in listed)
    assert [work.data.id for work in listed] == sessions[::-1]

    delivered = await queue.poll_until_delivered("worker-a")
    await work_api.ack(delivered.id, environment_id=queue.environment_id)
    await queue.poll_until_delivered("worker-a")  # polled, not acknowledged: what `pending` counts

    async def counted() -> bool:
        seen = await work_api.stats(queue.environment_id)  # the environment key reads stats too
        return (seen.depth, seen.pending, seen.workers_polling) == (1, 1, 1)

    await until(counted, "stats count 1 waiting, 1 polled and not acknowledged, and the one worker that polled")

    # `corral environment work ENV` shows the same, and every item with its session and state.
    shown = await corral(queue.stack, "environment", "work", queue.environment_id, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["depth"], view["pending"], view["workers_polling"]) == (1, 1, 1)
    assert [(item["session_id"], item["state"]) for item in view["items"]] == [
        (session, "starting" if session == delivered.data.id else "queued") for session in sessions[::-1]
    ]
    assert all("token_sha256" not in item and "last_heartbeat" not in item for item in view["items"])
    table = await corral(queue.stack, "environment", "work", queue.environment_id)
    assert table.returncode == 0 and "depth 1, pending 1, workers polling 1" in table.stdout, table
    assert all(work.id in table.stdout for work in listed), table.stdout
    cloud = await queue.api.beta.environments.create(name="a cloud one")
    not_hosted = await corral(queue.stack, "environment", "work", cloud.id)
    assert not_hosted.returncode == 1 and "only a self_hosted one has a work queue" in not_hosted.stderr, not_hosted

    # Retrieve and update take an API key; metadata merges, and null deletes a key.
    work_id = listed[0].id
    item = await admin.retrieve(work_id, environment_id=queue.environment_id)
    assert isinstance(item, BetaSelfHostedWork) and item.id == work_id and item.secret is None
    updated = await admin.update(work_id, environment_id=queue.environment_id, metadata={"host": "laptop", "a": "1"})
    assert updated.metadata == {"host": "laptop", "a": "1"}
    updated = await admin.update(work_id, environment_id=queue.environment_id, metadata={"a": None, "b": "2"})
    assert updated.metadata == {"host": "laptop", "b": "2"}
    assert (await admin.retrieve(work_id, environment_id=queue.environment_id)).metadata == updated.metadata
    with pytest.raises(anthropic.BadRequestError, match="metadata"):
        await admin.update(work_id, environment_id=queue.environment_id,
                           metadata={f"k{n}": "v" for n in range(17)})  # fmt: skip

    # Who may call what: the environment key polls, acknowledges and lists; an API key reads and updates.
    for refused in (
        admin.list(queue.environment_id),
        admin.poll(queue.environment_id),
        admin.ack(work_id, environment_id=queue.environment_id),
        work_api.retrieve(work_id, environment_id=queue.environment_id),
        work_api.update(work_id, environment_id=queue.environment_id, metadata={"x": "y"}),
    ):
        with pytest.raises(anthropic.PermissionDeniedError):
            await refused
    assert (await admin.retrieve(work_id, environment_id=queue.environment_id)).metadata == updated.metadata


async def test_bad_values_are_400_naming_them_and_change_nothing(queue: Queue) -> None:
    await queue.request_hands()
    work = await queue.poll_until_delivered()
    before = await queue.items()
    env, work_api = queue.environment_id, queue.worker.beta.environments.work
    item_api = queue.client(token_of(work)).beta.environments.work
    cloud = await queue.api.beta.environments.create(name="a cloud one")
    refused: list[tuple[Any, str]] = [
        (work_api.poll(env, block_ms=0), "block_ms"),
        (work_api.poll(env, block_ms=1000), "block_ms"),
        (work_api.poll(env, extra_query={"block_ms": "soon"}), "block_ms"),
        (work_api.poll(env, reclaim_older_than_ms=-1), "reclaim_older_than_ms"),
        (work_api.poll(env, anthropic_worker_id="x" * 300), "Anthropic-Worker-ID"),
        (item_api.heartbeat(work.id, environment_id=env), "expected_last_heartbeat"),
        (
            item_api.heartbeat(
                work.id,
                environment_id=env,
                expected_last_heartbeat=NO_HEARTBEAT,
                extra_query={"desired_ttl_seconds": "long"},
            ),
            "desired_ttl_seconds",
        ),
        (item_api.stop(work.id, environment_id=env, extra_body={"force": "yes"}), "force"),
        (item_api.stop(work.id, environment_id=env, extra_body={"graceful": True}), "graceful"),
        (work_api.ack(queue.environment_id.replace("env_", "sesn_"), environment_id=env), "work_id"),
        (work_api.ack(work.id, environment_id=work.data.id), "environment_id"),
        (queue.api.beta.environments.work.stats(cloud.id), "environment_id"),
        (
            queue.api.beta.environments.work.update(work.id, environment_id=env, metadata={"a": 1}),  # type: ignore[dict-item]
            "metadata.a",
        ),
    ]
    for call, field in refused:
        with pytest.raises(anthropic.BadRequestError) as bad:
            await call
        assert field in str(bad.value.api_message), f"{field}: {bad.value.api_message}"
    with pytest.raises(anthropic.NotFoundError):
        await work_api.ack("work_" + "0" * 28, environment_id=env)
    assert await queue.items() == before, "a refused request changed the queue"


async def test_a_sessions_first_built_in_call_queues_the_item_a_poll_delivers(queue: Queue) -> None:
    model = queue.stack.script([{"tool_uses": [{"name": "bash", "input": {"command": "hostname"}}]}, {"text": "ok"}])
    agent = await queue.api.beta.agents.create(name="ops", model=model, tools=[{"type": "agent_toolset_20260401"}])
    hello = [{"type": "user.message", "content": [{"type": "text", "text": "where do you run?"}]}]
    session = await queue.api.beta.sessions.create(agent=agent.id, environment_id=queue.environment_id,
                                                   initial_events=hello)  # type: ignore[arg-type]  # fmt: skip
    work = await queue.poll_until_delivered()
    assert (work.data.type, work.data.id, work.state) == ("session", session.id, "queued")
    assert token_of(work)
    stats = await queue.api.beta.environments.work.stats(queue.environment_id)
    assert (stats.depth, stats.pending, stats.workers_polling) == (0, 1, 1)  # delivered, not yet acknowledged
    stopped = await queue.worker.beta.environments.work.stop(work.id, environment_id=queue.environment_id, force=True)
    assert stopped.state == "stopped"


async def status_of(call: Any) -> int:
    """The status a request got (200 when it succeeded)."""
    try:
        await call
    except anthropic.APIStatusError as exc:
        return exc.status_code
    return 200


async def test_every_credential_against_every_work_route(queue: Queue) -> None:
    """The API key, the environment's key, another environment's key (of the same workspace), the item's session
    token, and a key that opens nothing, each against each work route: 200 (or the route's own refusal of the
    item's state) where it may call it, 403 where the route is not for it, 404 for an environment or item out of
    its reach, 401 when it opens nothing."""
    other = await queue.api.beta.environments.create(name="another laptop", config={"type": "self_hosted"})
    await queue.request_hands()
    work = await queue.poll_until_delivered()
    token = token_of(work)
    claimed = await queue.client(token).beta.environments.work.heartbeat(
        work.id, environment_id=queue.environment_id, expected_last_heartbeat=NO_HEARTBEAT)  # fmt: skip
    assert claimed.state == "active"
    keys = {"api key": queue.api.api_key or "", "environment key": queue.worker.api_key or "",
            "another environment's key": await environment_key(queue.api, other.id), "session token": token,
            "nothing": "sk-corral-apikey_0000000000-nothing"}  # fmt: skip
    env, wid = queue.environment_id, work.id
    routes: list[tuple[str, Any, tuple[int, int, int, int]]] = [  # api key, env key, another env's key, token
        ("poll", lambda w: w.poll(env), (403, 200, 404, 403)),
        ("stats", lambda w: w.stats(env), (200, 200, 404, 403)),
        ("list", lambda w: w.list(env), (403, 200, 404, 403)),
        ("retrieve", lambda w: w.retrieve(wid, environment_id=env), (200, 403, 403, 403)),
        ("update", lambda w: w.update(wid, environment_id=env, metadata={"k": "v"}), (200, 403, 403, 403)),
        ("ack", lambda w: w.ack(wid, environment_id=env), (403, 409, 404, 403)),  # active: not waiting for an ack
        ("heartbeat", lambda w: w.heartbeat(wid, environment_id=env, expected_last_heartbeat="stale"),
         (403, 412, 404, 412)),
        ("stop", lambda w: w.stop(wid, environment_id=env), (403, 200, 404, 200)),  # to stopping, twice
    ]  # fmt: skip
    wrong = []
    for name, call, answers in routes:
        for (holder, key), expected in zip(keys.items(), (*answers, 401), strict=True):
            status = await status_of(call(queue.client(key).beta.environments.work))
            if status != expected:
                wrong.append(f"{name} with the {holder}: {status}, not {expected}")
    assert wrong == [], "\n".join(wrong)
