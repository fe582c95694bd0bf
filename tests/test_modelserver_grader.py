"""The offline model server as an outcome's grader: its default model answers a grader's request (one that offers
the `outcome_verdict` tool) with a verdict, and a script answers the grader in script order, between the agent's
turns, as a test writes an outcome down: the work, the verdict, the revision, the next verdict."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from corral.contract.outcomes import GRADER_SCHEMA, GRADER_SYSTEM, GRADER_TOOL, Verdict, grader_prompt
from modelserver import ModelServerThread, Script
from modelserver.demo import MARKER, plan_demo
from modelserver.scripts import ApiError, Plan, ScriptBook, TextBlock, ToolUseBlock

GRADER_TOOLS = [{"name": GRADER_TOOL, "description": "your verdict", "input_schema": GRADER_SCHEMA}]


def grader_request(transcript: list[str], model: str = "claude-sonnet-4-6", cycle: int = 0) -> dict[str, Any]:
    """A request as corral's grader makes it (its system, its one prompt, its one tool)."""
    prompt = grader_prompt("a haiku about rain", "three lines; mentions rain", transcript, {}, cycle, 3)
    return {"model": model, "max_tokens": 4096, "system": GRADER_SYSTEM, "tools": GRADER_TOOLS,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip


def agent_request(*turns: str) -> dict[str, Any]:
    """An agent's request: user and assistant messages alternating, from the user's, ending with the user's."""
    roles = ("user", "assistant")
    return {"messages": [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]}


def verdict_of(plan: Plan | ApiError) -> Verdict:
    assert isinstance(plan, Plan), plan
    [block] = [b for b in plan.blocks if isinstance(b, ToolUseBlock)]
    assert block.name == GRADER_TOOL and plan.stop_reason == "tool_use"
    return Verdict.model_validate(block.input)


def said(plan: Plan | ApiError) -> str:
    assert isinstance(plan, Plan), plan
    return "".join(b.text for b in plan.blocks if isinstance(b, TextBlock))


def test_the_default_model_is_satisfied_by_work_and_asks_for_it_when_there_is_none() -> None:
    work = ["user: write a haiku about rain", "agent: Rain on the tin roof / ..."]
    satisfied = verdict_of(plan_demo(grader_request(work)))
    assert satisfied.result == "satisfied"
    assert satisfied.explanation.startswith(MARKER) and "Rain on the tin roof" in satisfied.explanation
    assert "not a real model" in satisfied.explanation, "the stand-in says it did not judge"
    nothing = verdict_of(plan_demo(grader_request([])))
    assert nothing.result == "needs_revision" and "no work" in nothing.explanation
    assert not any(isinstance(b, ToolUseBlock) for b in plan_demo(agent_request("hello")).blocks)


VERDICT = {"name": GRADER_TOOL, "input": {"result": "needs_revision", "explanation": "it does not rhyme"}}
SATISFIED = {"name": GRADER_TOOL, "input": {"result": "satisfied", "explanation": "it rhymes now"}}


def test_a_script_answers_the_grader_in_script_order_between_the_agents_turns() -> None:
    book = ScriptBook()
    steps = [{"text": "draft"}, {"tool_uses": [VERDICT]}, {"text": "revised"}, {"tool_uses": [SATISFIED]},
             {"text": "anything else?"}]  # fmt: skip
    book.register("s", Script.model_validate({"steps": steps}))
    assert said(book.play("s", agent_request("write"), "x-api-key")) == "draft"
    first = grader_request(["agent: draft"])
    assert verdict_of(book.play("s", first, "x-api-key")).result == "needs_revision"
    assert verdict_of(book.play("s", first, "x-api-key")).result == "needs_revision", "a retry gets its step again"
    revision = agent_request("write", "draft", "[The grader evaluated your work (cycle 1): it needs revision.]")
    assert said(book.play("s", revision, "x-api-key")) == "revised", "the agent's turns skip the grader's steps"
    assert said(book.play("s", agent_request("write"), "x-api-key")) == "draft", "an agent's retry keeps its step"
    second = grader_request(["agent: revised"], cycle=1)
    assert verdict_of(book.play("s", second, "x-api-key")).result == "satisfied"
    later = agent_request("write", "draft", "revise", "revised", "thanks")
    assert said(book.play("s", later, "x-api-key")) == "anything else?"
    past = book.play("s", grader_request(["agent: anything else?"]), "x-api-key")
    assert isinstance(past, ApiError) and "the grader's request is step 5" in past.message
    assert [entry["step"] for entry in book.requests_for("s") or []] == [0, 1, 1, 2, 0, 3, 4, None]


def test_a_graders_call_that_failed_is_retried_on_its_step_and_one_without_a_verdict_moves_on() -> None:
    book = ScriptBook()
    steps = [{"text": "draft"}, {"tool_uses": [VERDICT], "fail": [{"status": 529}]}, {"text": "revised"},
             {"text": "no verdict here"}, {"tool_uses": [SATISFIED]}]  # fmt: skip
    book.register("s", Script.model_validate({"steps": steps}))
    book.play("s", agent_request("write"), "x-api-key")
    first = grader_request(["agent: draft"])
    failed = book.play("s", first, "x-api-key")
    assert isinstance(failed, ApiError) and failed.status == 529
    assert verdict_of(book.play("s", first, "x-api-key")).result == "needs_revision", "the retry plays the same step"
    assert said(book.play("s", agent_request("write", "draft", "revise"), "x-api-key")) == "revised"
    second = grader_request(["agent: revised"], cycle=1)
    assert said(book.play("s", second, "x-api-key")) == "no verdict here"
    assert verdict_of(book.play("s", second, "x-api-key")).result == "satisfied", "asked again: the next step"


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServerThread]:
    with ModelServerThread() as running:
        yield running


async def test_the_sdk_reads_a_verdict_streamed_by_the_default_model_and_by_a_script(server: ModelServerThread) -> None:
    client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test-key", max_retries=0)
    server.register("graded", {"steps": [{"text": "draft"}, {"tool_uses": [VERDICT]}]})
    try:
        for model, result in (("claude-sonnet-4-6", "satisfied"), ("script:graded", "needs_revision")):
            if model.startswith("script:"):
                await client.messages.create(model=model, max_tokens=100, messages=[{"role": "user", "content": "go"}])
            request = grader_request(["agent: draft"], model)
            async with client.messages.stream(**request) as stream:
                message = await stream.get_final_message()
            [use] = [block for block in message.content if block.type == "tool_use"]
            assert (use.name, message.stop_reason) == (GRADER_TOOL, "tool_use")
            assert Verdict.model_validate(use.input).result == result, model
    finally:
        await client.close()
