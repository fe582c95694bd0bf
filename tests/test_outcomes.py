"""Outcomes from a Temporal client: a session pursues a `user.define_outcome` until the grader (the agent's model,
asked with its own prompt and the `outcome_verdict` tool) finds it met, revising on `needs_revision`, acknowledging
at `max_iterations`, ending `interrupted` on an interrupt; the grader reads files the rubric names through the hand.
The model is the offline scripted server: a script's `grader` steps answer the grader, by evaluation cycle."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from corral.client import read_events, send_events, wait_for_idle
from corral.contract.events import (
    SessionEvent,
    SpanOutcomeEvaluationEnd,
    SpanOutcomeEvaluationOngoing,
    SpanOutcomeEvaluationStart,
    UserDefineOutcome,
)
from corral.contract.outcomes import GRADER_TOOL, OutcomeEvaluation
from corral.contract.session import SessionInfo
from corral.names import OUTCOME_IN_PROGRESS
from tests.conftest import Stack, texts
from tests.waits import until

pytestmark = pytest.mark.timeout(300)
TOOLSET = [{"type": "agent_toolset_20260401"}]


def verdict(result: str, explanation: str, **step: Any) -> dict[str, Any]:
    return {"tool_uses": [{"name": GRADER_TOOL, "input": {"result": result, "explanation": explanation}}], **step}


def outcome(description: str = "Write a haiku about rivers.", rubric: str = "Three lines; mentions water.",
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"type": "user.define_outcome", "description": description, "rubric": {"type": "text", "content": rubric},
            **extra}  # fmt: skip


def shape(events: list[SessionEvent]) -> list[str]:
    """The outcome's story: its definition, the spans and the agent's messages, in log order."""
    kinds = {"user.define_outcome", "span.outcome_evaluation_start", "span.outcome_evaluation_end", "agent.message"}
    out = []
    for e in events:
        if e.type not in kinds:
            continue
        detail = getattr(e, "result", None) or getattr(e, "iteration", None)
        out.append(f"{e.type}:{detail}" if isinstance(e, SpanOutcomeEvaluationEnd) else e.type)
    return out


def graded(stack: Stack, steps: list[dict[str, Any]], grader: list[dict[str, Any]], loop: bool = False) -> str:
    """A scripted model whose turns play `steps` and whose grader's requests play `grader`, by cycle."""
    model = stack.script(steps)
    stack.model_server.register(model.removeprefix("script:"), {"steps": steps, "grader": grader, "loop": loop})
    return model


async def evaluations(handle: WorkflowHandle) -> list[OutcomeEvaluation]:
    return (await handle.query("session", result_type=SessionInfo)).outcome_evaluations


async def test_needs_revision_once_then_satisfied(stack: Stack) -> None:
    poem = [{"text": "Rivers run."}, {"text": "Water runs / rivers carry / the sea waits."}]
    grader = [verdict("needs_revision", "Only one line; write three."), verdict("satisfied", "Three lines.")]
    model = graded(stack, poem, grader)
    handle = await stack.start(model)
    (outcome_id_event,) = await send_events(handle, [outcome()])
    events = await wait_for_idle(handle)
    assert shape(events) == [
        "user.define_outcome",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:needs_revision",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:satisfied",
    ]
    defined = next(e for e in events if isinstance(e, UserDefineOutcome))
    assert defined.id == outcome_id_event and defined.outcome_id.startswith("outc_") and defined.max_iterations == 3
    starts = [e for e in events if isinstance(e, SpanOutcomeEvaluationStart)]
    ends = [e for e in events if isinstance(e, SpanOutcomeEvaluationEnd)]
    assert [s.iteration for s in starts] == [0, 1] and [e.iteration for e in ends] == [0, 1]
    assert [e.outcome_evaluation_start_id for e in ends] == [s.id for s in starts]
    assert all(e.outcome_id == defined.outcome_id for e in [*starts, *ends])
    assert ends[0].usage.output_tokens > 0, "the grader's usage is on its span"
    # The agent read the grader's explanation before revising; the grader read the agent's work.
    requests = stack.requests(model)
    agent_asks = [r["body"] for r in requests if not any(t["name"] == GRADER_TOOL for t in r["body"].get("tools", []))]
    grader_asks = [r["body"] for r in requests if any(t["name"] == GRADER_TOOL for t in r["body"].get("tools", []))]
    assert "Only one line; write three." in str(agent_asks[-1]["messages"]) and len(grader_asks) == 2
    assert "Rivers run." in str(grader_asks[0]["messages"]) and "Three lines; mentions water." in str(grader_asks[0])
    (state,) = await evaluations(handle)
    assert (state.outcome_id, state.result, state.iteration) == (defined.outcome_id, "satisfied", 1)
    assert state.explanation == "Three lines." and state.completed_at is not None
    info = await handle.query("session", result_type=SessionInfo)
    assert info.usage.output_tokens >= sum(e.usage.output_tokens for e in ends), "the grader's usage is the session's"


async def test_max_iterations_reached_gets_one_acknowledgment_turn(stack: Stack) -> None:
    model = graded(stack, [{"text": "try 1"}, {"text": "try 2"}, {"text": "Not met: the sea is missing."}],
                   [verdict("needs_revision", "No sea.")])  # fmt: skip
    handle = await stack.start(model)
    await send_events(handle, [outcome(max_iterations=2)])
    events = await wait_for_idle(handle)
    assert shape(events) == [
        "user.define_outcome",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:needs_revision",
        "agent.message",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end:max_iterations_reached",
        "agent.message",
    ], "the acknowledgment turn is not graded"
    assert texts(events)[-1] == "Not met: the sea is missing."
    (state,) = await evaluations(handle)
    assert (state.result, state.iteration) == ("max_iterations_reached", 1)
    ack_request = stack.requests(model)[-1]["body"]
    assert "no more evaluation follows" in str(ack_request["messages"])


async def test_an_interrupt_while_the_grader_works_ends_the_outcome_interrupted(stack: Stack) -> None:
    model = graded(stack, [{"text": "done, I think"}],
                   [verdict("satisfied", "fine", first_token_latency=120)])  # fmt: skip
    handle = await stack.start(model)
    await send_events(handle, [outcome()])

    async def heartbeat() -> bool:
        return any(isinstance(e, SpanOutcomeEvaluationOngoing) for e in await read_events(handle))

    await until(heartbeat, "a span.outcome_evaluation_ongoing while the grader works", within=60)
    assert (await evaluations(handle))[0].result == "evaluating"
    await send_events(handle, [{"type": "user.interrupt"}])
    events = await wait_for_idle(handle)
    (end,) = [e for e in events if isinstance(e, SpanOutcomeEvaluationEnd)]
    (start,) = [e for e in events if isinstance(e, SpanOutcomeEvaluationStart)]
    assert (end.result, end.outcome_evaluation_start_id) == ("interrupted", start.id)
    (state,) = await evaluations(handle)
    assert state.result == "interrupted" and state.completed_at is not None


async def test_one_outcome_at_a_time_and_a_file_rubric_is_refused_at_the_edge(stack: Stack) -> None:
    model = graded(stack, [{"text": "working"}], [verdict("satisfied", "ok", first_token_latency=120)])
    handle = await stack.start(model)
    await send_events(handle, [outcome()])
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [outcome(description="another")])
    assert isinstance(refused.value.cause, ApplicationError) and refused.value.cause.type == OUTCOME_IN_PROGRESS
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"rubric": {"type": "file", "file_id": "file_123"}}, "send the rubric as text"),
        ({"max_iterations": 21}, "max_iterations"),
        ({"description": " "}, "description"),
    ]
    for bad, why in refusals:
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await send_events(handle, [{**outcome(), **bad}])
        assert why in str(refused.value.cause)
    defined = [e for e in await read_events(handle) if isinstance(e, UserDefineOutcome)]
    assert len(defined) == 1, "nothing refused was written"


async def test_the_grader_reads_the_files_its_rubric_names_through_the_hand(sandbox_stack: Stack) -> None:
    stack = sandbox_stack
    write = {"name": "write", "input": {"file_path": "/workspace/poem.txt", "content": "water / stone / sea"}}
    model = graded(stack, [{"tool_uses": [write]}, {"text": "Written to /workspace/poem.txt."}],
                   [verdict("satisfied", "The file has three lines.")])  # fmt: skip
    handle = await stack.start(model, tools=TOOLSET)
    await send_events(handle, [outcome(rubric="/workspace/poem.txt holds three lines.")])
    events = await wait_for_idle(handle)
    assert shape(events)[-1] == "span.outcome_evaluation_end:satisfied"
    (grader_ask,) = [r["body"] for r in stack.requests(model) if r["body"].get("tools", [{}])[0]["name"] == GRADER_TOOL]
    shown = grader_ask["messages"][0]["content"][0]["text"]
    assert '<file path="/workspace/poem.txt">' in shown and "water / stone / sea" in shown, shown


async def test_an_outcome_is_pursued_across_a_hand_over(stack: Stack) -> None:
    """Twenty cycles outgrow a run's history: the session continues as new mid-outcome and the next run carries on
    grading it, with its cycle count, to the end."""
    model = graded(stack, [{"text": "another try"}], [verdict("needs_revision", "Not yet.")], loop=True)
    handle = await stack.start(model, continue_as_new_after_events=200)
    first_run = (await handle.describe()).run_id
    await send_events(handle, [outcome(max_iterations=20)])

    async def ended() -> bool:
        return (await evaluations(handle))[0].result == "max_iterations_reached"

    await until(ended, "the outcome's twentieth cycle", within=120)
    assert (await handle.describe()).run_id != first_run, "the session continued as new while pursuing it"
    ends = [e for e in await read_events(handle) if isinstance(e, SpanOutcomeEvaluationEnd)]
    assert [e.iteration for e in ends] == list(range(20)) and ends[-1].result == "max_iterations_reached"
