"""The context view: what of the log the model sees, decided by the harness, computed the same way by the workflow
(to stay within the budget) and by the model activity (to build the request). Pure functions, no I/O.

The log is never changed: a view only elides. Tool results older than the view's watermark (a log position) and
larger than `ELIDE_MIN_BYTES` are sent as a short stub that names the position where the whole result still is, so
every tool_use keeps its tool_result and the request stays valid. Summarising older turns is the next step of
compaction; it is not built yet.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, TypeAdapter

from corral.contract.events import AgentMcpToolResult, AgentToolResult, SessionEvent, TextBlock, UserCustomToolResult

ELIDE_MIN_BYTES = 1_024
"""Results this small stay in full: eliding them would save next to nothing."""
CHARS_PER_TOKEN = 4
"""The estimate's rule of thumb (the offline model server counts the same way); the real count comes back in
`usage.input_tokens`, and a request that is still too long is elided further and retried."""
KNOWN_INPUT_WINDOWS = {"claude-": 200_000, "corral-offline-stand-in": 200_000, "script:": 200_000}
"""Input windows by model name prefix; a model not listed gets the Claude window."""
DEFAULT_INPUT_WINDOW = 200_000
BUDGET_MARGIN = 0.05
"""Kept free below the window: the estimate is approximate."""

ToolResult = AgentToolResult | AgentMcpToolResult | UserCustomToolResult
_EVENT: TypeAdapter[SessionEvent] = TypeAdapter(SessionEvent)


def default_budget(model: str, max_tokens: int) -> int:
    """The model family's input window, minus the answer's room (`max_tokens`) and a margin."""
    window = next((size for prefix, size in KNOWN_INPUT_WINDOWS.items() if model.startswith(prefix)), None)
    window = window or DEFAULT_INPUT_WINDOW
    return max(1_000, int(window * (1 - BUDGET_MARGIN)) - max_tokens)


def json_size(entry: SessionEvent) -> int:
    """Characters of an entry as JSON: the size the estimate goes by."""
    return len(_EVENT.dump_json(entry))


def is_elided(entry: SessionEvent, watermark: int, size: Callable[[SessionEvent], int] = json_size) -> bool:
    """Whether the view with this watermark sends `entry` as a stub."""
    return isinstance(entry, ToolResult) and entry.position < watermark and size(entry) > ELIDE_MIN_BYTES


def stub(entry: ToolResult) -> ToolResult:
    """`entry` with its content replaced by a note that says where the whole result is."""
    size = sum(len(block.text) for block in entry.content if isinstance(block, TextBlock))
    note = (
        f"[elided from the context to save room: this tool result ({size} characters) is kept in full at position "
        f"{entry.position} of the session log]"
    )
    return entry.model_copy(update={"content": [TextBlock(text=note)]})


STUB_CHARS = 400
"""What a stub costs in the estimate (its note and the event's other fields)."""


def view(entries: list[SessionEvent], watermark: int) -> list[SessionEvent]:
    """The entries as the model sees them."""
    return [
        stub(entry) if isinstance(entry, ToolResult) and is_elided(entry, watermark) else entry for entry in entries
    ]


def estimate_tokens(
    entries: list[SessionEvent], watermark: int, fixed_chars: int = 0, size: Callable[[SessionEvent], int] = json_size
) -> int:
    """Tokens of the request the view makes, estimated from sizes (`fixed_chars`: system prompt and tools)."""
    chars = fixed_chars
    for entry in entries:
        chars += STUB_CHARS if is_elided(entry, watermark, size) else size(entry)
    return chars // CHARS_PER_TOKEN


def next_watermark(
    entries: list[SessionEvent], watermark: int, keep_after: int, size: Callable[[SessionEvent], int] = json_size
) -> int | None:
    """The watermark that elides one more large tool result (the oldest one still in full), never one at or after
    position `keep_after` (results the model has not seen yet); None when there is nothing left to elide."""
    for entry in entries:
        if entry.position >= keep_after:
            return None
        if isinstance(entry, ToolResult) and entry.position >= watermark and size(entry) > ELIDE_MIN_BYTES:
            return entry.position + 1
    return None


class ContextEntry(BaseModel):
    """One conversation entry as the next request shows it."""

    position: int
    type: str
    tokens: int
    elided: bool = False


class ContextView(BaseModel):
    """Answer of the `context_view` query: what the model would see on the next turn (`corral context`)."""

    budget_tokens: int
    estimate_tokens: int
    fixed_tokens: int
    """The system prompt and the tools."""
    watermark: int
    entries: list[ContextEntry]
    """The conversation in order; at most the last `MAX_VIEW_ENTRIES`, `omitted` before them."""
    omitted: int = 0


MAX_VIEW_ENTRIES = 2_000
"""Keeps the query's answer far under Temporal's blob limit whatever the session's length."""


def describe_view(
    entries: list[SessionEvent], watermark: int, budget: int, fixed_chars: int, size: Callable[[SessionEvent], int]
) -> ContextView:
    shown = [
        ContextEntry(
            position=entry.position,
            type=entry.type,
            tokens=(STUB_CHARS if is_elided(entry, watermark, size) else size(entry)) // CHARS_PER_TOKEN,
            elided=is_elided(entry, watermark, size),
        )
        for entry in entries[-MAX_VIEW_ENTRIES:]
    ]
    return ContextView(
        budget_tokens=budget,
        estimate_tokens=estimate_tokens(entries, watermark, fixed_chars, size),
        fixed_tokens=fixed_chars // CHARS_PER_TOKEN,
        watermark=watermark,
        entries=shown,
        omitted=max(0, len(entries) - MAX_VIEW_ENTRIES),
    )
