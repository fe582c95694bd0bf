"""Session budgets: a spending limit at list price (issue 13, part 4b).

Through the Temporal client, on the real dev server and the offline model server (whose usage numbers are its own
token estimates): the budget is reached after the turn whose cost crosses it, that reply's tool calls are answered
with an error, the next message goes idle again without a model call, and what was spent survives continue-as-new.
Through a real gateway with the `anthropic` SDK: a session shows its budget and `usage.list_cost`, and a budget on a
model with no list price is refused with upstream's `model_not_budgetable`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import ValidationError

from corral.apikeys import create_key
from corral.client import send_text, session_info
from corral.contract.events import AgentToolResult, BudgetReached, EndTurn, ModelUsage, SessionEvent
from corral.contract.pricing import PRICES_ENVIRONMENT_VARIABLE, ModelPrice, NotBudgetable, list_cost, price_of
from corral.contract.session import SessionInput
from corral.records import Records
from tests.chaos._processes import role_process, until_healthy
from tests.conftest import Stack, assert_log_is_whole, read_events, stop_reason, unique, wait_for_idle
from tests.ports import free_port
from workflows.session import BUDGET_SPENT_RESULT

pytestmark = pytest.mark.timeout(300)

CENT_PER_OUTPUT_TOKEN = {"input": "0", "output": "10000", "cache_read": "0", "cache_write": "0"}
"""$10,000 per million output tokens is one cent a token: a session's spend is its output tokens, in cents."""
TOOL_STEP = {"text": "Working on it, one more step.", "tool_uses": [{"name": "echo", "input": {"text": "x"}}]}


def budget(cents: int, price: dict[str, str] | None = CENT_PER_OUTPUT_TOKEN) -> dict[str, Any]:
    return {"type": "limit", "max_list_cost": {"amount": str(cents), "currency": "USD"}, "price": price}


def output_tokens_per_request(events: list[SessionEvent]) -> list[int]:
    return [e.model_usage.output_tokens for e in events if e.type == "span.model_request_end" and not e.is_error]


def assert_stopped_at_the_crossing(costs: list[int], limit: int) -> None:
    """The session took model turns until, and only until, their running total reached the limit."""
    totals = [sum(costs[: i + 1]) for i in range(len(costs))]
    assert totals[-1] >= limit, totals
    assert all(total < limit for total in totals[:-1]), f"a turn was taken after the budget was spent: {totals}"


# ---- the price table (pure) ---------------------------------------------------------------------------------


def test_list_cost_is_in_cents_rounded_up_and_unpriced_models_are_refused() -> None:
    usage = ModelUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert list_cost("claude-sonnet-4-6", usage) == 1800  # $3 + $15
    assert list_cost("claude-haiku-4-5-20251001", ModelUsage(output_tokens=1)) == 1  # $0.000005, rounded up
    cached = ModelUsage(cache_read_input_tokens=1_000_000, cache_creation_input_tokens=1_000_000)
    assert list_cost("claude-opus-4-5", cached) == 675  # $0.50 + $6.25
    assert list_cost("claude-opus-4-5", ModelUsage()) == 0
    assert price_of("script:anything") is None
    with pytest.raises(NotBudgetable, match="model 'script:x' has no list price: a budget cannot be enforced"):
        list_cost("script:x", usage)
    given = ModelPrice.model_validate(CENT_PER_OUTPUT_TOKEN)
    assert list_cost("script:x", ModelUsage(input_tokens=10**9, output_tokens=7), given) == 7
    assert given.output == Decimal("10000")


def test_a_budget_is_validated_before_a_session_starts() -> None:
    agent = {"model": "claude-sonnet-4-6"}
    input = SessionInput.model_validate({"agent": agent, "budget": budget(2500, None)})  # priced from the table
    assert input.budget is not None and input.budget_price() == price_of("claude-sonnet-4-6")
    for bad, why in [
        (budget(0), "amount"),
        ({**budget(5), "max_list_cost": {"amount": "0250", "currency": "USD"}}, "amount"),
        ({**budget(5), "max_list_cost": {"amount": "2.50", "currency": "USD"}}, "amount"),
        ({**budget(5), "max_list_cost": {"amount": "250", "currency": "EUR"}}, "currency"),
        ({**budget(5), "type": "unlimited"}, "type"),
    ]:
        with pytest.raises(ValidationError, match=why):
            SessionInput.model_validate({"agent": agent, "budget": bad})
    with pytest.raises(ValidationError, match="has no list price: a budget cannot be enforced"):
        SessionInput.model_validate({"agent": {"model": "script:unpriced"}, "budget": budget(5, None)})


# ---- sessions, through the Temporal client ------------------------------------------------------------------


async def test_the_budget_ends_the_turn_and_later_messages_without_a_model_call(stack: Stack) -> None:
    model = stack.script([TOOL_STEP], loop=True)  # a tool call every turn: only the budget ends it
    tools = [stack.hand_tool("echo", text={"type": "string"})]
    limit = 40
    handle = await stack.start(model, "go", agent={"model": model, "tools": tools}, budget=budget(limit))
    first = await wait_for_idle(handle)
    assert stop_reason(first[-1]) == BudgetReached()
    costs = output_tokens_per_request(first)
    assert len(costs) >= 2, "the budget should allow more than one turn"
    assert_stopped_at_the_crossing(costs, limit)
    assert len(stack.requests(model)) == len(costs)

    # Every call but those of the last reply ran; those are answered with the budget's error, so the conversation
    # stays valid.
    results = [e for e in first if isinstance(e, AgentToolResult)]
    assert len(results) == len(costs)
    assert [(r.is_error, r.content[0].text) for r in results[-1:]] == [(True, BUDGET_SPENT_RESULT)]
    assert all(not r.is_error for r in results[:-1])
    info = await session_info(handle)
    assert (info.status, info.stop_reason, info.list_cost) == ("idle", "budget_reached", sum(costs))
    assert info.budget is not None and info.budget.max_list_cost.amount == str(limit)

    # A new message: idle again at once, with no model call.
    await send_text(handle, "and now?")
    second = await wait_for_idle(handle, after=first[-1].position)
    assert [e.type for e in second] == ["user.message", "session.status_running", "session.status_idle"]
    assert stop_reason(second[-1]) == BudgetReached()
    assert len(stack.requests(model)) == len(costs), "the model was called after the budget was spent"
    assert (await session_info(handle)).list_cost == sum(costs)
    assert_log_is_whole(await read_events(handle))


async def test_a_turn_that_ends_under_budget_ends_as_usual(stack: Stack) -> None:
    model = stack.script([{"text": "Short answer."}, {"text": "Another short answer."}])
    handle = await stack.start(model, "hi", budget=budget(1_000))
    first = await wait_for_idle(handle)
    assert stop_reason(first[-1]) == EndTurn()
    await send_text(handle, "again")
    second = await wait_for_idle(handle, after=first[-1].position)
    assert stop_reason(second[-1]) == EndTurn()
    info = await session_info(handle)
    assert info.list_cost == sum(output_tokens_per_request(first + second)) < 1_000


async def test_what_was_spent_survives_continue_as_new(stack: Stack) -> None:
    model = stack.script([TOOL_STEP], loop=True)
    tools = [stack.hand_tool("echo", text={"type": "string"})]
    limit = 300  # tens of turns: more than one run of 200 history events
    handle = await stack.start(
        model, "go", agent={"model": model, "tools": tools}, budget=budget(limit), continue_as_new_after_events=200
    )
    events = await wait_for_idle(handle, within_seconds=240)
    info = await session_info(handle)
    assert info.run > 1, "the session should have continued as new on the way"
    assert stop_reason(events[-1]) == BudgetReached()
    whole = await read_events(handle)  # across the runs, from the archive
    assert_log_is_whole(whole)
    costs = output_tokens_per_request(whole)
    # Had the spend restarted at the hand-over, the session would have gone on past the crossing.
    assert_stopped_at_the_crossing(costs, limit)
    assert info.list_cost == sum(costs)
    assert len(stack.requests(model)) == len(costs)

    await send_text(handle, "more?")
    again = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(again[-1]) == BudgetReached()
    assert len(stack.requests(model)) == len(costs)


# ---- through the gateway, with the anthropic SDK --------------------------------------------------------------


class PricedGateway:
    """A gateway process that prices one of the offline model server's script models through
    `CORRAL_MODEL_PRICES`, as a deployment would price a model its table lacks."""

    def __init__(self, url: str, records: Records, priced_model: str) -> None:
        self.url, self.records, self.priced_model = url, records, priced_model

    async def client(self, workspace: str) -> anthropic.AsyncAnthropic:
        key, _ = await create_key(self.records, workspace)
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0)


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[PricedGateway]:
    priced = unique("priced")
    port = free_port()
    address = stack.client.service_client.config.target_host
    argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", stack.harness_queue, "--model-queue", stack.model_queue]  # fmt: skip
    prices = json.dumps({f"script:{priced}": CENT_PER_OUTPUT_TOKEN})
    with role_process("gateway", argv, tmp_path, **{PRICES_ENVIRONMENT_VARIABLE: prices}) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        yield PricedGateway(url, Records(stack.client, task_queue=stack.harness_queue), priced)


async def test_a_session_shows_its_budget_and_list_cost(stack: Stack, gateway: PricedGateway) -> None:
    stack.model_server.register(gateway.priced_model, {"steps": [TOOL_STEP], "loop": True})
    model = f"script:{gateway.priced_model}"
    client = await gateway.client("team-a")
    agent = await client.beta.agents.create(name="spender", model=model, tools=[
        {"type": "custom", "name": "echo", "description": "echo", "input_schema": {"type": "object"}}
    ])  # fmt: skip
    environment = await client.beta.environments.create(name="plain")
    limit: Any = {"type": "limit", "max_list_cost": {"amount": "40", "currency": "USD"}}
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, budget=limit)
    assert session.budget is not None and session.budget.model_dump() == limit
    assert session.usage.list_cost is not None
    assert (session.usage.list_cost.amount, session.usage.list_cost.currency) == ("0", "USD")

    # A custom tool call makes the session wait for the client: answered each time, until the budget is spent.
    await client.beta.sessions.events.send(session.id, events=[{"type": "user.message", "content": [
        {"type": "text", "text": "go"}]}])  # fmt: skip
    handle = stack.client.get_workflow_handle(session.id)
    after = 0
    while True:
        events = await wait_for_idle(handle, after=after)
        after = events[-1].position
        reason = stop_reason(events[-1])
        if reason.type == "budget_reached":
            break
        assert reason.type == "requires_action"
        answers: list[Any] = [{"type": "user.custom_tool_result", "custom_tool_use_id": use_id,
                    "content": [{"type": "text", "text": "x"}]} for use_id in reason.event_ids]  # fmt: skip
        await client.beta.sessions.events.send(session.id, events=answers)

    whole = await read_events(handle)
    costs = output_tokens_per_request(whole)
    assert_stopped_at_the_crossing(costs, 40)
    retrieved = await client.beta.sessions.retrieve(session.id)
    assert retrieved.usage.list_cost is not None and retrieved.usage.list_cost.amount == str(sum(costs))
    assert retrieved.budget is not None and retrieved.budget.max_list_cost.amount == "40"
    idle = [e async for e in client.beta.sessions.events.list(session.id, types=["session.status_idle"])]
    assert idle[-1].model_dump()["stop_reason"] == {"type": "budget_reached"}
    listed = [s async for s in client.beta.sessions.list() if s.id == session.id]
    assert listed[0].budget is not None and listed[0].budget.max_list_cost.amount == "40"


async def test_a_budget_on_a_model_with_no_price_is_refused(stack: Stack, gateway: PricedGateway) -> None:
    client = await gateway.client("team-a")
    model = stack.script([{"text": "never"}])  # not priced by the gateway's CORRAL_MODEL_PRICES
    agent = await client.beta.agents.create(name="unpriced", model=model)
    environment = await client.beta.environments.create(name="plain")
    limit: Any = {"type": "limit", "max_list_cost": {"amount": "2500", "currency": "USD"}}
    before = [s.id async for s in client.beta.sessions.list()]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, budget=limit)
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["message"] == f"budget: model {model!r} has no list price: a budget cannot be enforced"
    assert error["details"] == {"error_code": "model_not_budgetable"}
    bad: Any = {"type": "limit", "max_list_cost": {"amount": "25.00", "currency": "USD"}}
    with pytest.raises(anthropic.BadRequestError, match="budget"):
        await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, budget=bad)
    assert [s.id async for s in client.beta.sessions.list()] == before, "a refused session was started"
    assert not stack.requests(model)


async def test_a_budget_is_raised_or_removed_but_never_added(stack: Stack, gateway: PricedGateway) -> None:
    stack.model_server.register(gateway.priced_model, {"steps": [{"text": "a reply of a few tokens"}], "loop": True})
    client = await gateway.client("team-a")
    agent = await client.beta.agents.create(name="spender", model=f"script:{gateway.priced_model}")
    environment = await client.beta.environments.create(name="plain")

    def limit(cents: int) -> Any:
        return {"type": "limit", "max_list_cost": {"amount": str(cents), "currency": "USD"}}

    async def turn(text: str, after: int) -> list[SessionEvent]:
        message: Any = {"type": "user.message", "content": [{"type": "text", "text": text}]}
        await client.beta.sessions.events.send(session.id, events=[message])
        return await wait_for_idle(stack.client.get_workflow_handle(session.id), after=after)

    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, budget=limit(1))
    first = await turn("go", 0)
    assert stop_reason(first[-1]) == BudgetReached()
    spent = int((await client.beta.sessions.retrieve(session.id)).usage.list_cost.amount)  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.beta.sessions.update(session.id, budget=limit(spent))
    assert refused.value.body["error"]["details"] == {"error_code": "budget_not_raised"}  # type: ignore[index]

    raised = await client.beta.sessions.update(session.id, budget=limit(spent + 1_000))
    assert raised.budget is not None and raised.budget.max_list_cost.amount == str(spent + 1_000)
    second = await turn("again", first[-1].position)
    assert stop_reason(second[-1]) == EndTurn(), "the raised budget lets the session take a model turn again"

    removed = await client.beta.sessions.update(session.id, budget=None)
    assert removed.budget is None and (await client.beta.sessions.retrieve(session.id)).budget is None
    with pytest.raises(anthropic.BadRequestError) as again:
        await client.beta.sessions.update(session.id, budget=limit(5_000))
    assert again.value.body["error"]["details"] == {"error_code": "budget_create_only"}  # type: ignore[index]
    plain = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    with pytest.raises(anthropic.BadRequestError, match="a budget is set when a session is created"):
        await client.beta.sessions.update(plain.id, budget=limit(5_000))
    with pytest.raises(anthropic.BadRequestError, match="vault_ids"):
        await client.beta.sessions.update(plain.id, vault_ids=["vlt_x"])
