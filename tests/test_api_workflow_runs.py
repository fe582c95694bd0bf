"""Workflow runs over the API, driven by the official `anthropic` SDK against a real gateway process on the real
Temporal dev server: an agent's `multiagent.workflows` resolved into the harness's `Multiagent.runs…` with the
operator's limits, and runs whose events the SDK reads in its own types, in order."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.beta.beta_managed_agents_session_multiagent20261001 import (
    BetaManagedAgentsSessionMultiagent20261001,
)
from anthropic.types.beta.beta_managed_agents_session_multiagent_workflows_enabled import (
    BetaManagedAgentsSessionMultiagentWorkflowsEnabled,
)

from corral.names import ENV_MAX_THREADS_PER_RUN, ENV_MAX_WORKFLOW_RUNS_PER_SESSION
from tests.conftest import Stack
from tests.test_api_multiagent import start_input
from tests.test_gateway import running_gateway

pytestmark = pytest.mark.timeout(300)

MODEL = "claude-sonnet-4-6"


async def test_a_session_resolves_workflows_into_runs_with_the_operators_limits(stack: Stack, tmp_path: Any) -> None:
    limits = {ENV_MAX_WORKFLOW_RUNS_PER_SESSION: "3", ENV_MAX_THREADS_PER_RUN: "4"}
    async with running_gateway(stack, tmp_path, **limits) as served:
        client = await served.client("runs-resolve")
        environment = await client.beta.environments.create(name="plain")
        checker = await client.beta.agents.create(name="checker", model=MODEL, system="check twice")
        lead = await client.beta.agents.create(
            name="lead", model=MODEL,
            multiagent={"type": "multiagent_20261001", "subagents": {"type": "disabled"},
                        "workflows": {"type": "enabled", "inline_agents": {"type": "disabled"},
                                      "predefined_agents": [checker.id, {"type": "self"}]}},
        )  # fmt: skip
        await client.beta.agents.update(checker.id, version=1, system="changed after the lead pinned it")
        session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))

        shown = session.agent.multiagent
        assert isinstance(shown, BetaManagedAgentsSessionMultiagent20261001)
        assert isinstance(shown.workflows, BetaManagedAgentsSessionMultiagentWorkflowsEnabled)
        assert shown.subagents.type == "disabled"
        first, itself = shown.workflows.predefined_agents
        assert (first.id, first.version, first.system) == (checker.id, 1, "check twice"), "a full pinned snapshot"
        assert (itself.id, itself.system) == (lead.id, None)

        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_inline_agents, started.max_runs, started.max_threads_per_run) == (
            True, False, 3, 4)  # fmt: skip
        agent, own = started.run_agents
        assert (agent.type, agent.id, agent.version, own.type) == ("agent", checker.id, 1, "self")
        assert agent.config is not None and agent.config.system == "check twice"
        assert (started.subagents, started.agents) == (False, [])
        assert [tool.name for tool in started.tools()] == ["wait_for_threads", "start_workflow_run"]

        defaults = await client.beta.agents.create(name="defaults", model=MODEL,
                                                   multiagent={"type": "multiagent_20261001"})  # fmt: skip
        session = await client.beta.sessions.create(agent=defaults.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))
        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_inline_agents, started.run_agents) == (True, True, []), "enabled by default"

        coordinator: Any = {"type": "coordinator", "agents": [checker.id]}
        roster = await client.beta.agents.create(name="roster", model=MODEL, multiagent=coordinator)
        session = await client.beta.sessions.create(agent=roster.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))
        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        assert (started.runs, started.run_agents) == (False, []), "the coordinator form starts no workflow runs"
        assert "start_workflow_run" not in [tool.name for tool in started.tools()]
