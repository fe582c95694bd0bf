"""The agent a session runs: its model, system prompt and tools (declared, and resolved into the tools the model
sees). Part of the session's start input (`SessionInput.agent`), so a persisted schema: add optional fields, never
repurpose one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.contract.coordinator import ADVISOR_ROSTER_NAME, CoordinatorTool, coordinator_tools
from corral.contract.limits import SendableInput
from corral.contract.proxy import McpServerUrl, McpToolset
from corral.contract.sandbox import (
    SANDBOX_TOOL_DESCRIPTIONS,
    AgentToolset20260401,
    check_permission_policy,
    sandbox_tool_schema,
)
from corral.names import UTILITY_HAND_TASK_QUEUE, reserved_task_queue_problem

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class CustomTool(BaseModel):
    """A tool the client runs itself: a call makes the session idle with `requires_action`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["custom"] = "custom"
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


MAX_AGENT_SKILLS = 20
"""How many skills an agent may list: each is a name and a description in its system prompt."""


class AgentSkillRef(BaseModel):
    """A skill an agent lists (`skills[]` on agent create and update): a custom skill of the agent's workspace, at
    `version` or, when it is None, at its latest version when a session starts (corral.skills.Skills.pin)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["custom"] = "custom"
    skill_id: str = Field(min_length=1, max_length=128)
    version: str | None = Field(default=None, min_length=1, max_length=128)


class HandTool(BaseModel):
    """A tool served by any process that runs the `execute` activity on `task_queue` (a "hand")."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["hand"] = "hand"
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    task_queue: str = Field(min_length=1)
    timeout_seconds: float = Field(default=300.0, gt=0, le=24 * 3600)
    permission_policy: dict[str, Any] | None = None
    """`always_allow` (the default) or `always_ask`, as for the built-in tools."""

    @field_validator("permission_policy")
    @classmethod
    def _policy(cls, policy: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_permission_policy(policy, "permission_policy")


class UtilityToolset(BaseModel):
    """corral's built-in hand that needs no sandbox: `get_time` and `calculate`, on `corral-utility`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["corral_utility"] = "corral_utility"


class SandboxTool(BaseModel):
    """A built-in tool of `agent_toolset_20260401`, run in the session's sandbox (resolved, never sent by users)."""

    type: Literal["sandbox"] = "sandbox"
    name: str
    description: str
    input_schema: dict[str, Any]
    permission_policy: dict[str, Any] | None = None


AgentTool = Annotated[
    CustomTool | HandTool | UtilityToolset | AgentToolset20260401 | McpToolset, Field(discriminator="type")
]
ResolvedTool = CustomTool | HandTool | SandboxTool | CoordinatorTool

UTILITY_TOOLS: tuple[HandTool, ...] = (
    HandTool(
        name="get_time",
        description="Current date and time (UTC, ISO 8601) on the hand's clock.",
        input_schema={"type": "object", "properties": {}},
        task_queue=UTILITY_HAND_TASK_QUEUE,
        timeout_seconds=30,
    ),
    HandTool(
        name="calculate",
        description="Evaluate an arithmetic expression (+ - * / // % **, parentheses, numbers).",
        input_schema={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}},
            "required": ["expression"],
        },
        task_queue=UTILITY_HAND_TASK_QUEUE,
        timeout_seconds=30,
    ),
)


class AgentConfig(SendableInput):
    """The agent a session runs: model, system prompt, tools."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    name: str | None = None
    system: str | None = None
    tools: list[AgentTool] = Field(default_factory=list)
    max_tokens: int = Field(default=4096, ge=1, le=128_000)
    context_budget_tokens: int | None = Field(default=None, ge=1_000)
    """Most input tokens a request may carry; older large tool results are elided to stay under it. Default: the
    model's input window minus `max_tokens` and 5% (corral.contract.context.default_budget)."""
    mcp_servers: list[McpServerUrl] = Field(default_factory=list, max_length=20)
    multiagent: Multiagent | None = None
    """Makes the session's primary thread a coordinator of threads (resolved: roster agents are full snapshots)."""

    @model_validator(mode="after")
    def _mcp_servers_declared(self) -> AgentConfig:
        names = [server.name for server in self.mcp_servers]
        if len(set(names)) != len(names):
            raise ValueError("agent.mcp_servers: server names must be unique")
        for tool in self.tools:
            if isinstance(tool, McpToolset) and tool.mcp_server_name not in names:
                raise ValueError(
                    f"agent.tools: mcp_toolset names server {tool.mcp_server_name!r}, which is not in agent.mcp_servers"
                )
        return self

    @model_validator(mode="after")
    def _hands_not_on_corrals_queues(self) -> AgentConfig:
        # Declared tools only: the utility toolset's own tools (UTILITY_TOOLS) are on corral-utility by design.
        for index, tool in enumerate(self.tools):
            problem = reserved_task_queue_problem(tool.task_queue) if isinstance(tool, HandTool) else None
            if problem is not None:
                raise ValueError(f"agent.tools[{index}].task_queue: {problem}")
        return self

    def mcp_toolsets(self) -> list[tuple[McpServerUrl, McpToolset]]:
        """Each MCP server whose tools the model may use, with its toolset settings."""
        servers = {server.name: server for server in self.mcp_servers}
        return [(servers[t.mcp_server_name], t) for t in self.tools if isinstance(t, McpToolset)]

    @model_validator(mode="after")
    def _tool_names_unique(self) -> AgentConfig:
        names = [tool.name for tool in self.resolved_tools()]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"agent.tools: tool names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def resolved_tools(self) -> list[ResolvedTool]:
        """The tools with toolsets expanded, in declaration order (pure: safe in workflow code)."""
        tools: list[ResolvedTool] = []
        for tool in self.tools:
            if isinstance(tool, UtilityToolset):
                tools.extend(UTILITY_TOOLS)
            elif isinstance(tool, McpToolset):
                continue  # discovered from the server at session start (see workflows/_mcp.py)
            elif isinstance(tool, AgentToolset20260401):
                tools.extend(
                    SandboxTool(
                        name=name,
                        description=SANDBOX_TOOL_DESCRIPTIONS[name],
                        input_schema=sandbox_tool_schema(name),
                        permission_policy={"type": tool.permission(name)},
                    )
                    for name in tool.enabled_names()
                )
            else:
                tools.append(tool)
        if self.multiagent is not None:
            tools.extend(self.multiagent.tools())
        return tools

    def uses_sandbox(self) -> bool:
        """Whether this agent, or one it may spawn as a thread (itself, or as a workflow run's task), has the
        sandbox's built-in tools."""
        entries = [*self.multiagent.agents, *self.multiagent.run_agents] if self.multiagent else []
        roster = [entry.config for entry in entries if entry.config]
        return any(isinstance(tool, SandboxTool) for agent in [self, *roster] for tool in agent.resolved_tools())

    def without_multiagent(self) -> AgentConfig:
        """This agent as a thread runs it: depth is limited to 1, so a thread coordinates nothing."""
        return self.model_copy(update={"multiagent": None})


class ThreadAgent(BaseModel):
    """An agent a coordinator may spawn as a thread: a saved agent, pinned at a version (a full snapshot of its
    configuration), or the coordinator itself (`self`)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["agent", "self"] = "agent"
    id: str | None = None
    version: int | None = None
    config: AgentConfig | None = None
    """The snapshot (type `agent`); None for `self`, which runs the coordinator's own configuration."""

    @model_validator(mode="after")
    def _snapshot(self) -> ThreadAgent:
        if self.type == "agent" and self.config is None:
            raise ValueError("multiagent: a roster agent needs its configuration (`config`)")
        if self.config is not None and self.config.multiagent is not None:
            raise ValueError("multiagent: a roster agent may not coordinate threads itself (depth is limited to 1)")
        return self

    def name(self, coordinator: AgentConfig) -> str:
        config = self.config or coordinator
        return config.name or self.id or "self"


class Multiagent(BaseModel):
    """A coordinator's multi-agent configuration as the harness runs it: whom it may spawn, whether it may define
    agents inline, its advisor. The gateway resolves the API's two forms (`coordinator`, `multiagent_20261001`)
    into this; `view` keeps the API's resolved form, shown as `session.agent.multiagent`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["coordinator", "multiagent_20261001"] = "multiagent_20261001"
    agents: list[ThreadAgent] = Field(default_factory=list, max_length=20)
    """The roster (`coordinator`) or the predefined subagents (`multiagent_20261001`)."""
    subagents: bool = True
    """Whether threads may be spawned at all (`subagents: {type: disabled}` turns them off)."""
    inline_agents: bool = False
    advisor_model: str | None = Field(default=None, min_length=1)
    max_threads: int = Field(default=16, ge=1, le=256)
    """Threads a session may spawn in all; one more is refused with a clear tool error."""
    workflows: dict[str, Any] | None = None
    """The API's `workflows` member as resolved (`view` shows it); `runs` and `run_agents` are what the harness
    runs of it."""
    runs: bool = False
    """Whether the coordinator may start workflow runs (`start_workflow_run`; corral/contract/plans.py)."""
    run_agents: list[ThreadAgent] = Field(default_factory=list, max_length=20)
    """The predefined agents a run's tasks may name."""
    run_inline_agents: bool = False
    max_runs: int = Field(default=8, ge=1, le=256)
    """Workflow runs a session may start in all; one more is a `max_workflow_runs_error`."""
    max_threads_per_run: int = Field(default=10, ge=1, le=256)
    """Threads one run may spawn in all; a plan that needs more is a `thread_limit_error`."""
    view: dict[str, Any] | None = None

    def spawns(self) -> bool:
        return self.subagents and (bool(self.agents) or self.inline_agents)

    def tools(self) -> list[CoordinatorTool]:
        return coordinator_tools(threads=self.spawns(), advisor=self.advisor_model is not None, runs=self.runs)

    def find(self, coordinator: AgentConfig, wanted: str) -> ThreadAgent | None:
        """The roster entry `wanted` names: `self`, an agent's id, or its name."""
        for entry in self.agents:
            if wanted == "self" and entry.type == "self":
                return entry
            if wanted in (entry.id, entry.name(coordinator)) and wanted != ADVISOR_ROSTER_NAME:
                return entry
        return None


AgentConfig.model_rebuild()
