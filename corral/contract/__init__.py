"""The contract: every pydantic model that crosses a workflow boundary (persisted schemas)."""

from corral.contract.activities import (
    ExecuteInput,
    ModelContext,
    ModelContextQuery,
    ModelTurnInput,
    ModelTurnResult,
)
from corral.contract.events import EVENT_TYPES, SessionEvent, TextBlock
from corral.contract.session import (
    AgentConfig,
    EventPage,
    EventsQuery,
    SendEventsInput,
    SendEventsResult,
    SessionInfo,
    SessionInput,
    UserMessageSignal,
)

__all__ = [
    "EVENT_TYPES",
    "AgentConfig",
    "EventPage",
    "EventsQuery",
    "ExecuteInput",
    "ModelContext",
    "ModelContextQuery",
    "ModelTurnInput",
    "ModelTurnResult",
    "SendEventsInput",
    "SendEventsResult",
    "SessionEvent",
    "SessionInfo",
    "SessionInput",
    "TextBlock",
    "UserMessageSignal",
]
