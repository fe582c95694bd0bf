"""The whole way, as a user sets it up: an endpoint registered over the API, a receiver that verifies each delivery
with `client.beta.webhooks.unwrap` as a user's server would, and the events of real work arriving signed: a session
that waits for a custom tool's result (`session.requires_action`), its turns' ends (`session.status_idled`), an
outcome graded (`session.outcome_evaluation_ended`) and a deployment's manual run (`deployment_run.succeeded`).

Every role is the real one: the gateway is a process (logged in to the dev Vault with its write-only AppRole, where
it writes the signing secret), the session's events go through the model workers' `emit_webhooks`, the delivery
workflows run on the harness, and the proxy worker alone reads the secret and sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.apikeys import create_key
from corral.contract.webhooks import keyed_event_id
from corral.records import Records
from proxy import VaultStore
from tests.chaos._processes import role_process, until_healthy
from tests.conftest import Stack, unique
from tests.ports import free_port
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.test_api_outcomes import outcome, verdict
from tests.test_gateway import gateway_argv
from tests.test_gateway_sessions import WEATHER, events_until_idle, result, text
from tests.test_gateway_vaults import vault_login_env
from tests.waits import until
from workers.proxy import proxy_worker

pytestmark = pytest.mark.timeout(300)
JSON = dict[str, Any]
WANTED = ["session.requires_action", "session.status_idled", "deployment_run.succeeded",
          "session.outcome_evaluation_ended"]  # fmt: skip
TOOL: Any = WEATHER


@pytest.fixture
async def api(stack: Stack, tmp_path: Path) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """A gateway process as `corral up` runs it (Vault's write-only login), its deliveries sent from this test's
    proxy queue and its deployment fires opened on a queue of its own; a client of a new workspace."""
    dev_vault, env, port = shared_dev_vault(), vault_login_env(), free_port()
    argv = gateway_argv(stack, port, "--gateway-queue", unique("gateway"), "--proxy-queue", stack.proxy_queue)
    store = VaultStore(dev_vault.client(), dev_vault.mount)
    sender = proxy_worker(stack.client, ProxyActivities(store), stack.proxy_queue,
                          webhooks=WebhookDeliveryActivities(store))  # fmt: skip
    with role_process("gateway", argv, tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        key, _ = await create_key(Records(stack.client, task_queue=stack.harness_queue), unique("receiving"))
        async with sender, anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as client:
            yield client


async def test_a_users_receiver_gets_the_events_of_real_work_signed(
    stack: Stack, api: anthropic.AsyncAnthropic, receiver: WebhookReceiver
) -> None:
    made: JSON = await api.post("/v1/webhook_endpoints", cast_to=JSON,
                                body={"url": receiver.url("/hooks"), "events": WANTED})  # fmt: skip
    receiver.keys["/hooks"] = made["secret"]
    environment = await api.beta.environments.create(name="plain")

    # A session that asks the client for a tool's result, then ends its turn once it has it.
    asking = await api.beta.agents.create(
        name="asker", tools=[TOOL],
        model=stack.script([{"tool_uses": [{"name": "weather", "input": {"city": "Oslo"}}]}, {"text": "Cold."}]),
    )  # fmt: skip
    session = await api.beta.sessions.create(agent=asking.id, environment_id=environment.id)
    await api.beta.sessions.events.send(session.id, events=[text("weather in Oslo?")])
    asked = await events_until_idle(api, session.id, 0)
    (use,) = [event for event in asked if event.type == "agent.custom_tool_use"]
    await api.beta.sessions.events.send(session.id, events=[result(use.id, "-3 C")])
    await events_until_idle(api, session.id, len(asked))

    # An outcome, graded satisfied.
    poet = await api.beta.agents.create(
        name="poet", model=stack.script([{"text": "Water runs / under the bridge / to the sea."},
                                         verdict("satisfied", "Three lines, and water.")]),
    )  # fmt: skip
    graded = await api.beta.sessions.create(agent=poet.id, environment_id=environment.id, initial_events=[outcome()])

    # A deployment, run by hand.
    nightly = await api.beta.agents.create(name="nightly", model=stack.script([{"text": "done"}], loop=True))
    deployment = await api.beta.deployments.create(agent=nightly.id, environment_id=environment.id, name="nightly",
                                                   initial_events=[text("go")])  # fmt: skip
    run = await api.beta.deployments.run(deployment.id)
    assert run.session_id is not None

    def arrived() -> set[tuple[str, str]]:
        return {(event.data.type, event.data.id) for event in receiver.events("/hooks")}

    expected = {("session.requires_action", session.id), ("session.status_idled", session.id),
                ("session.outcome_evaluation_ended", graded.id), ("deployment_run.succeeded", run.id)}  # fmt: skip
    await until(lambda: expected <= arrived(), "the four kinds of event, verified by the SDK", within=120)
    assert receiver.ids("/hooks", verified=False) == [], "every delivery verified with the endpoint's secret"
    events = receiver.events("/hooks")
    assert {event.data.type for event in events} <= set(WANTED), "only the types the endpoint asked for"
    assert all(event.data.workspace_id == events[0].data.workspace_id for event in events)
    idles = [event for event in events if (event.data.type, event.data.id) == ("session.status_idled", session.id)]
    assert len(idles) == 2, "one per turn of the asking session: the wait for the tool's result, then the end"
    verified = receiver.ids("/hooks")
    assert len(verified) == len(set(verified)) == len(events), "each event once, by its webhook-id"


async def test_a_session_emits_nothing_until_its_workspace_has_an_endpoint(
    stack: Stack, api: anthropic.AsyncAnthropic, receiver: WebhookReceiver
) -> None:
    """A session made before its workspace had an endpoint is told when one is registered (the gateway signals the
    workspace's running sessions): its next turn's idle arrives, its first turn's never does."""
    agent = await api.beta.agents.create(name="helper", model=stack.script([{"text": "one"}, {"text": "two"}]))
    environment = await api.beta.environments.create(name="plain")
    session = await api.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    await api.beta.sessions.events.send(session.id, events=[text("go")])
    first = await events_until_idle(api, session.id, 0)

    made: JSON = await api.post("/v1/webhook_endpoints", cast_to=JSON,
                                body={"url": receiver.url("/late"), "events": ["session.idled"]})  # fmt: skip
    receiver.keys["/late"] = made["secret"]
    await api.beta.sessions.events.send(session.id, events=[text("again")])
    second = await events_until_idle(api, session.id, len(first))
    await until(lambda: receiver.events("/late"), "the second turn's idle, delivered")
    (idled,) = receiver.events("/late")
    idle = next(event for event in second if event.type == "session.status_idle")
    assert (idled.data.type, idled.data.id) == ("session.idled", session.id)
    assert idled.id == keyed_event_id(f"{idle.id}/session.idled"), "the second turn's, not the first's"
