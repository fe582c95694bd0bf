"""A session driven through the gateway with the official SDK, beyond sending and streaming: a custom tool's round
trip, an interrupt that redirects the session, and the rules of deleting a session."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import anthropic
import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from corral.archive import tool_output_key
from corral.blobs import BlobNotFound, open_blob_store
from corral.client import read_events, send_events, wait_for_idle
from corral.contract.session import SessionInfo, UpdateSessionInput
from corral.names import SIGNAL_USER_MESSAGE, UPDATE_SESSION
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)

WEATHER = {
    "type": "custom",
    "name": "weather",
    "description": "today's weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def result(use_id: str, content: str) -> Any:
    return {
        "type": "user.custom_tool_result",
        "custom_tool_use_id": use_id,
        "content": [{"type": "text", "text": content}],
    }


def text(content: str) -> Any:
    return {"type": "user.message", "content": [{"type": "text", "text": content}]}


async def events_until_idle(client: anthropic.AsyncAnthropic, session_id: str, after: int) -> list[Any]:
    """The session's events from position `after` on, once its newest one is `session.status_idle`."""
    for _ in range(600):
        events = [e async for e in client.beta.sessions.events.list(session_id, limit=100)]
        fresh = events[after:]
        if fresh and fresh[-1].type == "session.status_idle":
            return fresh
        await asyncio.sleep(0.1)
    raise AssertionError("the session did not go idle")


async def new_session(client: anthropic.AsyncAnthropic, model: str, tools: list[Any]) -> str:
    agent = await client.beta.agents.create(name="helper", model=model, tools=tools)
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    return session.id


async def test_a_custom_tool_call_waits_for_the_clients_result(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    model = stack.script(
        [{"tool_uses": [{"name": "weather", "input": {"city": "Oslo"}}]}, {"text": "it is sunny in Oslo"}]
    )
    session_id = await new_session(client, model, [WEATHER])
    await client.beta.sessions.events.send(session_id, events=[text("weather in Oslo?")])
    first = await events_until_idle(client, session_id, 0)
    [use] = [e for e in first if e.type == "agent.custom_tool_use"]
    assert (use.name, use.input) == ("weather", {"city": "Oslo"})
    idle = first[-1]
    assert idle.stop_reason.type == "requires_action" and idle.stop_reason.event_ids == [use.id]
    with pytest.raises(anthropic.BadRequestError, match="no custom tool call"):
        await client.beta.sessions.events.send(session_id, events=[result("sevt_nope", "x")])
    await client.beta.sessions.events.send(session_id, events=[result(use.id, "sunny")])
    second = await events_until_idle(client, session_id, len(first))
    assert second[-1].stop_reason.type == "end_turn"
    replies = [e.model_dump()["content"][0]["text"] for e in second if e.type == "agent.message"]
    assert replies == ["it is sunny in Oslo"]
    [request] = stack.requests(model)[1:]
    assert "sunny" in str(request), "the model got the client's result"


async def test_an_interrupt_with_a_message_redirects_the_session(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    # The same step answers both requests (neither conversation holds an answer yet): slowly the first time, so
    # the interrupt finds it running; the second time fast, echoing the message it was redirected with.
    model = stack.script([{"echo_last_user": True, "first_token_latency": 5.0, "pace_hits": 1}])
    session_id = await new_session(client, model, [])
    await client.beta.sessions.events.send(session_id, events=[text("start a long answer")])
    for _ in range(300):
        if (await client.beta.sessions.retrieve(session_id)).status == "running":
            break
        await asyncio.sleep(0.05)
    with pytest.raises(anthropic.ConflictError, match="interrupt it first"):
        await client.beta.sessions.delete(session_id)
    await client.beta.sessions.events.send(
        session_id, events=[{"type": "user.interrupt"}, text("never mind: say redirected")]
    )
    for _ in range(600):
        events = [e async for e in client.beta.sessions.events.list(session_id, limit=100)]
        replies = [e.model_dump()["content"][0]["text"] for e in events if e.type == "agent.message"]
        if replies and events[-1].type == "session.status_idle":
            break
        await asyncio.sleep(0.1)
    # One answer, to the conversation that ends with the redirect (both user messages, now one turn): the
    # interrupted answer left nothing.
    assert len(replies) == 1 and replies[0].endswith("never mind: say redirected"), replies
    types = [e.type for e in events]
    assert "user.interrupt" in types and types.count("user.message") == 2


async def test_an_idle_session_is_deleted_with_its_log(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    session_id = await new_session(client, stack.script([{"text": "hi"}]), [])
    await client.beta.sessions.events.send(session_id, events=[text("hello")])
    await events_until_idle(client, session_id, 0)
    seen: list[Any] = []

    stream = await client.beta.sessions.events.stream(session_id)  # open (its place in the log fixed) on return

    async def follow() -> None:
        async with stream:
            async for event in stream:
                seen.append(event)

    following = asyncio.create_task(follow())
    blobs = open_blob_store()  # the run's shared store (tests/conftest.py), the gateway's too
    blobs.put(tool_output_key(session_id, "toolu_kept"), b"a whole tool output")
    deleted = await client.beta.sessions.delete(session_id)
    assert (deleted.id, deleted.type) == (session_id, "session_deleted")
    await asyncio.wait_for(following, 30)  # the stream ended by itself
    assert [e.type for e in seen] == ["session.deleted"], "the open stream got session.deleted, then its end"
    with pytest.raises(BlobNotFound):
        blobs.get(tool_output_key(session_id, "toolu_kept"))
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.sessions.retrieve(session_id)
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.sessions.events.list(session_id)
    other = await gateway.client("team-b")
    kept = await new_session(client, stack.script([{"text": "hi"}]), [])
    with pytest.raises(anthropic.NotFoundError):
        await other.beta.sessions.delete(kept)
    assert (await client.beta.sessions.retrieve(kept)).status == "idle"


async def test_a_session_is_renamed_then_archived_and_takes_no_more_events(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    session_id = await new_session(client, stack.script([{"text": "hi"}]), [])
    updated = await client.beta.sessions.update(session_id, title="renamed", metadata={"ticket": "T-1"})
    assert (updated.title, updated.metadata) == ("renamed", {"ticket": "T-1"})
    updated = await client.beta.sessions.update(session_id, metadata={"ticket": None, "team": "a"})
    assert updated.metadata == {"team": "a"} and updated.title == "renamed"
    with pytest.raises(anthropic.BadRequestError, match="vault_ids"):
        await client.beta.sessions.update(session_id, vault_ids=["vlt_x"])
    archived = await client.beta.sessions.archive(session_id)
    assert archived.archived_at is not None
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await client.beta.sessions.events.send(session_id, events=[text("too late")])
    assert [e.type async for e in client.beta.sessions.events.list(session_id)] == [], "nothing was written"
    with pytest.raises(anthropic.BadRequestError, match="archived"):
        await client.beta.sessions.update(session_id, title="again")
    listed = [s.id async for s in client.beta.sessions.list()]
    assert session_id not in listed
    assert session_id in [s.id async for s in client.beta.sessions.list(include_archived=True)]
    assert (await client.beta.sessions.retrieve(session_id)).title == "renamed"


async def test_the_sdks_own_tool_runner_answers_a_sessions_custom_tool_calls(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    """`client.beta.sessions.events.tool_runner`, the SDK's runner for custom tools, drives a corral session: it
    attaches (stream, retrieve, list), runs each call the session waits on once, and posts the results."""
    client = await gateway.client("team-a")
    model = stack.script(
        [
            {
                "tool_uses": [
                    {"name": "weather", "input": {"city": "Oslo"}},
                    {"name": "weather", "input": {"city": "Lima"}},
                ]
            },
            {"text": "Oslo and Lima are both sunny"},
        ]
    )
    asked: list[str] = []

    @anthropic.beta_async_tool
    async def weather(city: str) -> str:
        """today's weather in a city"""
        asked.append(city)
        return f"sunny in {city}"

    session_id = await new_session(client, model, [WEATHER])
    await client.beta.sessions.events.send(session_id, events=[text("weather in Oslo and Lima?")])
    calls = [call async for call in client.beta.sessions.events.tool_runner(session_id, tools=[weather], max_idle=1.0)]
    assert sorted(asked) == ["Lima", "Oslo"], "each call ran once"
    assert [(c.name, c.is_error, c.posted) for c in calls] == [("weather", False, True)] * 2
    events = [e async for e in client.beta.sessions.events.list(session_id, limit=100)]
    assert events[-1].type == "session.status_idle" and events[-1].stop_reason.type == "end_turn"
    assert [e.type for e in events].count("user.custom_tool_result") == 2
    [request] = stack.requests(model)[1:]
    assert "sunny in Oslo" in str(request) and "sunny in Lima" in str(request)


async def test_a_session_being_deleted_takes_nothing_more(stack: Stack) -> None:
    """The deletion's first step, through the Temporal client: `session.deleted` ends the log, and a send in the
    moment before the workflow is cancelled is refused (a signal is dropped), never half-taken."""
    handle = await stack.start(stack.script([{"text": "hi"}]), "hello")
    await wait_for_idle(handle)
    await handle.execute_update(UPDATE_SESSION, UpdateSessionInput(delete=True), result_type=SessionInfo)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [{"type": "user.message", "content": "too late"}])
    assert "being deleted" in str(refused.value.cause)
    await handle.signal(SIGNAL_USER_MESSAGE, {"content": "too late"})
    rename = UpdateSessionInput(title_set=True, title="x")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(UPDATE_SESSION, rename, result_type=SessionInfo)
    assert "being deleted" in str(refused.value.cause)
    log = await read_events(handle)
    assert log[-1].type == "session.deleted" and [e.type for e in log].count("user.message") == 1
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await read_events(handle))[-1].type == "session.deleted", "nothing is written after it"


async def test_event_types_corral_does_not_take_are_refused_with_the_reason(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    session_id = await new_session(client, stack.script([{"text": "hi"}]), [])
    unserved = {
        "self-hosted environment": {"type": "user.tool_result", "tool_use_id": "sevt_x", "content": []},
    }
    for reason, event in unserved.items():
        with pytest.raises(anthropic.BadRequestError, match=reason):
            await client.beta.sessions.events.send(session_id, events=[text("hello"), event])  # type: ignore[list-item]
    assert [e.type async for e in client.beta.sessions.events.list(session_id)] == [], "nothing was written"


async def test_a_session_with_bad_initial_events_is_not_created(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-initial")
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "hi"}]))
    environment = await client.beta.environments.create(name="plain")
    refused = {
        "initial_events[1].user.message.content: Value error, content must not be empty": [
            text("hello"),
            {"type": "user.message", "content": []},
        ],
        "initial_events[0].user.define_outcome.rubric: Input should be a valid dictionary": [
            {"type": "user.define_outcome", "description": "a poem", "rubric": "rhymes"}
        ],
        "initial_events[0]: a session starts with user.message, user.define_outcome and system.message events only": [
            {"type": "user.interrupt"}
        ],
    }
    for reason, events in refused.items():
        with pytest.raises(anthropic.BadRequestError, match=re.escape(reason)):
            await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, initial_events=events)
    assert [s async for s in client.beta.sessions.list()] == [], "no session was left behind"
    session = await client.beta.sessions.create(
        agent=agent.id, environment_id=environment.id, initial_events=[text("hello")]
    )
    first = await events_until_idle(client, session.id, 0)
    assert [e.type for e in first][:2] == ["user.message", "session.status_running"]


async def test_a_refused_response_ends_the_turn_with_stop_reason_refusal(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-refusal")
    model = stack.script(
        [
            {"text": "I can't help with that.", "stop_reason": "refusal", "refusal_category": "cyber"},
            {"text": "Happy to help with that one."},
        ]
    )
    session_id = await new_session(client, model, [])
    await client.beta.sessions.events.send(session_id, events=[text("something it refuses")])
    first = await events_until_idle(client, session_id, 0)
    idle = first[-1]
    assert idle.stop_reason.type == "refusal"
    details = idle.stop_details
    assert details is not None and (details.type, details.category) == ("refusal", "cyber")
    assert details.explanation, "the model's explanation is passed on"
    assert [e.model_dump()["content"][0]["text"] for e in first if e.type == "agent.message"] == [
        "I can't help with that."
    ]
    session = await client.beta.sessions.retrieve(session_id)
    assert session.status == "idle"
    await client.beta.sessions.events.send(session_id, events=[text("something else")])
    second = await events_until_idle(client, session_id, len(first))
    assert second[-1].stop_reason.type == "end_turn" and second[-1].stop_details is None


async def test_an_agent_with_overrides_changes_the_session_and_not_the_agent(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("team-overrides")
    original, replacement = stack.script([{"text": "from the agent's model"}]), stack.script([{"text": "overridden"}])
    tools: Any = [WEATHER]
    agent = await client.beta.agents.create(name="helper", model=original, system="Be formal.", tools=tools)
    environment = await client.beta.environments.create(name="plain")
    overrides: Any = {"type": "agent_with_overrides", "id": agent.id, "version": 1, "model": replacement,
                      "system": "Be brief.", "tools": []}  # fmt: skip
    session = await client.beta.sessions.create(agent=overrides, environment_id=environment.id)
    assert (session.agent.id, session.agent.version, session.agent.system) == (agent.id, 1, "Be brief.")
    assert session.agent.tools == [] and session.agent.model.id == replacement
    await client.beta.sessions.events.send(session.id, events=[text("hello")])
    replies = [e for e in await events_until_idle(client, session.id, 0) if e.type == "agent.message"]
    assert [r.model_dump()["content"][0]["text"] for r in replies] == ["overridden"]
    [request] = stack.requests(replacement)
    assert "Be brief." in str(request["body"]["system"]) and not request["body"].get("tools")
    assert not stack.requests(original), "the agent's own model was not called"
    kept = await client.beta.agents.retrieve(agent.id)
    assert (kept.version, kept.system, [t.type for t in kept.tools]) == (1, "Be formal.", ["custom"])
    refused: list[tuple[dict[str, Any], str]] = [({"name": "x"}, "name cannot be overridden"),
                                                 ({"skills": [{"type": "x"}]}, "skills")]  # fmt: skip
    for bad, reason in refused:
        with pytest.raises(anthropic.BadRequestError, match=reason):
            wrong: Any = {**overrides, **bad}
            await client.beta.sessions.create(agent=wrong, environment_id=environment.id)


async def test_a_resource_added_badly_is_refused_with_the_reason(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    """Only a file of the session's workspace can be added, at a mount path under /mnt/ (adding and mounting one:
    tests/test_api_knowledge.py; deleting a repository: tests/test_gateway_vaults.py)."""
    client = await gateway.client("team-resources")
    session_id = await new_session(client, stack.script([{"text": "hi"}]), [])
    uploaded = await client.beta.files.upload(file=("a.txt", b"a"))
    with pytest.raises(anthropic.NotFoundError, match="file 'file_x' was not found"):
        await client.beta.sessions.resources.add(session_id, type="file", file_id="file_x")
    with pytest.raises(anthropic.BadRequestError, match="is a session id, not a file id"):
        await client.beta.sessions.resources.add(session_id, type="file", file_id=session_id)
    with pytest.raises(anthropic.BadRequestError, match="mount_path must be an absolute path under /mnt/"):
        await client.beta.sessions.resources.add(session_id, type="file", file_id=uploaded.id, mount_path="/etc/x")
    with pytest.raises(anthropic.BadRequestError, match="only file resources can be added"):
        await client.post(f"/v1/sessions/{session_id}/resources", cast_to=object,
                          body={"type": "github_repository", "url": "https://git.example/a/b.git"})  # fmt: skip
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.sessions.resources.delete("repo1", session_id=session_id)
    assert [r async for r in client.beta.sessions.resources.list(session_id)] == [], "nothing was added"
    stranger = await gateway.client("team-elsewhere")
    with pytest.raises(anthropic.NotFoundError):
        await stranger.beta.sessions.resources.add(session_id, type="file", file_id=uploaded.id)
    theirs = await stranger.beta.files.upload(file=("b.txt", b"b"))
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.sessions.resources.add(session_id, type="file", file_id=theirs.id)
