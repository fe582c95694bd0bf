"""`GET /v1/sessions/{id}` gives an accurate `status` at every point of a session's life, read with the official SDK
against a real gateway, Temporal server and workers (the SDK's tool runner reads it on every reconnect); and a
session's stream carries only JSON in its `data:` lines, read raw through a whole turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from corral.client import new_session_id, session_info
from corral.contract.session import AgentConfig, SessionInput
from corral.names import SESSION_WORKFLOW
from gateway.owned import WORKSPACE_KEY
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture
from tests.test_gateway_sessions import WEATHER, events_until_idle, new_session, result, text
from tests.test_gateway_stream import Gateways, gateways  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(600)


async def status_becomes(
    client: anthropic.AsyncAnthropic, session_id: str, wanted: str, ended: Callable[[], bool]
) -> None:
    """Read the status until it is `wanted`; fail if the moment passes (`ended()`) without it ever being so."""
    while not ended():
        if (await client.beta.sessions.retrieve(session_id)).status == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the session was never {wanted} while it should have been")


async def test_the_status_follows_the_session_through_its_life(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-status")
    model = stack.script(
        [
            {"text": "slow answer", "first_token_latency": 5.0},  # running, long enough to be seen
            # rescheduling, then running: the retry's answer is slow too, so its running lasts long enough to be read
            {"text": "after a retry", "fail": [{"status": 529, "retry_after": 8}], "first_token_latency": 5.0},
            {"tool_uses": [{"name": "weather", "input": {"city": "Oslo"}}]},  # idle, waiting on the client
            {"text": "sunny"},
        ]
    )
    session_id = await new_session(client, model, [WEATHER])
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle", "a session starts idle"

    await client.beta.sessions.events.send(session_id, events=[text("first")])
    await status_becomes(client, session_id, "running", lambda: False)
    await client.beta.sessions.events.send(session_id, events=[{"type": "user.interrupt"}])
    interrupted = await events_until_idle(client, session_id, 0)
    assert "agent.message" not in [e.type for e in interrupted], "the interrupt landed while the answer was slow"
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle", "after an interrupt"

    # The model's steps follow the answers in the conversation: the interrupted request left none, so step 0 again.
    await client.beta.sessions.events.send(session_id, events=[text("again")])
    turn = asyncio.create_task(events_until_idle(client, session_id, len(interrupted)))
    await status_becomes(client, session_id, "running", turn.done)
    first = interrupted + await turn
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle"

    await client.beta.sessions.events.send(session_id, events=[text("second")])
    turn = asyncio.create_task(events_until_idle(client, session_id, len(first)))
    await status_becomes(client, session_id, "rescheduling", turn.done)
    await status_becomes(client, session_id, "running", turn.done)  # the retry runs
    second = await turn
    assert "session.status_rescheduled" in [e.type for e in second]

    await client.beta.sessions.events.send(session_id, events=[text("weather?")])
    third = await events_until_idle(client, session_id, len(first) + len(second))
    assert third[-1].stop_reason.type == "requires_action"
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle", "waiting on a custom tool's result"
    [use] = [e for e in third if e.type == "agent.custom_tool_use"]
    await client.beta.sessions.events.send(session_id, events=[result(use.id, "sunny")])
    await events_until_idle(client, session_id, len(first) + len(second) + len(third))
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle"

    archived = await client.beta.sessions.archive(session_id)
    assert archived.status == "terminated", "archived: upstream writes no event, so the status tells the runner"
    assert (await client.beta.sessions.retrieve(session_id)).status == "terminated"
    assert [s.id async for s in client.beta.sessions.list(include_archived=True, statuses=["terminated"])] == [
        session_id
    ]
    calls = [call async for call in client.beta.sessions.events.tool_runner(session_id, tools=[], max_idle=None)]
    assert calls == [], "the SDK's runner reads `terminated` on connecting and stops (max_idle=None: nothing else)"


async def test_the_status_holds_across_continue_as_new(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    """A session whose run hands over to the next one (here, renames grow the run's history) is the same session,
    in the same status, before, across and after the hand-over; archived in a later run, it is terminated."""
    client = await gateway.client("team-status")
    model = stack.script([{"text": "hi"}])
    session_input = SessionInput(agent=AgentConfig(model=model), message="hello", model_task_queue=stack.model_queue,
                                 continue_as_new_after_events=200)  # fmt: skip
    handle = await stack.client.start_workflow(
        SESSION_WORKFLOW, session_input, id=new_session_id(), task_queue=stack.harness_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, f"team-status-{gateway.suffix}")]),
    )  # fmt: skip
    stack.started.append(handle)
    await events_until_idle(client, handle.id, 0)
    renames = 0
    while (await session_info(handle)).run < 3:
        renames += 1
        session = await client.beta.sessions.update(handle.id, title=f"name {renames}")
        assert session.status == "idle", f"rename {renames}"
    assert (await client.beta.sessions.retrieve(handle.id)).status == "idle"
    archived = await client.beta.sessions.archive(handle.id)
    assert archived.status == "terminated"
    assert (await client.beta.sessions.retrieve(handle.id)).status == "terminated"


async def test_a_streams_frames_carry_only_json_data(stack: Stack, gateways: Gateways) -> None:  # noqa: F811
    """The raw SSE of a whole turn (with previews, and a ping: the model waits past the ping interval): every frame
    names its event, and every `data:` line is a JSON object with a `type` (a frame without `event:` the SDK drops,
    and a `data:` that is not JSON breaks it)."""
    url, _ = await gateways.start("gateway")
    client = await gateways.client(url, "team-raw")
    model = stack.script([{"text": "a streamed answer in several words", "first_token_latency": 16.0,
                           "tokens_per_second": 20}])  # fmt: skip
    session_id = await new_session(client, model, [])
    headers = {"authorization": f"Bearer {client.api_key}", "anthropic-beta": "managed-agents-2026-04-01"}
    frames: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http,
        http.stream(
            "GET", f"/v1/sessions/{session_id}/events/stream", params={"event_deltas[]": "agent.message"}
        ) as response,  # fmt: skip
    ):
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        # The headers are sent once the stream has fixed where it starts: the message below is in it.
        await client.beta.sessions.events.send(session_id, events=[text("go")])
        frame: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if line == "":
                if frame:
                    frames.append(frame)
                    if frame.get("event") == "session.status_idle":
                        break
                frame = {}
                continue
            field, _, value = line.partition(":")
            if field == "":
                continue  # a comment: the SDK's decoder ignores it
            assert field in ("event", "data", "id", "retry"), line
            if field == "data":
                data = json.loads(value.strip())
                assert isinstance(data, dict) and isinstance(data.get("type"), str), line
                frame["data"] = data
            else:
                frame[field] = value.strip()
    assert all("event" in f and "data" in f for f in frames), "every frame names its event and carries JSON"
    assert all(f["event"] == f["data"]["type"] for f in frames)
    kinds = [f["event"] for f in frames]
    assert "ping" in kinds, "the turn outlasted the ping interval: a ping frame, JSON like the rest"
    assert {"user.message", "session.status_running", "agent.message", "session.status_idle"} <= set(kinds)
