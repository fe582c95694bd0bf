"""The session log held by the workflow: append-only events, the conversation order, and paged reads.

Pure data and pure functions: the workflow supplies ids and times (from `workflow.uuid4()` and `workflow.now()`),
so everything here is deterministic and unit-testable outside Temporal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from pydantic import TypeAdapter

from corral.contract.activities import ModelContext
from corral.contract.carry import ArchiveIndex
from corral.contract.context import estimate_tokens, fit_blocks, json_size, next_watermark
from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolResult,
    AgentMcpToolUse,
    AgentToolResult,
    AgentToolUse,
    SessionEvent,
    TextBlock,
)
from corral.contract.session import (
    MAX_QUERY_BYTES,
    AgentConfig,
    EventPage,
    EventsQuery,
    UserCustomToolResultParams,
    UserEventParams,
    UserToolConfirmationParams,
)

EventT = TypeVar("EventT", bound=SessionEvent)
_TOOL_RESULTS = {"agent.tool_result", "agent.mcp_tool_result", "user.custom_tool_result"}

_EVENT_ADAPTER: TypeAdapter[SessionEvent] = TypeAdapter(SessionEvent)


ELIDE_TO = 0.6
"""Once over the budget, elide until the view is this share of it (see `SessionLog.fit_view`)."""
INLINE_RESULT_BYTES = 2_048
"""A tool result up to this size rides in the model turn's input (cheaper than a query); a larger one by reference."""


class SessionLog:
    """This run's events in order of position, plus the conversation: the entries the model sees, in its order.

    The two orders differ: a message queued mid-turn sits in the log where it arrived, and enters the
    conversation when it is processed. Positions up to `base` were written by the session's earlier workflow runs
    (they are in the archive); the conversation may hold entries of those runs, as the model sees them.
    """

    def __init__(self, new_id: Callable[[], str], now: Callable[[], datetime]) -> None:
        self.base = 0
        self.events: list[SessionEvent] = []
        self.conversation: list[SessionEvent] = []
        self._new_id = new_id
        self._now = now
        self._sizes: dict[int, int] = {}
        self.max_block_chars: int | None = None
        """The view's largest whole block (set by the session's context from its budget)."""
        self.observer: Callable[[SessionEvent], None] | None = None
        """Told of every event written here (not those adopted): the session's webhooks (workflows/_webhooks.py)."""

    @property
    def last_position(self) -> int:
        return self.base + len(self.events)

    def append(self, cls: type[EventT], *, processed: bool = True, id: str | None = None, **fields: Any) -> EventT:
        """Write an event at the next position, with a new id unless given; user events start unprocessed
        (`processed_at` null)."""
        now = self._now()
        event = cls(
            id=id or self._new_id(),
            position=self.last_position + 1,
            created_at=now,
            processed_at=now if processed else None,
            **fields,
        )
        self.events.append(event)
        if self.observer is not None:
            self.observer(event)
        return event

    def adopt(self, event: SessionEvent) -> None:
        """Take an event of another session's log as it is (a fork's copy): positions must follow on."""
        if event.position != self.last_position + 1:
            raise ValueError(f"expected position {self.last_position + 1}, got {event.position}")
        self.events.append(event)

    def resume(self, base: int, tail: list[SessionEvent], conversation: list[SessionEvent]) -> None:
        """Start from a hand-over: positions up to `base` are archived, `tail` follows them; entries of the
        conversation that are in `tail` become the very objects of the log (they may still be marked processed)."""
        self.base = base
        self.events = []
        for event in tail:
            self.adopt(event)
        self.conversation = [self.at(entry.position) if entry.position > base else entry for entry in conversation]

    def at(self, position: int) -> SessionEvent:
        """The event at a position of this run."""
        return self.events[position - self.base - 1]

    def final_through(self) -> int:
        """The last position up to which every event is final: no user event before it waits to be processed."""
        for event in self.events:
            if event.processed_at is None:
                return event.position - 1
        return self.last_position

    def add_to_conversation(self, event: SessionEvent) -> None:
        self.conversation.append(event)

    def conversation_entries(self, start: int, end: int) -> list[SessionEvent]:
        return self.conversation[start:end]

    def delta_for_model(self, start: int, end: int) -> tuple[list[SessionEvent], list[int]]:
        """Conversation entries `[start, end)` for a model turn's input, with large tool results stripped of their
        content (they are in history already, as the hand's result), and the indexes of those stripped."""
        delta: list[SessionEvent] = []
        by_reference: list[int] = []
        for index, entry in enumerate(self.conversation_entries(start, end)):
            if entry.type in _TOOL_RESULTS and self.size(entry) > INLINE_RESULT_BYTES:
                entry = entry.model_copy(update={"content": []})
                by_reference.append(index)
            delta.append(entry)
        return delta, by_reference

    def size(self, entry: SessionEvent) -> int:
        """An entry's JSON size as the view sends it (no block over `max_block_chars`), computed once per position
        (an event's content never changes)."""
        size = self._sizes.get(entry.position)
        if size is None:
            size = self._sizes[entry.position] = json_size(fit_blocks(entry, self.max_block_chars))
        return size

    def estimate(self, watermark: int, fixed_chars: int) -> int:
        """Tokens of the request the view with this watermark makes (an estimate from sizes)."""
        return estimate_tokens(self.conversation_entries(0, len(self.conversation)), watermark, fixed_chars, self.size)

    def fit_view(self, watermark: int, budget: int, fixed_chars: int, keep_after: int) -> int:
        """`watermark` if the view fits `budget` tokens; else the lowest watermark whose view fits `ELIDE_TO` of it,
        or the highest one that may be used (never eliding what comes at or after `keep_after`).

        Eliding well below the budget, once, rather than just under it on every turn keeps the prefix stable for
        several turns: every change of the watermark ends the part of the request the prompt cache can serve."""
        entries = self.conversation_entries(0, len(self.conversation))
        if estimate_tokens(entries, watermark, fixed_chars, self.size) <= budget:
            return watermark
        while estimate_tokens(entries, watermark, fixed_chars, self.size) > budget * ELIDE_TO:
            following = next_watermark(entries, watermark, keep_after, self.size)
            if following is None:
                break
            watermark = following
        return watermark

    def elide_all(self, watermark: int, keep_after: int) -> int:
        """The watermark that elides every large tool result before `keep_after`."""
        entries = self.conversation_entries(0, len(self.conversation))
        while (following := next_watermark(entries, watermark, keep_after, self.size)) is not None:
            watermark = following
        return watermark

    def answer(self, use: AgentToolUse | AgentCustomToolUse | AgentMcpToolUse, text: str, is_error: bool) -> None:
        """Append the result of a tool call (an MCP result for an MCP call) and add it to the conversation."""
        content = [TextBlock(text=text or "(no output)")]
        result: SessionEvent
        if isinstance(use, AgentMcpToolUse):
            result = self.append(AgentMcpToolResult, mcp_tool_use_id=use.id, content=content, is_error=is_error)
        else:
            result = self.append(AgentToolResult, tool_use_id=use.id, content=content, is_error=is_error)
        self.add_to_conversation(result)

    def unanswered_tool_uses(self) -> list[AgentToolUse | AgentCustomToolUse | AgentMcpToolUse]:
        """Tool calls in the conversation that no result answers yet (what an interrupt must close)."""
        entries = self.conversation_entries(0, len(self.conversation))
        answered = {
            getattr(event, "tool_use_id", None)
            or getattr(event, "custom_tool_use_id", None)
            or getattr(event, "mcp_tool_use_id", None)
            for event in entries
        }
        return [
            event
            for event in entries
            if isinstance(event, AgentToolUse | AgentCustomToolUse | AgentMcpToolUse) and event.id not in answered
        ]

    def page(self, query: EventsQuery, archive: ArchiveIndex | None = None) -> EventPage:
        """Events after `query.after` (and before `query.before`), filtered by type, capped by count and bytes.
        A page that starts in an earlier run's positions names the `archive` that holds them, and holds this run's
        events after them (so a slice across the boundary costs one query)."""
        if query.after < self.base and archive is not None and archive.through:
            page = self.page(query.model_copy(update={"after": self.base}))
            return page.model_copy(update={"archive": archive})
        wanted = set(query.types) if query.types else None
        before = query.before if query.before is not None else self.last_position + 1
        selected: list[SessionEvent] = []
        budget = MAX_QUERY_BYTES
        next_after = max(query.after, 0)
        has_more = False
        for event in self.events[max(query.after - self.base, 0) : max(before - 1 - self.base, 0)]:
            if wanted is not None and event.type not in wanted:
                next_after = event.position
                continue
            size = json_size(event)
            if len(selected) >= query.limit or (selected and size > budget):
                has_more = True
                break
            selected.append(event)
            budget -= size
            next_after = event.position
        return EventPage(events=selected, has_more=has_more, next_after=next_after)

    def model_context(self, agent: AgentConfig, start: int, end: int) -> ModelContext:
        """Conversation entries `[start, end)` for the model activity, capped by bytes."""
        end = min(end, len(self.conversation))
        entries: list[SessionEvent] = []
        budget = MAX_QUERY_BYTES
        index = start
        for entry in self.conversation_entries(start, end):
            size = self.size(entry)
            if entries and size > budget:
                break
            entries.append(entry)
            budget -= size
            index += 1
        return ModelContext(agent=agent, entries=entries, next_start=index)


def check_answers(
    params: list[UserEventParams], waiting: set[str], confirming: frozenset[str] | set[str] = frozenset()
) -> None:
    """Answers must match calls that wait for them: each open custom tool call (`waiting`) gets one result, each
    call that waits for confirmation (`confirming`) one confirmation, and only a denial carries a message."""
    answered: set[str] = set()
    for index, event in enumerate(params):
        if isinstance(event, UserCustomToolResultParams):
            use_id = event.custom_tool_use_id
            if use_id not in waiting or use_id in answered:
                raise ValueError(
                    f"events[{index}]: no custom tool call {use_id!r} is waiting for a result "
                    f"(waiting: {', '.join(sorted(waiting)) or 'none'})"
                )
            answered.add(use_id)
        elif isinstance(event, UserToolConfirmationParams):
            use_id = event.tool_use_id
            if use_id not in confirming or use_id in answered:
                raise ValueError(
                    f"events[{index}]: tool call {use_id!r} is not waiting for confirmation "
                    f"(waiting: {', '.join(sorted(confirming)) or 'none'})"
                )
            if event.result == "allow" and event.deny_message is not None:
                raise ValueError(f"events[{index}]: deny_message goes with result 'deny' only, not 'allow'")
            answered.add(use_id)
