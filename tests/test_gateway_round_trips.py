"""What one gateway send costs in Temporal round trips, counted at the wire: every RPC the gateway's client makes
goes through a `ServiceClient` that records it before passing it to the real one (so a describe, a query, an
update and any poll after it all count). The gateway is the real app served by uvicorn in this process (for its
client), driven over HTTP by the official `anthropic` SDK; Temporal is the dev server, the session a real
`SessionWorkflow`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

import anthropic
import pytest
import uvicorn
from google.protobuf.message import Message
from temporalio import workflow
from temporalio.client import Client
from temporalio.service import ServiceClient, ServiceResponse

from corral.apikeys import create_key
from corral.contract.session import SendEventsInput, SendEventsResult, SessionInput
from corral.names import SESSION_WORKFLOW, UPDATE_SEND_EVENTS
from corral.records import Records
from gateway.app import create_app
from tests.conftest import Stack, unique
from tests.ports import free_port
from tests.waits import until
from workers.roles import harness_worker
from workflows import SessionWorkflow
from workflows.records import RecordWorkflow

pytestmark = pytest.mark.timeout(300)

SEND_ROUND_TRIPS = ["describe_workflow_execution", "update_workflow_execution"]
"""A send: the session's description (its kind, workspace, state and agent), then the update, which answers with
the events it wrote."""


class CountingServiceClient(ServiceClient):
    """The real service client, with each call's RPC name and the workflow it addresses written down first."""

    def __init__(self, inner: ServiceClient) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    @property
    def worker_service_client(self) -> Any:
        return self.inner.worker_service_client

    def update_rpc_metadata(self, metadata: Mapping[str, str | bytes]) -> None:
        self.inner.update_rpc_metadata(metadata)

    def update_api_key(self, api_key: str | None) -> None:
        self.inner.update_api_key(api_key)

    async def _rpc_call(
        self,
        rpc: str,
        req: Message,
        resp_type: type[ServiceResponse],
        *,
        service: str,
        retry: bool,
        metadata: Mapping[str, str | bytes],
        timeout: timedelta | None,
    ) -> ServiceResponse:
        self.calls.append((rpc, _workflow_id(req)))
        return await self.inner._rpc_call(
            rpc, req, resp_type, service=service, retry=retry, metadata=metadata, timeout=timeout
        )


def _workflow_id(request: Message) -> str:
    """The workflow a request addresses, wherever its message keeps it ("" for none)."""
    for path in ("execution", "workflow_execution", "update_ref.workflow_execution"):
        message: Any = request
        for name in path.split("."):
            if name not in message.DESCRIPTOR.fields_by_name:
                break
            message = getattr(message, name)
        else:
            return str(message.workflow_id)
    return str(getattr(request, "workflow_id", ""))


@workflow.defn(name=SESSION_WORKFLOW)
class OlderSessionWorkflow(SessionWorkflow):
    """The harness as it was before `SendEventsResult.events`: a send is answered with the ids alone."""

    @workflow.run
    async def run(self, input: SessionInput) -> None:
        await super().run(input)

    @workflow.update(name=UPDATE_SEND_EVENTS)
    def send_events(self, input: SendEventsInput) -> SendEventsResult:  # type: ignore[override]
        self._runs.requests += 1  # the handler as it was
        return SendEventsResult(event_ids=self._inbox.accept_batch(input))


Counted = tuple[anthropic.AsyncAnthropic, CountingServiceClient, str]


@pytest.fixture
async def counted(stack: Stack) -> AsyncIterator[Counted]:
    async with gateway_app(stack, stack.harness_queue) as running:
        yield running


@contextlib.asynccontextmanager
async def gateway_app(stack: Stack, harness_queue: str) -> AsyncIterator[Counted]:
    """An SDK client of a new key, on the gateway app whose Temporal client counts its calls, and the key's
    record id (its verification is cached by the gateway: not part of a send)."""
    wire = CountingServiceClient(stack.client.service_client)
    config = stack.client.config()
    config["service_client"] = wire
    client = Client(**config)
    app = create_app(client, harness_queue, stack.model_queue)
    key, record = await create_key(Records(stack.client, task_queue=harness_queue), unique("trips"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or serving.done(), "the gateway app to listen")
        assert not serving.done(), "the gateway app did not start"
        port = server.config.port
        async with anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key=key, max_retries=0) as sdk:
            yield sdk, wire, record.id
    finally:
        server.should_exit = True
        await serving


async def test_a_send_costs_two_temporal_round_trips(stack: Stack, counted: Counted) -> None:
    client, wire, key_record = counted
    agent = await client.beta.agents.create(name="counted", model=stack.script([{"text": "ok"}], loop=True))
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)

    wire.calls.clear()
    sent = await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    )
    calls = [(rpc, target) for rpc, target in wire.calls if target != key_record]  # a key checked again, if slow
    assert [rpc for rpc, _ in calls] == SEND_ROUND_TRIPS, calls
    assert {target for _, target in calls} == {session.id}, calls

    # And the answer is the event as the log holds it.
    (event,) = sent.data or []
    listed = [e async for e in client.beta.sessions.events.list(session.id, types=["user.message"])]
    # (once the turn has taken it, the log's copy has a `processed_at` too: the answer is the event as written)
    assert [e.model_dump(exclude={"processed_at"}) for e in listed] == [event.model_dump(exclude={"processed_at"})]
    assert (event.type, event.model_dump()["content"][0]["text"]) == ("user.message", "hello")


async def test_a_send_to_an_older_harness_reads_the_events_back(stack: Stack) -> None:
    """A harness not yet upgraded answers with ids only: the gateway reads the events back from the log's end."""
    queue = unique("older-harness")
    async with harness_worker(stack.client, queue, workflows=[OlderSessionWorkflow, RecordWorkflow]):
        async with gateway_app(stack, queue) as (client, _, _):
            agent = await client.beta.agents.create(name="older", model=stack.script([{"text": "ok"}], loop=True))
            environment = await client.beta.environments.create(name="plain")
            session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
            sent = await client.beta.sessions.events.send(
                session.id,
                events=[{"type": "user.message", "content": [{"type": "text", "text": text}]} for text in "ab"],
            )
            listed = [e async for e in client.beta.sessions.events.list(session.id, types=["user.message"])]
            assert [e.id for e in listed] == [e.id for e in sent.data or []] and len(listed) == 2
            assert [e.model_dump()["content"][0]["text"] for e in sent.data or []] == ["a", "b"]
            await stack.client.get_workflow_handle(session.id).terminate("test finished")
