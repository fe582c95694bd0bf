"""What a client sends to a session and what it reads back: start input, updates, query shapes. The agent's
configuration is in `corral.contract.agent` and the user events in `corral.contract.user_events`; the names callers
import from here are re-exported below.

Field names follow the Managed Agents API wherever it has one, so the same JSON works from the `temporal` CLI,
the corral CLI and the HTTP API. Every field but `agent.model` is optional. Persisted schemas: add optional
fields, never repurpose one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.contract.agent import (  # noqa: F401 - re-exported: callers import them from here
    AgentConfig,
    CustomTool,
    HandTool,
    ResolvedTool,
    SandboxTool,
    UtilityToolset,
)
from corral.contract.carry import ArchiveIndex, SessionCarry
from corral.contract.events import ModelUsage, SessionEvent
from corral.contract.knowledge import SessionKnowledge
from corral.contract.limits import SendableInput
from corral.contract.outcomes import OutcomeEvaluation
from corral.contract.pricing import ModelPrice, NotBudgetable, price_in_force, price_of
from corral.contract.proxy import GitRepositoryResource
from corral.contract.sandbox import Environment
from corral.contract.threads import ThreadSeat
from corral.contract.user_events import (  # noqa: F401 - re-exported: callers import them from here
    MAX_MESSAGE_BYTES,
    MessageContent,
    SendEventsInput,
    SystemMessageParams,
    UserCustomToolResultParams,
    UserDefineOutcomeParams,
    UserEventParams,
    UserInterruptParams,
    UserMessageParams,
    UserMessageSignal,
    UserToolConfirmationParams,
    UserToolResultParams,
    normalize_content,
    parse_user_events,
)
from corral.contract.work import SelfHostedEnvironment
from corral.names import MODEL_TASK_QUEUE, SessionStatus

DEFAULT_RUN_HISTORY_EVENTS = 3_000
"""History events per workflow run before the session continues as new (see `bench/long.py` for what a run this
long costs to replay)."""
MAX_UPDATES_PER_RUN = 1_000
"""Updates per run before it continues as new: half of Temporal's limit of 2,000 distinct updates per run."""


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


class SessionInput(SendableInput):
    """Start input of `SessionWorkflow`. Only `agent.model` is required."""

    unchecked_fields = ("carry", "thread")

    model_config = ConfigDict(extra="forbid")
    agent: AgentConfig
    title: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    environment: Environment | SelfHostedEnvironment | None = None
    """The sandbox recipe (the default recipe applies when the agent has the built-in toolset and this is empty), or
    the self-hosted environment whose worker runs the built-in tools (corral.contract.work)."""
    resources: list[GitRepositoryResource] = Field(default_factory=list, max_length=20)
    knowledge: SessionKnowledge | None = None
    """The files, skills and memory stores placed under `/mnt` in the sandbox (corral.contract.knowledge), as the
    gateway resolved them; None for a session that has none (one started from a Temporal client)."""
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
    webhooks: bool = False
    """Emit the session's webhook events (corral.contract.webhooks): the gateway sets it when the session's workspace
    has an endpoint, and a session started before its workspace had one is told so (`SIGNAL_WEBHOOKS`)."""
    thread: ThreadSeat | None = None
    """Set on a thread's start input by the session that spawns it (corral.contract.threads): never by users."""
    carry: SessionCarry | None = None
    """Set by the session itself when it continues as new: the state the next run starts from (never by users)."""
    deployment_id: str | None = None
    """The deployment whose run made this session (`depl_…`), None for one made by hand."""

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
        return self.environment if isinstance(self.environment, Environment) else Environment()

    def self_hosted(self) -> SelfHostedEnvironment | None:
        """The self-hosted environment that serves this session's built-in tools, if it has one."""
        return self.environment if isinstance(self.environment, SelfHostedEnvironment) else None


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


# ---- the send_events update's answer and the interrupt signal --------------------------------------


class SendEventsResult(BaseModel):
    """The ids of the accepted events, in order (an already-seen client id returns the earlier event's id)."""

    event_ids: list[str]
    events: list[SessionEvent] | None = None
    """The events this update wrote, as it wrote them, in order (an already-seen client id's earlier event is not
    among them), so a sender needs no query to read them back. Only when the input asked (`answer_events`); None
    too from a worker older than the field."""


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
    history_length: int = 0
    """The events of the workflow's history the session had seen when it answered (0 from a harness that does not
    say): every workflow task completed up to the next event is in this page's log, so a follower does not ask
    about them again."""


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
    outcome_evaluations: list[OutcomeEvaluation] = Field(default_factory=list)
    """Every outcome defined (`user.define_outcome`), oldest first, and where each stands."""
    awaiting_worker: int = 0
    """Built-in calls waiting for a self-hosted worker's result (corral.contract.work)."""
