"""The context view: what of the log the model sees, decided by the harness, computed the same way by the workflow
(to stay within the budget) and by the model activity (to build the request). Pure functions, no I/O.

The log is never changed: a view only elides and summarises. Two steps, cheap first:
1. Tool results older than the view's watermark (a log position) and larger than `ELIDE_MIN_BYTES` are sent as a
   short stub that names the position where the whole result still is, so every tool_use keeps its tool_result.
2. When that is not enough, older turns are summarised by a model call; the summary is an
   `agent.thread_context_compacted` event in the conversation, and the view shows it in place of the positions it
   stands for (always from the session's start, so the latest summary is the only one that counts). A summary ends
   just before a user message, and never takes a tool call whose result it leaves (`compaction_end`).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, TypeAdapter

from corral.contract.events import (
    AgentMcpToolResult,
    AgentThreadContextCompacted,
    AgentToolResult,
    ContentBlock,
    SessionEvent,
    SystemMessage,
    TextBlock,
    UserCustomToolResult,
    UserMessage,
    UserToolResult,
)

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

ToolResult = AgentToolResult | AgentMcpToolResult | UserCustomToolResult | UserToolResult
_EVENT: TypeAdapter[SessionEvent] = TypeAdapter(SessionEvent)
_BLOCK: TypeAdapter[ContentBlock] = TypeAdapter(ContentBlock)


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


SUMMARIZER_SYSTEM = (
    "You are compacting an agent's conversation so that it fits the model's context. Write a summary of the "
    "conversation above that lets the agent carry on: the user's requests and preferences, decisions made, facts "
    "learned, tool results that still matter (with their log positions), and what is left to do. Plain text."
)
SUMMARY_REQUEST = "Summarize the conversation so far, as your instructions say."
KEEP_TURNS = 2
"""A summary never takes the latest turns: the model keeps them word for word."""


def visible(entries: list[SessionEvent]) -> list[SessionEvent]:
    """The conversation with the latest summary in place of the entries it stands for (first, as they were), but for
    the system messages, which the request shows in its system prompt and are kept whatever their age."""
    summaries = [entry for entry in entries if isinstance(entry, AgentThreadContextCompacted)]
    if not summaries:
        return list(entries)
    latest = summaries[-1]
    rest = [
        e
        for e in entries
        if (e.position > latest.end_position or isinstance(e, SystemMessage))
        and not isinstance(e, AgentThreadContextCompacted)
    ]  # a system message is context for every later turn: no summary stands for it
    return [latest, *rest]


def view(entries: list[SessionEvent], watermark: int, max_chars: int | None = None) -> list[SessionEvent]:
    """The entries as the model sees them: summarised, then elided, with no content block over `max_chars`."""
    return [
        stub(entry) if isinstance(entry, ToolResult) and is_elided(entry, watermark) else fit_blocks(entry, max_chars)
        for entry in visible(entries)
    ]


def max_block_chars(budget: int) -> int:
    """The largest content block the view sends whole: half the budget. A bigger one could never fit beside the
    rest of a turn, and would make every request fail."""
    return budget * CHARS_PER_TOKEN // 2


def fit_blocks(entry: SessionEvent, max_chars: int | None) -> SessionEvent:
    """`entry` with each content block larger than `max_chars` (a 10 MB document, say) replaced by a note that
    says where it is kept whole; the entry itself when it has none."""
    content = getattr(entry, "content", None)
    if max_chars is None or not isinstance(content, list):
        return entry
    sizes = [len(_BLOCK.dump_json(block)) for block in content]
    if all(size <= max_chars for size in sizes):
        return entry
    fitted = [
        block
        if size <= max_chars
        else TextBlock(
            text=f"[a {block.type} block of {size} bytes, too large for the model's context: it is kept whole at "
            f"position {entry.position} of the session log]"
        )
        for block, size in zip(content, sizes, strict=True)
    ]
    return entry.model_copy(update={"content": fitted})


def compaction_end(entries: list[SessionEvent]) -> int | None:
    """The last position a new summary should stand for: just before the user message that opens the
    `KEEP_TURNS`-th latest turn, or an earlier one; None when there is no older turn left to summarise.

    The cut must be whole: every entry shown before the opening positioned before every entry from it on. A message
    queued while tools ran is in the log before their results, but in the conversation after them: a cut at it
    would keep the results and summarise their calls away (the API refuses a tool_result with no tool_use)."""
    shown = visible(entries)
    openings = [i for i, entry in enumerate(shown) if isinstance(entry, UserMessage)]
    for first_kept in reversed(openings[: len(openings) - KEEP_TURNS + 1] if len(openings) > KEEP_TURNS else []):
        older = [entry.position for entry in shown[:first_kept] if not isinstance(entry, AgentThreadContextCompacted)]
        if not older:
            return None
        kept = min(entry.position for entry in shown[first_kept:])
        if max(older) < kept:
            return kept - 1
    return None


def estimate_tokens(
    entries: list[SessionEvent], watermark: int, fixed_chars: int = 0, size: Callable[[SessionEvent], int] = json_size
) -> int:
    """Tokens of the request the view makes, estimated from sizes (`fixed_chars`: system prompt and tools)."""
    chars = fixed_chars
    for entry in visible(entries):
        chars += STUB_CHARS if is_elided(entry, watermark, size) else size(entry)
    return chars // CHARS_PER_TOKEN


def next_watermark(
    entries: list[SessionEvent], watermark: int, keep_after: int, size: Callable[[SessionEvent], int] = json_size
) -> int | None:
    """The watermark that elides one more large tool result (the oldest one still in full), never one at or after
    position `keep_after` (results the model has not seen yet); None when there is nothing left to elide."""
    for entry in visible(entries):
        if isinstance(entry, AgentThreadContextCompacted):
            continue  # the summary comes first but was written last; it is never elided
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
        for entry in visible(entries)[-MAX_VIEW_ENTRIES:]
    ]
    return ContextView(
        budget_tokens=budget,
        estimate_tokens=estimate_tokens(entries, watermark, fixed_chars, size),
        fixed_tokens=fixed_chars // CHARS_PER_TOKEN,
        watermark=watermark,
        entries=shown,
        omitted=max(0, len(visible(entries)) - MAX_VIEW_ENTRIES),
    )
