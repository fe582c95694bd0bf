"""`system.message` with the official SDK against a gateway process: the model request's top-level `system` holds
the agent's prompt, then each system message, from the turn it came with on (never as a message); misplaced ones
are 400s that name the rule and write nothing; a deployment's `initial_events` may end with one. And, on the pure
parts: a summary never stands for one, and one still waiting is carried over a hand-over. A multi-agent session
refuses one with a result it routes to another thread (its system context is the primary thread's)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import anthropic
import pytest
from temporalio.client import WorkflowUpdateFailedError

from activities.context import build_messages, build_system
from corral.client import read_events, send_events
from corral.contract.carry import SessionCarry
from corral.contract.context import view
from corral.contract.events import (
    AgentMessage,
    AgentThreadContextCompacted,
    SessionEvent,
    SystemMessage,
    TextBlock,
    UserMessage,
)
from corral.contract.session import SendEventsInput
from tests.conftest import Stack
from tests.test_api_deployments import DeployGateway, deployable, gateway, message  # noqa: F401 - the fixture
from tests.test_gateway_sessions import WEATHER, events_until_idle, result
from tests.test_threads import subagent_asking
from tests.waits import until
from workflows import SessionLog, UserInbox

pytestmark = pytest.mark.timeout(300)

PROMPT = "You are a careful helper."


def system(text: str) -> Any:
    return {"type": "system.message", "content": [{"type": "text", "text": text}]}


def system_texts(request: dict[str, Any]) -> list[str]:
    """The texts of a recorded model request's top-level `system`, in order."""
    shown = request["body"].get("system")
    if isinstance(shown, str):
        return [shown]
    return [block["text"] for block in shown or []]


def message_texts(request: dict[str, Any]) -> str:
    return str(request["body"]["messages"])


async def session_of(client: anthropic.AsyncAnthropic, model: str, tools: list[Any] | None = None) -> str:
    agent = await client.beta.agents.create(name="helper", model=model, system=PROMPT, tools=tools or [])
    environment = await client.beta.environments.create(name="plain")
    return (await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)).id


async def test_a_system_message_joins_the_system_prompt_from_its_turn_on(
    stack: Stack,
    gateway: DeployGateway,  # noqa: F811
) -> None:
    client = await gateway.client("team-system")
    model = stack.script([{"text": "bonjour"}, {"text": "encore bonjour"}])
    session_id = await session_of(client, model)
    sent = await client.beta.sessions.events.send(session_id, events=[message("hi"), system("Answer in French.")])
    assert [e.type for e in sent.data or []] == ["user.message", "system.message"]
    first = await events_until_idle(client, session_id, 0)
    await client.beta.sessions.events.send(session_id, events=[message("again")])
    await events_until_idle(client, session_id, len(first))

    one, two = stack.requests(model)
    assert system_texts(one) == [PROMPT, "Answer in French."], "the prompt, then the system message"
    assert system_texts(two) == [PROMPT, "Answer in French."], "the next turn still has it"
    assert "Answer in French." not in message_texts(one) + message_texts(two), "never a message"
    assert two["body"]["system"][-1].get("cache_control") == {"type": "ephemeral"}, "the system prompt's end is cached"
    events = [e async for e in client.beta.sessions.events.list(session_id, limit=100)]
    [shown] = [e for e in events if e.type == "system.message"]
    assert shown.processed_at is not None and [b.text for b in shown.content] == ["Answer in French."]
    assert events[events.index(shown) - 1].type == "user.message", "written right after the message it came with"


async def test_a_system_message_with_a_custom_tool_result_reaches_the_next_request(
    stack: Stack,
    gateway: DeployGateway,  # noqa: F811
) -> None:
    client = await gateway.client("team-system")
    model = stack.script([{"tool_uses": [{"name": "weather", "input": {"city": "Oslo"}}]}, {"text": "sunny"}])
    session_id = await session_of(client, model, [WEATHER])
    await client.beta.sessions.events.send(session_id, events=[message("weather in Oslo?")])
    first = await events_until_idle(client, session_id, 0)
    [use] = [e for e in first if e.type == "agent.custom_tool_use"]
    await client.beta.sessions.events.send(session_id, events=[result(use.id, "sunny"), system("Be terse.")])
    await events_until_idle(client, session_id, len(first))
    asked, answered = stack.requests(model)
    assert system_texts(asked) == [PROMPT], "the turn before it has the prompt alone"
    assert system_texts(answered) == [PROMPT, "Be terse."]
    assert "Be terse." not in message_texts(answered)


async def test_misplaced_system_messages_are_400s_that_name_the_rule(
    stack: Stack,
    gateway: DeployGateway,  # noqa: F811
) -> None:
    client = await gateway.client("team-system")
    model = stack.script([{"text": "hi"}])
    session_id = await session_of(client, model)
    rule = "a system.message comes last in its batch, right after the user.message"
    misplaced: dict[str, list[Any]] = {
        "it is followed by user.message": [system("first"), message("hello")],
        "here it is alone": [system("alone")],
        "at most one system.message per batch": [message("hello"), system("one"), system("two")],
        "here it follows user.interrupt": [message("hello"), {"type": "user.interrupt"}, system("late")],
        "content must not be empty": [message("hello"), system("  ")],
    }
    for reason, events in misplaced.items():
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.beta.sessions.events.send(session_id, events=events)
        assert reason in str(refused.value), (reason, str(refused.value))
        if reason != "content must not be empty":
            assert rule in str(refused.value)
    assert [e.type async for e in client.beta.sessions.events.list(session_id)] == [], "nothing was written"
    assert stack.requests(model) == [], "no model call"


async def test_a_deployment_starts_its_sessions_with_a_system_message(
    stack: Stack,
    gateway: DeployGateway,  # noqa: F811
) -> None:
    client = await gateway.client("deploy-system")
    agent, environment = await deployable(client, stack)
    with pytest.raises(anthropic.BadRequestError, match="here it is alone"):
        await client.beta.deployments.create(agent=agent.id, environment_id=environment.id, name="n",
                                             initial_events=[system("alone")])  # fmt: skip
    deployment = await client.beta.deployments.create(
        agent=agent.id, environment_id=environment.id, name="nightly",
        initial_events=[message("check the dependencies"), system("Report in one line.")],
    )  # fmt: skip
    run = await client.beta.deployments.run(deployment.id)
    assert run.error is None and run.session_id
    model = agent.model.id

    await until(lambda: stack.requests(model), "the run's session asked the model")
    [first, *_] = stack.requests(model)
    assert system_texts(first)[-1] == "Report in one line."
    assert "check the dependencies" in message_texts(first) and "Report in one line." not in message_texts(first)


def _log() -> SessionLog:
    counter = itertools.count(1)
    return SessionLog(new_id=lambda: f"sevt_{next(counter)}", now=lambda: datetime(2026, 1, 1, tzinfo=UTC))


def test_a_summary_never_stands_for_a_system_message() -> None:
    log = _log()
    said: list[SessionEvent] = [
        log.append(UserMessage, content=[TextBlock(text="old question")]),
        log.append(SystemMessage, content=[TextBlock(text="Answer in French.")]),
        log.append(AgentMessage, content=[TextBlock(text="old answer")]),
    ]
    summary = log.append(AgentThreadContextCompacted, summary="they talked", start_position=1, end_position=3)
    latest = log.append(UserMessage, content=[TextBlock(text="new question")])
    entries: list[SessionEvent] = [*said, summary, latest]
    for event in entries:
        log.add_to_conversation(event)
    shown = view(log.conversation, watermark=0)
    assert [e.type for e in shown] == ["agent.thread_context_compacted", "system.message", "user.message"]
    assert build_system("prompt", shown) == [
        {"type": "text", "text": "prompt"},
        {"type": "text", "text": "Answer in French."},
    ]
    assert "Answer in French." not in str(build_messages(shown)) and "old answer" not in str(build_messages(shown))
    assert build_system("prompt", view([latest], 0)) == "prompt", "no system message: the request is as before"


def test_a_waiting_system_message_is_carried_over_a_hand_over() -> None:
    log = _log()
    inbox = UserInbox(
        log, now=lambda: datetime(2026, 1, 1, tzinfo=UTC), interrupt_turn=lambda: True, changed=lambda: None
    )
    batch = [
        {"type": "user.message", "content": "hi"},
        {"type": "system.message", "content": [{"type": "text", "text": "Be terse."}]},
    ]
    inbox.accept_batch(SendEventsInput(events=batch))
    carried = inbox.carried(window=10)
    assert carried["pending"] == [1] and carried["system_messages"] == [2]
    resumed = UserInbox(
        log, now=lambda: datetime(2026, 1, 2, tzinfo=UTC), interrupt_turn=lambda: True, changed=lambda: None
    )
    resumed.resume(
        cast(SessionCarry, SimpleNamespace(**{**carried, "awaiting_custom": [], "awaiting_confirmation": []}))
    )
    resumed.take_pending()
    assert [(e.type, e.processed_at is not None) for e in log.conversation] == [
        ("user.message", True),
        ("system.message", True),
    ]
    assert resumed.system_messages == []


def test_a_resent_batch_adds_its_system_message_once() -> None:
    log = _log()
    inbox = UserInbox(
        log, now=lambda: datetime(2026, 1, 1, tzinfo=UTC), interrupt_turn=lambda: True, changed=lambda: None
    )
    batch = [{"type": "user.message", "content": "hi", "id": "c-1"}, system("Be terse.")]
    first = inbox.accept_batch(SendEventsInput(events=batch))
    assert inbox.accept_batch(SendEventsInput(events=batch)) == first, "the same ids, nothing new"
    assert [e.type for e in log.events] == ["user.message", "system.message"]


async def test_a_system_message_may_not_ride_on_a_result_routed_to_a_thread(stack: Stack) -> None:
    handle, use = await subagent_asking(stack)
    answer = {
        "type": "user.custom_tool_result",
        "custom_tool_use_id": use.id,
        "content": [{"type": "text", "text": "yes"}],
    }
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [answer, system("Be terse.")])
    assert "may not accompany a result routed to another thread" in str(refused.value.cause)
    written = [e.type for e in await read_events(handle)]
    assert "system.message" not in written and "user.custom_tool_result" not in written, "nothing was written"
    await send_events(handle, [answer])  # the same result alone is taken
