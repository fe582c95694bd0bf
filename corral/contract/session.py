"""What a client sends to a session and what it reads back: start input, user-event params, query shapes.

Field names follow the Managed Agents API wherever it has one, so the same JSON works from the `temporal` CLI,
the corral CLI and the HTTP API. Every field but `agent.model` is optional. Persisted schemas: add optional
fields, never repurpose one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from corral.contract.carry import ArchiveIndex, SessionCarry
from corral.contract.events import ContentBlock, ModelUsage, SessionEvent, TextBlock
from corral.contract.limits import SendableInput
from corral.contract.pricing import ModelPrice, NotBudgetable, price_in_force, price_of
from corral.contract.proxy import GitRepositoryResource, McpServerUrl, McpToolset
from corral.contract.sandbox import (
    SANDBOX_TOOL_DESCRIPTIONS,
    AgentToolset20260401,
    Environment,
    check_permission_policy,
    sandbox_tool_schema,
)
from corral.names import MODEL_TASK_QUEUE, UTILITY_HAND_TASK_QUEUE, SessionStatus, reserved_task_queue_problem

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""The most bytes of user events one batch may carry (the Messages API's own request limit). Anything over 256 KiB
is kept in the blob store with only a reference in history (corral.blobs), so no history payload nears Temporal's
2 MB limit; the model is shown a block too large for its context as a note (corral.contract.context.fit_blocks)."""
MAX_EVENTS_PER_BATCH = 50
DEFAULT_RUN_HISTORY_EVENTS = 3_000
"""History events per workflow run before the session continues as new (see `bench/long.py` for what a run this
long costs to replay)."""
MAX_UPDATES_PER_RUN = 1_000
"""Updates per run before it continues as new: half of Temporal's limit of 2,000 distinct updates per run."""


class CustomTool(BaseModel):
    """A tool the client runs itself: a call makes the session idle with `requires_action`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["custom"] = "custom"
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


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
ResolvedTool = CustomTool | HandTool | SandboxTool

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
        return tools


class ModelRetryConfig(BaseModel):
    """How a session retries transient model errors (429, 529, 5xx, connection errors)."""

    model_config = ConfigDict(extra="forbid")
    max_attempts: int = Field(default=6, ge=1, le=50)
    initial_delay_seconds: float = Field(default=1.0, ge=0, le=600)
    max_delay_seconds: float = Field(default=60.0, ge=0, le=3600)


class MonetaryAmount(BaseModel):
    """An amount of money in integer minor units, as a string with no leading zero ("2500" is $25.00)."""

    model_config = ConfigDict(extra="forbid")
    amount: str = Field(pattern=r"^[1-9][0-9]{0,15}$")
    currency: Literal["USD"] = "USD"


class SessionBudget(BaseModel):
    """A spending limit at list price (upstream's `budget`): once the session's model turns have cost
    `max_list_cost`, it goes idle with `budget_reached`, and a later message ends the same way without a model call.
    `price` is the model's price in force when the session was made (corral.contract.pricing): set by whoever starts
    it, so the session never reads a table or the environment; left out, the price table's is taken."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["limit"] = "limit"
    max_list_cost: MonetaryAmount
    price: ModelPrice | None = None

    @property
    def limit_cents(self) -> int:
        return int(self.max_list_cost.amount)


MessageContent = str | list[ContentBlock]


def normalize_content(content: MessageContent) -> list[ContentBlock]:
    """Turn a plain string into one text block, and refuse empty content."""
    blocks: list[ContentBlock] = [TextBlock(text=content)] if isinstance(content, str) else list(content)
    if not blocks or all(isinstance(b, TextBlock) and not b.text.strip() for b in blocks):
        raise ValueError("content must not be empty")
    return blocks


class SessionInput(SendableInput):
    """Start input of `SessionWorkflow`. Only `agent.model` is required."""

    unchecked_fields = ("carry",)

    model_config = ConfigDict(extra="forbid")
    agent: AgentConfig
    title: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    environment: Environment | None = None
    """The sandbox recipe; the default recipe applies when the agent has the built-in toolset and this is empty."""
    resources: list[GitRepositoryResource] = Field(default_factory=list, max_length=20)
    vault_ids: list[str] = Field(default_factory=list)
    message: MessageContent | None = None
    model_retry: ModelRetryConfig = Field(default_factory=ModelRetryConfig)
    model_task_queue: str = Field(default=MODEL_TASK_QUEUE, min_length=1)
    """Which pool of model workers runs this session's turns (e.g. one pool per API key or region)."""
    fork: ForkSource | None = None
    """Start as a fork: the log is first copied from the source session (`corral fork`)."""
    continue_as_new_after_events: int = Field(default=DEFAULT_RUN_HISTORY_EVENTS, ge=200, le=40_000)
    """Hand the session over to a new workflow run once this run's history holds this many events (or sooner,
    when Temporal suggests it): what a harness restart replays stays small whatever the session's length."""
    budget: SessionBudget | None = None
    """Stop taking model turns once they have cost this much at list price (see `SessionBudget`)."""
    carry: SessionCarry | None = None
    """Set by the session itself when it continues as new: the state the next run starts from (never by users)."""

    @field_validator("message")
    @classmethod
    def _message_not_empty(cls, value: MessageContent | None) -> MessageContent | None:
        if value is not None:
            normalize_content(value)
        return value

    @field_validator("resources", mode="before")
    @classmethod
    def _no_token_in_workflow_input(cls, value: Any) -> Any:
        for resource in value if isinstance(value, list) else []:
            if isinstance(resource, dict) and "authorization_token" in resource:
                raise ValueError(
                    "authorization_token must never be in workflow input: give it to `corral start --repo-token-file` "
                    "or the HTTP API, which store it in Vault and pass only repository_id"
                )
        return value

    @model_validator(mode="after")
    def _budget_priced(self) -> SessionInput:
        if self.budget is not None and self.budget.price is None:
            try:
                price_in_force(self.agent.model)
            except NotBudgetable as exc:
                raise ValueError(f"budget: {exc}") from exc
        return self

    def budget_price(self) -> ModelPrice | None:
        """The price this session's usage is measured at: its budget's, else the table's (None: not priced)."""
        if self.budget is not None and self.budget.price is not None:
            return self.budget.price
        return price_of(self.agent.model)

    def sandbox_environment(self) -> Environment:
        return self.environment or Environment()


def web_ui_summary(input: SessionInput, namespace: str) -> tuple[str, str]:
    """Static summary and details the Temporal Web UI shows for a session (a fork links to its source)."""
    title = input.title or "agent session"
    tools = ", ".join(tool.name for tool in input.agent.resolved_tools()) or "none"
    details = [f"**model** `{input.agent.model}`", f"**tools** {tools}"]
    if input.agent.name:
        details.insert(0, f"**agent** {input.agent.name}")
    details += [f"**{key}** {value}" for key, value in sorted(input.metadata.items())]
    if input.fork is not None:
        source = input.fork.session_id
        link = f"[{source}](/namespaces/{namespace}/workflows/{source})"
        details.append(f"**forked from** {link} at position {input.fork.position}")
    return f"{title} · {input.agent.model}", "\n\n".join(details)


class ForkSource(BaseModel):
    """Where a forked session comes from: its log starts as `session_id`'s, up to and including `position`."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1)
    position: int = Field(ge=1)


# ---- inputs of signals and the send_events update ------------------------------------------------------


class UserMessageSignal(SendableInput):
    """Input of the `user_message` signal: `{"content": "..."}` plus an optional client id for de-duplication."""

    model_config = ConfigDict(extra="forbid")
    content: MessageContent
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserMessageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.message"]
    content: MessageContent
    id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("content")
    @classmethod
    def _content_not_empty(cls, value: MessageContent) -> MessageContent:
        normalize_content(value)
        return value


class UserInterruptParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.interrupt"]
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserToolConfirmationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.tool_confirmation"]
    tool_use_id: str
    result: Literal["allow", "deny"]
    deny_message: str | None = None
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserCustomToolResultParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.custom_tool_result"]
    custom_tool_use_id: str
    content: MessageContent = Field(default_factory=list)
    is_error: bool = False
    id: str | None = Field(default=None, min_length=1, max_length=128)


UserEventParams = Annotated[
    UserMessageParams | UserInterruptParams | UserToolConfirmationParams | UserCustomToolResultParams,
    Field(discriminator="type"),
]


class SendEventsInput(SendableInput):
    """Input of the `send_events` update. Events are validated by the update's validator, so a malformed
    event is rejected with a readable message instead of failing to decode."""

    events: list[dict[str, Any]]


class UpdateSessionInput(BaseModel):
    """Input of the `update_session` update: a new title (when `title_set`), a metadata patch (a string sets a
    key, None removes it), archiving, and the start of a deletion (`delete`: refused while the session runs; else
    it writes `session.deleted` and takes no more events, and the caller cancels the workflow and deletes it). The
    gateway validates sizes before sending it."""

    model_config = ConfigDict(extra="forbid")
    title_set: bool = False
    title: str | None = None
    metadata: dict[str, str | None] = Field(default_factory=dict)
    archive: bool = False
    delete: bool = False
    budget_set: bool = False
    budget: SessionBudget | None = None
    """With `budget_set`: the session's new budget (it must have one already), or None to remove it."""


_USER_EVENTS: TypeAdapter[list[UserEventParams]] = TypeAdapter(list[UserEventParams])

UNSERVED_EVENTS = {
    "user.tool_result": "user.tool_result answers a call that a self-hosted environment runs; corral runs the "
    "built-in tools in its own sandbox, so no call waits for one (a custom tool's call takes user.custom_tool_result)",
    "user.define_outcome": "user.define_outcome: outcomes are not supported by corral yet",
    "system.message": "system.message is not supported yet: the agent's system prompt is the session's system "
    "context (update the agent, or say it in a user.message)",
}
"""Event types of the Managed Agents API that a session does not take, with the reason a sender is given."""


def parse_user_events(input: SendEventsInput) -> list[UserEventParams]:
    """Validate a `send_events` batch; raise ValueError with a message a person can act on."""
    if not input.events:
        raise ValueError("events: send at least one event")
    if len(input.events) > MAX_EVENTS_PER_BATCH:
        raise ValueError(f"events: at most {MAX_EVENTS_PER_BATCH} events per batch, got {len(input.events)}")
    for index, event in enumerate(input.events):
        kind = event.get("type") if isinstance(event, dict) else None
        if isinstance(kind, str) and kind in UNSERVED_EVENTS:
            raise ValueError(f"events[{index}]: {UNSERVED_EVENTS[kind]}")
    try:
        params = _USER_EVENTS.validate_python(input.events)
    except ValidationError as exc:
        raise ValueError(readable_validation_error(exc, prefix="events")) from None
    total = 0
    for index, param in enumerate(params):
        total += len(param.model_dump_json())
        if total > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"events[{index}]: the batch is {total} bytes up to here, over the limit of {MAX_MESSAGE_BYTES} bytes"
            )
    return params


def readable_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line per problem, e.g. `events[0].type: Input tag 'user.foo' found ... does not match ...`."""
    lines = []
    for error in exc.errors(include_url=False):
        location = prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        lines.append(f"{location}: {error['msg']}")
    return "; ".join(_unique(lines))


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


class SendEventsResult(BaseModel):
    """The ids of the accepted events, in order (an already-seen client id returns the earlier event's id)."""

    event_ids: list[str]


class InterruptSignal(SendableInput):
    """Input of the `interrupt` signal (may be omitted)."""

    id: str | None = None


# ---- queries ------------------------------------------------------------------------------------------

MAX_QUERY_BYTES = 1_000_000
"""A query answer stays under this many bytes of JSON; callers page with `after`."""


class EventsQuery(SendableInput):
    """Input of the `events` query: positions strictly after `after` and before `before`."""

    model_config = ConfigDict(extra="forbid")
    after: int = 0
    before: int | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    types: list[str] | None = None


class EventPage(BaseModel):
    """A page of events; when `has_more`, ask again with `after=next_after`. When `archive` is set, the positions
    up to `archive.through` are not in this run: read them from the archive (corral.client does)."""

    events: list[SessionEvent]
    has_more: bool
    next_after: int
    archive: ArchiveIndex | None = None


class SessionInfo(BaseModel):
    """Answer of the `session` query."""

    id: str
    status: SessionStatus
    title: str | None
    model: str
    created_at: datetime
    last_position: int
    turns: int
    queued_user_events: int
    usage: ModelUsage
    stop_reason: str | None
    metadata: dict[str, str]
    run: int = 1
    """Which workflow run of the session this is (it continues as new as it grows)."""
    archived_through: int = 0
    """Positions up to this one were written by earlier runs and are read from the archive."""
    archived_at: datetime | None = None
    """When the session was archived (it takes no more events), if it was."""
    list_cost: int | None = None
    """What the session's model turns have cost at list price, in US cents (None: its model has no price)."""
    budget: SessionBudget | None = None
