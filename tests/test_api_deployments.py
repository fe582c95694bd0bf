"""Deployments with the official SDK against a real gateway process (which serves the fire's activity on its own
queue) on the Temporal dev server: a one-minute cron that fires for real, a manual run, pause and unpause, an
archived agent whose next fire records `agent_archived_error` and pauses the deployment, and the 400s of the edge.

One test waits for the cron minute, to prove the spec fires end to end. The others that need a scheduled fire give
the deployment a yearly spec (`NEVER_DURING_A_TEST`) and fire its Schedule now with Temporal's trigger: the same
action, the same `DeploymentFireWorkflow` with trigger `schedule` and a `TemporalScheduledStartTime`, without the
wait of up to a minute.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from corral.contract.webhooks import WebhookDeliveryInput, delivery_workflow_id
from corral.knowledge_db import knowledge_db_path, open_knowledge_db
from corral.names import HARNESS_TASK_QUEUE, WEBHOOK_DELIVERY_WORKFLOW
from corral.records import Records
from corral.temporal import data_converter
from corral.webhooks import WebhookEndpoints, webhook_event_id
from tests.chaos._processes import role_process, temporal_env, until_healthy, worker_argv
from tests.conftest import Stack, unique
from tests.ports import free_port
from tests.test_gateway import Gateway, gateway_argv
from tests.test_threads_api import corral
from tests.waits import until

pytestmark = pytest.mark.timeout(400)

EVERY_MINUTE: Any = {"type": "cron", "expression": "* * * * *", "timezone": "UTC"}
NEVER_DURING_A_TEST: Any = {**EVERY_MINUTE, "expression": "0 0 1 1 *"}
"""Midnight on New Year's Day: a spec that does not fire while a test runs, so its fires are the test's triggers."""


def cron(expression: str) -> Any:
    return {**EVERY_MINUTE, "expression": expression}


def message(text: str) -> Any:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


class DeployGateway(Gateway):
    gateway_queue = ""
    """The queue its own worker (deployment fires) polls: the test's own."""


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[DeployGateway]:
    """A gateway process whose own worker (deployment fires) polls a queue of this test's."""
    port, queue = free_port(), unique("gateway")
    with role_process("gateway", gateway_argv(stack, port, "--gateway-queue", queue), tmp_path) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        running = DeployGateway(url, process, Records(stack.client, task_queue=stack.harness_queue))
        running.gateway_queue = queue
        yield running
        for client in running.clients:
            await client.close()


async def deployable(client: anthropic.AsyncAnthropic, stack: Stack) -> tuple[Any, Any]:
    agent = await client.beta.agents.create(name="nightly", model=stack.script([{"text": "done"}], loop=True))
    environment = await client.beta.environments.create(name="plain")
    return agent, environment


async def first_run(client: anthropic.AsyncAnthropic, deployment_id: str, **filters: Any) -> Any:
    """The deployment's newest run with these filters, once there is one (a cron fire is a minute away at most)."""
    found: list[Any] = []

    async def listed() -> bool:
        found[:] = [run async for run in client.beta.deployment_runs.list(deployment_id=deployment_id, **filters)]
        return bool(found)

    await until(listed, f"a run of {deployment_id} with {filters}", within=150)
    return found[0]


async def test_a_cron_deployment_fires_and_runs_by_hand_and_pauses(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("deploy")
    agent, environment = await deployable(client, stack)
    deployment = await client.beta.deployments.create(
        agent=agent.id, environment_id=environment.id, name="every minute",
        initial_events=[message("check the dependencies")], schedule=EVERY_MINUTE, metadata={"team": "infra"},
    )  # fmt: skip
    assert deployment.id.startswith("depl_") and deployment.status == "active" and deployment.paused_reason is None
    assert deployment.agent.id == agent.id and deployment.agent.version == agent.version  # the id pinned the latest
    assert deployment.schedule is not None and len(deployment.schedule.upcoming_runs_at or []) == 5

    scheduled = await first_run(client, deployment.id, trigger_type="schedule")
    assert scheduled.error is None and scheduled.session_id is not None
    assert scheduled.trigger_context.type == "schedule"
    assert scheduled.trigger_context.scheduled_at in (deployment.schedule.upcoming_runs_at or [])
    session = await client.beta.sessions.retrieve(scheduled.session_id)
    assert session.deployment_id == deployment.id and session.agent.id == agent.id
    shown = (await client.beta.deployments.retrieve(deployment.id)).schedule
    assert shown is not None and shown.last_run_at is not None

    manual = await client.beta.deployments.run(deployment.id)
    assert manual.trigger_context.type == "manual" and manual.error is None and manual.session_id
    assert (await client.beta.sessions.retrieve(manual.session_id)).deployment_id == deployment.id

    async def listed_by_deployment() -> bool:  # the sessions its runs made, and no other
        found = [s async for s in client.beta.sessions.list(deployment_id=deployment.id)]
        ids = {s.id for s in found}
        return {scheduled.session_id, manual.session_id} <= ids and {s.deployment_id for s in found} == {deployment.id}

    await until(listed_by_deployment, "the deployment's sessions listed by deployment_id")
    assert (await client.beta.deployment_runs.retrieve(manual.id)).session_id == manual.session_id
    manual_runs = [r.id async for r in client.beta.deployment_runs.list(deployment_id=deployment.id,
                                                                       trigger_type="manual")]  # fmt: skip
    assert manual_runs == [manual.id]

    paused = await client.beta.deployments.pause(deployment.id)
    assert paused.status == "paused" and paused.paused_reason is not None and paused.paused_reason.type == "manual"
    assert paused.schedule is not None and paused.schedule.upcoming_runs_at  # what it would do, unpaused
    assert [d.id async for d in client.beta.deployments.list(status="paused")] == [deployment.id]
    unpaused = await client.beta.deployments.unpause(deployment.id)
    assert unpaused.status == "active" and unpaused.paused_reason is None
    assert [d.id async for d in client.beta.deployments.list(status="paused")] == []

    archived = await client.beta.deployments.archive(deployment.id)
    assert archived.archived_at is not None and archived.status == "active"
    assert archived.schedule is not None and archived.schedule.upcoming_runs_at == []
    assert archived.schedule.last_run_at is not None
    assert [d.id async for d in client.beta.deployments.list()] == []
    assert [d.id async for d in client.beta.deployments.list(include_archived=True)] == [deployment.id]


async def test_an_archived_agent_fails_the_next_fire_and_pauses_the_deployment(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("deploy")
    agent, environment = await deployable(client, stack)
    deployment = await client.beta.deployments.create(
        agent=agent.id, environment_id=environment.id, name="doomed", initial_events=[message("go")],
        schedule=NEVER_DURING_A_TEST,
    )  # fmt: skip
    await client.beta.agents.archive(agent.id)
    await stack.client.get_schedule_handle(deployment.id).trigger()  # its Schedule fires now
    run = await first_run(client, deployment.id, has_error=True)
    assert run.session_id is None and run.error is not None and run.error.type == "agent_archived_error"
    assert run.trigger_context.type == "schedule"

    async def paused() -> bool:
        return (await client.beta.deployments.retrieve(deployment.id)).status == "paused"

    await until(paused, "the deployment paused after its failed fire")
    current = await client.beta.deployments.retrieve(deployment.id)
    assert current.paused_reason is not None and current.paused_reason.type == "error"
    assert current.paused_reason.error.type == "agent_archived_error"
    assert [r.id async for r in client.beta.deployment_runs.list(deployment_id=deployment.id, has_error=False)] == []
    await client.beta.deployments.archive(deployment.id)


async def test_bad_deployments_are_400s_that_name_the_problem(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("deploy")
    agent, environment = await deployable(client, stack)
    base: dict[str, Any] = {"agent": agent.id, "environment_id": environment.id, "name": "n",
                            "initial_events": [message("hi")]}  # fmt: skip
    refused: dict[str, dict[str, Any]] = {
        "5 fields": {"schedule": {**EVERY_MINUTE, "expression": "* * * * * *"}},
        "shortcuts": {"schedule": {**EVERY_MINUTE, "expression": "@daily"}},
        "L, W, #": {"schedule": {**EVERY_MINUTE, "expression": "0 0 L * *"}},
        "outside 0-7": {"schedule": {**EVERY_MINUTE, "expression": "0 0 * * 8"}},
        "not an IANA time zone": {"schedule": {**EVERY_MINUTE, "timezone": "Mars/Olympus"}},
        "1 to 50 events": {"initial_events": []},
        "a system.message comes last in its batch": {"initial_events": [{"type": "system.message",
                                                                "content": [{"type": "text", "text": "x"}]}]},
        "is an environment id, not an agent id": {"agent": environment.id},
        "name must be": {"name": ""},
    }  # fmt: skip
    for needle, change in refused.items():
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.beta.deployments.create(**{**base, **change})
        assert needle in str(caught.value), (needle, str(caught.value))
    for missing in ("agent", "environment_id", "name", "initial_events"):
        with pytest.raises(anthropic.BadRequestError, match=f"{missing} is required"):
            await client.post("/v1/deployments", body={k: v for k, v in base.items() if k != missing}, cast_to=object)
    deployment = await client.beta.deployments.create(**base, schedule=cron("0 9 * * 5-7"))
    with pytest.raises(anthropic.BadRequestError, match="name cannot be cleared"):
        await client.post(f"/v1/deployments/{deployment.id}", body={"name": None}, cast_to=object)
    cleared = await client.beta.deployments.update(deployment.id, schedule=None, metadata={"a": "b"})
    assert cleared.schedule is None and cleared.metadata == {"a": "b"}
    with pytest.raises(anthropic.BadRequestError, match="include_archived"):
        await client.get("/v1/deployments?status=paused&include_archived=true", cast_to=object)
    with pytest.raises(anthropic.BadRequestError, match="page"):
        await client.get("/v1/deployment_runs?page=bogus", cast_to=object)
    with pytest.raises(anthropic.BadRequestError, match="trigger_type"):
        await client.get("/v1/deployment_runs?trigger_type=cron", cast_to=object)
    await client.beta.deployments.archive(deployment.id)


async def test_the_cli_lists_runs_pauses_and_unpauses_a_deployment(stack: Stack, gateway: DeployGateway) -> None:
    client = await gateway.client("deploy")
    workspace = f"deploy-{gateway.suffix}"
    agent, environment = await deployable(client, stack)
    deployment = await client.beta.deployments.create(
        agent=agent.id, environment_id=environment.id, name="by hand", initial_events=[message("go")],
        schedule=cron("0 3 * * 0-7"),
    )  # fmt: skip
    listed = await corral(stack, "deployments", "ls", "--workspace", workspace)
    assert listed.returncode == 0, listed.stderr
    assert deployment.id in listed.stdout and "0 3 * * 0-7 UTC" in listed.stdout
    ran = await corral(stack, "deployments", "run", deployment.id, "--harness-queue", stack.harness_queue,
                       "--gateway-queue", gateway.gateway_queue)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    run = json.loads(ran.stdout)
    assert run["trigger_context"] == {"type": "manual"} and run["session_id"]
    assert (await client.beta.sessions.retrieve(run["session_id"])).deployment_id == deployment.id
    runs = await corral(stack, "deployments", "runs", deployment.id)
    assert runs.returncode == 0 and run["id"] in runs.stdout and run["session_id"] in runs.stdout
    paused = await corral(stack, "deployments", "pause", deployment.id)
    assert paused.returncode == 0 and "paused" in paused.stdout
    shown = await client.beta.deployments.retrieve(deployment.id)
    assert shown.status == "paused" and shown.paused_reason is not None and shown.paused_reason.type == "manual"
    assert (await stack.client.get_schedule_handle(deployment.id).describe()).schedule.state.paused
    unpaused = await corral(stack, "deployments", "unpause", deployment.id)
    assert unpaused.returncode == 0
    assert (await client.beta.deployments.retrieve(deployment.id)).status == "active"
    assert not (await stack.client.get_schedule_handle(deployment.id).describe()).schedule.state.paused
    wrong = await corral(stack, "deployments", "runs", agent.id)
    assert wrong.returncode == 2 and "not a deployment id" in wrong.stderr
    await client.beta.deployments.archive(deployment.id)


async def test_a_fire_killed_mid_run_makes_one_run_and_one_session(stack: Stack, tmp_path: Path) -> None:
    """SIGKILL of the gateway (which runs the fire's activity) and of the harness worker (which runs the fire) after
    the run's session started and before the run was recorded: the activity is held there by the knowledge
    database's write lock, which the test takes, and its log line says the session started. Restarted, the fire
    retries, finds its session, and records the one run; the session has its initial message once."""
    queue = unique("gateway")
    harness_stack = dataclasses.replace(stack, harness_queue=HARNESS_TASK_QUEUE)  # the entrypoint's own queue
    address = stack.client.service_client.config.target_host
    port = free_port()
    argv = gateway_argv(harness_stack, port, "--gateway-queue", queue)
    with (
        role_process("harness", worker_argv("harness"), tmp_path, **temporal_env(address)) as harness,
        role_process("gateway", argv, tmp_path) as gateway_process,
    ):
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, gateway_process)
        gateway = Gateway(url, gateway_process, Records(stack.client, task_queue=HARNESS_TASK_QUEUE))
        client = await gateway.client("crash")
        agent, environment = await deployable(client, stack)
        endpoints = WebhookEndpoints(open_knowledge_db())
        endpoint = endpoints.create(
            f"crash-{gateway.suffix}", "https://receiver.example/hooks", ["deployment_run.succeeded"]
        )
        lock = sqlite3.connect(knowledge_db_path(), isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the run's row waits for this: the fault lands between session and row
        deployment = await client.beta.deployments.create(
            agent=agent.id, environment_id=environment.id, name="crashing", initial_events=[message("once")],
            schedule=NEVER_DURING_A_TEST,
        )  # fmt: skip
        await stack.client.get_schedule_handle(deployment.id).trigger()  # its Schedule fires now
        started: list[str] = []

        def session_started() -> bool:
            found = re.findall(
                r"deployment run (drun_\w+): session (sesn_\w+) started", gateway_process.log.read_text()
            )
            started[:] = found[0] if found else []
            return bool(found)

        await until(session_started, "the fire's activity started the run's session", within=150)
        run_id, session_id = started
        gateway_process.kill()
        harness.kill()
        assert lock.execute("SELECT count(*) FROM deployment_runs WHERE deployment_id = ?",
                            (deployment.id,)).fetchone() == (0,), "the run was recorded before the fault"  # fmt: skip
        lock.execute("ROLLBACK")
        lock.close()
        harness.start()
        gateway_process.start()
        await until_healthy(url, gateway_process)

        async def recorded() -> bool:
            try:
                await client.beta.deployment_runs.retrieve(run_id)
            except anthropic.NotFoundError:
                return False
            return True

        await until(recorded, "the retried fire recorded its run", within=200)
        await client.beta.deployments.pause(deployment.id)  # no more fires while the test reads
        run = await client.beta.deployment_runs.retrieve(run_id)
        assert run.session_id == session_id and run.error is None
        assert run.trigger_context.type == "schedule"
        same_time = [r async for r in client.beta.deployment_runs.list(deployment_id=deployment.id)
                     if r.trigger_context.type == "schedule"
                     and r.trigger_context.scheduled_at == run.trigger_context.scheduled_at]  # fmt: skip
        assert [r.id for r in same_time] == [run_id]
        session = await client.beta.sessions.retrieve(session_id)
        assert session.deployment_id == deployment.id
        runs = [r async for r in client.beta.deployment_runs.list(deployment_id=deployment.id)]
        of_runs = {r.session_id for r in runs if r.session_id}
        made: set[str] = set()

        async def listed() -> bool:  # every session of the deployment is one run's: none made twice
            made.clear()
            made.update([s.id async for s in client.beta.sessions.list() if s.deployment_id == deployment.id])
            return made == of_runs

        await until(listed, "the deployment's sessions are its runs' sessions")
        assert session_id in made
        # The run's success is owed to the endpoint once: by an id made from the run's, whichever attempt emitted it.
        succeeded = delivery_workflow_id(webhook_event_id(f"{run_id}/succeeded"), endpoint.id)
        await stack.client.get_workflow_handle(succeeded).describe()
        await endpoints.db.run(endpoints.delete, endpoint.workspace, endpoint.id)
        logged = [e async for e in client.beta.sessions.events.list(session_id)]
        assert [e.type for e in logged].count("user.message") == 1, "the initial message was sent twice"
        assert gateway_process.log.read_text().count(f"deployment run {run_id}: session {session_id} started") >= 1
        await client.beta.deployments.archive(deployment.id)
        await client.close()


async def test_deployment_changes_and_runs_are_owed_to_the_workspaces_webhook_endpoints(
    stack: Stack, gateway: DeployGateway
) -> None:
    """Each change and each run hands its event to `emit`: one delivery workflow per (event, endpoint), whose input
    names the event; a run's events have ids made from the run's, so a retried fire owes the same delivery."""
    client = await gateway.client("hooks")
    workspace = f"hooks-{gateway.suffix}"
    endpoints = WebhookEndpoints(open_knowledge_db())
    endpoint = endpoints.create(workspace, "https://receiver.example/hooks", ["all"])
    agent, environment = await deployable(client, stack)
    deployment = await client.beta.deployments.create(agent=agent.id, environment_id=environment.id, name="hooked",
                                                      initial_events=[message("go")])  # fmt: skip
    await client.beta.deployments.update(deployment.id, description="now described")
    await client.beta.deployments.pause(deployment.id)
    await client.beta.deployments.unpause(deployment.id)
    run = await client.beta.deployments.run(deployment.id)
    await client.beta.deployments.archive(deployment.id)
    expected = {(f"deployment.{change}", deployment.id) for change in
                ("created", "updated", "paused", "unpaused", "archived")}  # fmt: skip
    expected |= {("deployment_run.started", run.id), ("deployment_run.succeeded", run.id)}
    owed: list[tuple[str, str]] = []

    async def deliveries() -> bool:
        query = f"WorkflowType = '{WEBHOOK_DELIVERY_WORKFLOW}' AND WorkflowId STARTS_WITH 'webhook-'"
        owed.clear()
        async for execution in stack.client.list_workflows(query):
            if execution.id.endswith(endpoint.id):
                started = await stack.client.get_workflow_handle(execution.id).fetch_history()
                payload = started.events[0].workflow_execution_started_event_attributes.input.payloads[0]
                delivery = data_converter().payload_converter.from_payload(payload, WebhookDeliveryInput)
                owed.append((delivery.event.type, delivery.event.subject_id))
        return expected <= set(owed)

    await until(deliveries, "the deployment's events were handed to the endpoint")
    ours = [item for item in owed if item[0].startswith("deployment")]
    assert len(ours) == len(set(ours)) == len(expected), ours  # one delivery per event and endpoint
    key = webhook_event_id(f"{run.id}/succeeded")
    await stack.client.get_workflow_handle(delivery_workflow_id(key, endpoint.id)).describe()  # the run's own id
    await endpoints.db.run(endpoints.delete, workspace, endpoint.id)
