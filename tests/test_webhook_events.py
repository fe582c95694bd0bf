"""What corral tells a workspace's webhook endpoints: the events the API's writes make (gateway), the events a
session's log makes (the session workflow, through the model workers' `emit_webhooks`), each once per endpoint, and
nothing for a session nobody listens to until its workspace has an endpoint.

The deliveries themselves (signing, retries, the receiver) are tests/test_webhooks*.py's: here a delivery is seen as
the `WebhookDeliveryWorkflow` started for it, with the event it carries."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import Client

from corral.contract.events import (
    BudgetReached,
    EndTurn,
    RequiresAction,
    SessionStatusIdle,
    SessionStatusRunning,
    SessionThreadCreated,
)
from corral.contract.webhooks import WebhookDeliveryInput, WebhookEvent, delivery_workflow_id, keyed_event_id
from corral.knowledge_db import open_knowledge_db
from corral.names import WEBHOOK_DELIVERY_WORKFLOW
from corral.webhooks import WebhookEndpoints
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture
from tests.test_gateway_sessions import events_until_idle
from tests.waits import until
from workflows import webhook_types

pytestmark = pytest.mark.timeout(300)

RECEIVER = "http://127.0.0.1:9/never-listened-to"
"""Nobody answers here: these tests look at the deliveries started, not at what a receiver gets."""


def _event(cls: Any, **fields: Any) -> Any:
    from datetime import UTC, datetime

    return cls(id="sevt_1", position=1, created_at=datetime.now(UTC), processed_at=None, **fields)


def test_the_log_events_that_make_webhook_events() -> None:
    assert webhook_types(_event(SessionStatusRunning)) == ["session.status_run_started", "session.running"]
    assert webhook_types(_event(SessionStatusIdle, stop_reason=EndTurn())) == ["session.status_idled", "session.idled"]
    asked = _event(SessionStatusIdle, stop_reason=RequiresAction(event_ids=["sevt_2"]))
    assert webhook_types(asked) == ["session.status_idled", "session.requires_action"]
    spent = _event(SessionStatusIdle, stop_reason=BudgetReached())
    assert webhook_types(spent) == ["session.status_idled", "session.idled", "session.budget_reached"]
    thread = _event(SessionThreadCreated, session_thread_id="sthr_1", agent_name="helper")
    assert webhook_types(thread) == ["session.thread_created"]


async def deliveries(client: Client, harness_queue: str) -> list[WebhookEvent]:
    """The events of every delivery workflow started on `harness_queue` (read from each one's start input)."""
    query = f"WorkflowType = '{WEBHOOK_DELIVERY_WORKFLOW}' AND TaskQueue = '{harness_queue}'"
    found: list[WebhookEvent] = []
    async for execution in client.list_workflows(query):
        history = await client.get_workflow_handle(execution.id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        (delivery,) = await client.data_converter.decode(started.input.payloads, [WebhookDeliveryInput])
        assert execution.id == delivery_workflow_id(delivery.event.id, delivery.endpoint_id)
        found.append(delivery.event)
    return found


async def session_types(client: Client, queue: str, session_id: str) -> list[str]:
    return sorted(event.type for event in await deliveries(client, queue) if event.subject_id == session_id)


async def test_the_api_and_a_sessions_log_emit_their_events_to_the_workspaces_endpoint(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("hooked")
    workspace = f"hooked-{gateway.suffix}"
    endpoints = WebhookEndpoints(open_knowledge_db())
    endpoint = endpoints.create(workspace, RECEIVER, ["all"])
    other = endpoints.create(f"elsewhere-{gateway.suffix}", RECEIVER, ["all"])  # another tenant's: told nothing

    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "done"}]))
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]
    )
    log = await events_until_idle(client, session.id, 0)
    await client.beta.agents.archive(agent.id)

    expected = {
        (agent.id, "agent.created"),
        (agent.id, "agent.archived"),
        (environment.id, "environment.created"),
        (session.id, "session.created"),
        (session.id, "session.status_run_started"),
        (session.id, "session.running"),
        (session.id, "session.status_idled"),
        (session.id, "session.idled"),
    }

    async def all_started() -> bool:
        seen = {(event.subject_id, event.type) for event in await deliveries(stack.client, stack.harness_queue)}
        return expected <= seen

    await until(all_started, "a delivery for every event of the API's writes and of the session's turn")
    events = await deliveries(stack.client, stack.harness_queue)
    assert len({event.id for event in events}) == len(events), "each event is delivered once to the one endpoint"
    assert all(event.workspace == workspace for event in events)
    assert not any(event.workspace == other.workspace for event in events)
    idle = next(e for e in log if e.type == "session.status_idle")
    idled = next(e for e in events if e.type == "session.idled")
    assert idled.id == keyed_event_id(f"{idle.id}/session.idled"), "a session's event id is made from its log's"
    assert idled.payload()["data"] == {"type": "session.idled", "id": session.id, "organization_id": "corral",
                                       "workspace_id": workspace}  # fmt: skip
    await stack.client.get_workflow_handle(delivery_workflow_id(idled.id, endpoint.id)).describe()  # to this endpoint
