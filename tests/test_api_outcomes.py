"""Outcomes over the API, driven by the official `anthropic` SDK against a real gateway process on the real Temporal
dev server: `user.define_outcome` sent and given as `initial_events`, the grader's spans read in the SDK's own types,
`session.outcome_evaluations`, and every bad outcome refused with a 400 naming its field and nothing written.

The model is the offline model server. A script answers the grader's requests (they offer the `outcome_verdict`
tool) in script order, between the agent's turns: the work, the verdict, the revision, the next verdict."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.beta_managed_agents_outcome_evaluation_resource import (
    BetaManagedAgentsOutcomeEvaluationResource,
)
from anthropic.types.beta.sessions.beta_managed_agents_span_outcome_evaluation_end_event import (
    BetaManagedAgentsSpanOutcomeEvaluationEndEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_span_outcome_evaluation_ongoing_event import (
    BetaManagedAgentsSpanOutcomeEvaluationOngoingEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_span_outcome_evaluation_start_event import (
    BetaManagedAgentsSpanOutcomeEvaluationStartEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_user_define_outcome_event import (
    BetaManagedAgentsUserDefineOutcomeEvent,
)
from anthropic.types.beta.sessions.beta_managed_agents_user_define_outcome_event_params import (
    BetaManagedAgentsUserDefineOutcomeEventParams as OutcomeParams,
)

from corral.contract.outcomes import GRADER_TOOL, OutcomeEvaluation
from corral.contract.user_events import MAX_RUBRIC_CHARS
from modelserver.demo import MARKER
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture
from tests.test_threads_api import corral
from tests.waits import until

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "outcomes.py"

Client = anthropic.AsyncAnthropic
TERMINAL = {"satisfied", "max_iterations_reached", "failed", "interrupted"}
STORY = {"user.define_outcome", "span.outcome_evaluation_start", "span.outcome_evaluation_end", "agent.message"}


def outcome(description: str = "Write a haiku about rivers.", rubric: str = "Three lines; mentions water.",
            max_iterations: int | None = None) -> OutcomeParams:  # fmt: skip
    event: OutcomeParams = {"type": "user.define_outcome", "description": description,
                            "rubric": {"type": "text", "content": rubric}}  # fmt: skip
    if max_iterations is not None:
        event["max_iterations"] = max_iterations
    return event


def verdict(result: str, explanation: str, **step: Any) -> dict[str, Any]:
    """A script step that answers the grader's request."""
    return {"tool_uses": [{"name": GRADER_TOOL, "input": {"result": result, "explanation": explanation}}], **step}


def story(events: list[Any]) -> list[str]:
    """The outcome's part of a log: its definition, the agent's messages and the spans (an end with its result)."""
    return [f"{e.type}:{e.result}" if e.type == "span.outcome_evaluation_end" else e.type
            for e in events if e.type in STORY]  # fmt: skip


async def new_session(client: Client, model: str, **create: Any) -> str:
    agent = await client.beta.agents.create(name="poet", model=model)
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, **create)
    return session.id


async def settled(client: Client, session_id: str) -> tuple[Any, list[Any]]:
    """The session and its log once its every outcome has a terminal result and it is idle again."""
    seen: dict[str, Any] = {}

    async def idle_with_every_outcome_ended() -> bool:
        session = await client.beta.sessions.retrieve(session_id)
        events = [e async for e in client.beta.sessions.events.list(session_id, limit=500)]
        seen.update(session=session, events=events)
        ended = bool(session.outcome_evaluations) and all(e.result in TERMINAL for e in session.outcome_evaluations)
        return ended and session.status == "idle" and events[-1].type == "session.status_idle"

    await until(idle_with_every_outcome_ended, "the session idle with its outcome ended", within=120)
    return seen["session"], seen["events"]


async def test_a_text_rubric_needs_revision_once_then_is_satisfied(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("outcomes")
    model = stack.script([
        {"text": "Rivers run."},
        verdict("needs_revision", "Only one line; write three."),
        {"text": "Water runs / rivers carry it / the sea waits."},
        verdict("satisfied", "Three lines, and water is there."),
    ])  # fmt: skip
    session_id = await new_session(client, model)
    sent = await client.beta.sessions.events.send(session_id, events=[outcome()])
    [defined] = sent.data or []
    assert isinstance(defined, BetaManagedAgentsUserDefineOutcomeEvent) and defined.outcome_id.startswith("outc_")
    assert (defined.description, defined.rubric.type, defined.max_iterations) == (
        "Write a haiku about rivers.", "text", 3)  # fmt: skip

    session, events = await settled(client, session_id)
    assert story(events) == [
        "user.define_outcome",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:needs_revision",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:satisfied",
    ]
    starts = [e for e in events if e.type == "span.outcome_evaluation_start"]
    ends = [e for e in events if e.type == "span.outcome_evaluation_end"]
    assert all(isinstance(e, BetaManagedAgentsSpanOutcomeEvaluationStartEvent) for e in starts)
    assert all(isinstance(e, BetaManagedAgentsSpanOutcomeEvaluationEndEvent) for e in ends)
    assert [e.iteration for e in starts] == [0, 1] and [e.iteration for e in ends] == [0, 1]
    assert [e.outcome_evaluation_start_id for e in ends] == [e.id for e in starts]
    assert {e.outcome_id for e in [*starts, *ends]} == {defined.outcome_id}
    assert ends[0].explanation == "Only one line; write three." and ends[0].usage.output_tokens > 0
    [listed] = [e for e in events if e.type == "user.define_outcome"]
    assert listed.id == defined.id and listed.processed_at is not None, "taken by the agent's first turn"
    revision = [e for e in events if e.type == "agent.message"][1]
    assert revision.content[0].text == "Water runs / rivers carry it / the sea waits."
    revising = [r["body"]["messages"] for r in stack.requests(model) if r["step"] == 2]
    assert revising and "Only one line; write three." in str(revising[-1]), "the agent read why"

    [state] = session.outcome_evaluations
    assert isinstance(state, BetaManagedAgentsOutcomeEvaluationResource)
    assert (state.outcome_id, state.result, state.iteration) == (defined.outcome_id, "satisfied", 1)
    assert state.explanation == "Three lines, and water is there." and state.completed_at is not None
    assert session.usage.output_tokens >= sum(e.usage.output_tokens for e in ends), "the grader's usage counts"


async def test_an_outcome_at_max_iterations_gets_one_acknowledgment_turn(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("outcomes")
    model = stack.script([
        {"text": "try 1"}, verdict("needs_revision", "No sea."),
        {"text": "try 2"}, verdict("needs_revision", "Still no sea."),
        {"text": "Not met: the sea is missing."},
    ])  # fmt: skip
    session_id = await new_session(client, model)
    await client.beta.sessions.events.send(session_id, events=[outcome(max_iterations=2)])
    session, events = await settled(client, session_id)
    assert story(events) == [
        "user.define_outcome",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:needs_revision",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:max_iterations_reached",
        "agent.message",
    ], "one acknowledgment turn, not graded"
    assert [e.type for e in events][-1] == "session.status_idle"
    assert [e for e in events if e.type == "agent.message"][-1].content[0].text == "Not met: the sea is missing."
    assert "no more evaluation follows" in str(stack.requests(model)[-1]["body"]["messages"])
    [state] = session.outcome_evaluations
    assert (state.result, state.iteration, state.explanation) == ("max_iterations_reached", 1, "Still no sea.")


async def test_an_interrupt_while_the_grader_works_ends_the_evaluation_interrupted(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("outcomes")
    model = stack.script([{"text": "done, I think"}, verdict("satisfied", "fine", first_token_latency=120)])
    session_id = await new_session(client, model)
    await client.beta.sessions.events.send(session_id, events=[outcome()])

    async def evaluating() -> bool:
        graded = [r for r in stack.requests(model) if r["step"] == 1]
        session = await client.beta.sessions.retrieve(session_id)
        return bool(graded) and session.outcome_evaluations[0].result == "evaluating"

    await until(evaluating, "the grader asked, the outcome evaluating")

    async def heartbeat() -> list[Any]:
        events = [e async for e in client.beta.sessions.events.list(session_id, limit=500)]
        return [e for e in events if e.type == "span.outcome_evaluation_ongoing"]

    await until(heartbeat, "a span.outcome_evaluation_ongoing while the grader works")
    [ongoing, *_] = await heartbeat()
    assert isinstance(ongoing, BetaManagedAgentsSpanOutcomeEvaluationOngoingEvent) and ongoing.iteration == 0
    await client.beta.sessions.events.send(session_id, events=[{"type": "user.interrupt"}])
    session, events = await settled(client, session_id)
    [start] = [e for e in events if e.type == "span.outcome_evaluation_start"]
    [end] = [e for e in events if e.type == "span.outcome_evaluation_end"]
    assert (end.result, end.outcome_evaluation_start_id, end.iteration) == ("interrupted", start.id, 0)
    assert ongoing.outcome_id == start.outcome_id == end.outcome_id
    assert [e.type for e in events].index("user.interrupt") < [e.type for e in events].index(end.type)
    [state] = session.outcome_evaluations
    assert state.result == "interrupted" and state.completed_at is not None


async def test_an_outcome_in_initial_events_is_pursued_and_the_default_model_grades_it(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("outcomes")
    # The offline stand-in's default model, unscripted: it echoes the outcome as its work, and its grader accepts
    # work it sees, saying that it cannot judge it.
    session_id = await new_session(client, "claude-sonnet-4-6", initial_events=[outcome()])
    session, events = await settled(client, session_id)
    assert story(events) == [
        "user.define_outcome",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:satisfied",
    ]
    [end] = [e for e in events if e.type == "span.outcome_evaluation_end"]
    assert end.explanation.startswith(MARKER) and "cannot judge" in end.explanation
    [state] = session.outcome_evaluations
    assert (state.description, state.result, state.iteration) == ("Write a haiku about rivers.", "satisfied", 0)

    # `corral outcomes` shows the same, from the session's query.
    listed = await corral(stack, "outcomes", session_id, "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [OutcomeEvaluation.model_validate_json(line) for line in listed.stdout.splitlines()]
    assert row.model_dump(mode="json") == state.model_dump(mode="json")
    table = await corral(stack, "outcomes", session_id)
    assert table.returncode == 0, table.stderr
    assert all(shown in table.stdout for shown in (state.outcome_id, "Write a haiku about rivers.", "satisfied"))


BAD_OUTCOMES: list[tuple[Any, str]] = [
    (outcome(rubric="x" * (MAX_RUBRIC_CHARS + 1)), r"rubric\.text\.content: String should have at most 262144"),
    (outcome(max_iterations=0), r"max_iterations: Input should be greater than or equal to 1"),
    (outcome(max_iterations=21), r"max_iterations: Input should be less than or equal to 20"),
    (outcome(description="  "), r"description: Value error, description must not be blank"),
]
"""Each bad outcome and what its 400 says, after the event's place (`events[0].user.define_outcome.`)."""


async def test_each_bad_outcome_is_a_400_naming_its_field_and_nothing_is_written(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("outcomes-bad")
    model = stack.script([{"text": "working", "first_token_latency": 120}])
    agent = await client.beta.agents.create(name="poet", model=model)
    environment = await client.beta.environments.create(name="plain")
    for bad, why in BAD_OUTCOMES:
        with pytest.raises(anthropic.BadRequestError, match=rf"initial_events\[0\]\.user\.define_outcome\.{why}"):
            await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, initial_events=[bad])
    with pytest.raises(anthropic.BadRequestError, match=r"initial_events\[1\]: one outcome at a time"):
        await client.beta.sessions.create(agent=agent.id, environment_id=environment.id,
                                          initial_events=[outcome(), outcome()])  # fmt: skip
    assert [s async for s in client.beta.sessions.list()] == [], "no session was left behind"

    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    for bad, why in BAD_OUTCOMES:
        with pytest.raises(anthropic.BadRequestError, match=rf"events\[0\]\.user\.define_outcome\.{why}"):
            await client.beta.sessions.events.send(session.id, events=[bad])
    with pytest.raises(anthropic.BadRequestError, match=r"one user.define_outcome at a time"):
        await client.beta.sessions.events.send(session.id, events=[outcome(), outcome()])
    assert [e async for e in client.beta.sessions.events.list(session.id)] == [], "nothing was written"
    none = await corral(stack, "outcomes", session.id)
    assert none.returncode == 0 and "no outcomes" in none.stdout, none.stderr

    [pursued] = (await client.beta.sessions.events.send(session.id, events=[outcome()])).data or []
    assert isinstance(pursued, BetaManagedAgentsUserDefineOutcomeEvent)
    with pytest.raises(anthropic.BadRequestError, match="is still being pursued") as refused:
        await client.beta.sessions.events.send(session.id, events=[outcome(description="another")])
    assert refused.value.body["error"]["details"] == {"error_code": "outcome_in_progress"}  # type: ignore[index]
    await client.beta.sessions.events.send(session.id, events=[{"type": "user.interrupt"}])
    retrieved, events = await settled(client, session.id)
    assert [e.type for e in events].count("user.define_outcome") == 1, "the refused outcome was not written"
    assert [(e.outcome_id, e.result) for e in retrieved.outcome_evaluations] == [(pursued.outcome_id, "interrupted")]


async def test_the_outcomes_example_runs_and_the_page_shows_it_whole(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("outcomes-example")
    env = {**os.environ, "CORRAL_API_KEY": str(client.api_key), "CORRAL_API_URL": gateway.url}
    env.pop("CORRAL_MODEL", None)
    ran = await asyncio.to_thread(subprocess.run, [sys.executable, str(EXAMPLE)], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120, env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith(f"agent: {MARKER}") and "Write a haiku about rivers." in ran.stdout, ran.stdout
    lines = ran.stdout.splitlines()
    graded = lines.index("grading (cycle 1)")
    assert lines[graded + 1].startswith(f"grader: satisfied: {MARKER}") and graded + 3 == len(lines), ran.stdout
    assert re.fullmatch(r"outc_[0-9a-f]{32}: satisfied after 1 cycle\(s\)", lines[-1]), ran.stdout
    code = EXAMPLE.read_text().split('"""\n', 1)[1].strip()  # the script without its docstring
    assert code in (ROOT / "docs" / "outcomes.md").read_text(), "docs/outcomes.md must show examples/outcomes.py whole"
