"""`vault_credential.refresh_failed`: a session's MCP call whose token endpoint refuses the refresh token is told to
the session's workspace, by the proxy worker (the one process that saw it), naming the credential and its vault."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from activities.proxy import ProxyActivities
from corral.contract.proxy import McpCallToolInput, McpServerUrl
from corral.contract.search_attributes import WORKSPACE_KEY
from corral.knowledge_db import open_knowledge_db
from corral.names import ACTIVITY_MCP_CALL_TOOL
from corral.webhooks import WebhookEndpoints, Webhooks
from tests.conftest import Stack
from tests.test_proxy_mcp import McpWorld, authority, dev_vault, servers, world  # noqa: F401 - the fixtures
from tests.test_webhook_events import deliveries
from tests.waits import until

pytestmark = pytest.mark.timeout(120)


@workflow.defn(sandboxed=False)
class OneMcpCall:
    """Stands for a session: one MCP call on the proxy's queue, from a workflow of a workspace."""

    @workflow.run
    async def run(self, call: McpCallToolInput) -> None:
        await workflow.execute_activity(
            ACTIVITY_MCP_CALL_TOOL, call, task_queue=f"{workflow.info().task_queue}-proxy",
            start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=1),
        )  # fmt: skip


async def test_a_refused_refresh_is_told_to_the_sessions_workspace(stack: Stack, world: McpWorld) -> None:  # noqa: F811
    access, refresh = world.authority.issue_access_token(), world.authority.issue_refresh_token()
    credential_id = world.add_oauth(access=access, refresh=refresh)
    world.authority.expire(access)
    world.authority.revoke_refresh_token(refresh)
    workspace, queue = f"refreshing-{uuid.uuid4().hex[:8]}", f"refresh-{uuid.uuid4().hex[:8]}"
    WebhookEndpoints(open_knowledge_db()).create(
        workspace, "http://127.0.0.1:9/unheard", ["vault_credential.refresh_failed"]
    )
    webhooks = Webhooks(stack.client, open_knowledge_db(), task_queue=queue)
    call = McpCallToolInput(session_id=world.binding.session_id, reference=world.binding.reference,
                            server=McpServerUrl(name=world.server.name, url=world.server.url), tool="echo",
                            arguments={"text": "x"}, tool_use_id="toolu_1")  # fmt: skip
    proxy = Worker(stack.client, task_queue=f"{queue}-proxy",
                   activities=[ProxyActivities(world.store, webhooks=webhooks).mcp_call_tool])  # fmt: skip
    async with Worker(stack.client, task_queue=queue, workflows=[OneMcpCall]), proxy:
        with pytest.raises(WorkflowFailureError):  # the call fails: the credential must be authorised again
            await stack.client.execute_workflow(
                OneMcpCall.run, call, id=f"sesn_{uuid.uuid4().hex[:26]}", task_queue=queue,
                search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, workspace)]),
            )  # fmt: skip

    async def told() -> bool:
        return bool(await deliveries(stack.client, queue))

    await until(told, "a delivery of vault_credential.refresh_failed")
    (event,) = await deliveries(stack.client, queue)
    assert (event.type, event.subject_id, event.workspace) == (
        "vault_credential.refresh_failed",
        credential_id,
        workspace,
    )
    assert event.payload()["data"]["vault_id"] == world.vault.id
    assert refresh not in event.model_dump_json() and access not in event.model_dump_json()
