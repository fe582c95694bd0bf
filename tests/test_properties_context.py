"""Property tests (hypothesis) of the context builder: however a session goes (messages queued mid-turn, parallel
tool calls, custom tool results, interrupts, outputs of any size, summaries), each request the model is sent keeps
the Messages API's rules, stays within the budget unless nothing more can be cut, and keeps the latest user message.

A session is played on the real pieces the workflow uses, without Temporal: `SessionLog` (the log and the
conversation), `record_response` (a model reply into events), `SessionContext` (elision and summaries, with a stand-in
summariser), and the model activity's `view` + `build_messages` (the request). Pure functions: no I/O.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from activities.context import build_messages
from corral.contract.activities import ModelTextOutput, ModelToolUseOutput, ModelTurnInput, ModelTurnResult
from corral.contract.context import CHARS_PER_TOKEN, compaction_end, next_watermark, view, visible
from corral.contract.events import (
    AgentCustomToolUse,
    AgentMcpToolUse,
    AgentThreadContextCompacted,
    AgentToolUse,
    SessionEvent,
    TextBlock,
    UserCustomToolResult,
    UserMessage,
)
from corral.contract.proxy import McpToolSpec
from corral.contract.session import AgentConfig
from workflows import SessionContext, SessionLog, record_response

NOW = datetime(2026, 12, 1, tzinfo=UTC)
MCP = McpToolSpec(server="docs", name="search")

# Sizes of a text (a message block, a tool output) relative to the budget's chars: tiny, around the elision
# threshold, a good share of the budget, more than a block may be.
SIZES = st.sampled_from([0, 1, 40, 900, 1_100, 1_100, 3_000, 3_000, 9_000, 30_000])
BLANKS = st.sampled_from(["", " ", "\n\n", "\t"])


def text(size: int, tag: str) -> str:
    return (tag + " " + "x" * size)[: max(size, 0)] if size else ""


# A session as a list of steps; each is played in order, the model's replies come from the steps too.
MESSAGE = st.tuples(st.just("message"), st.lists(st.one_of(SIZES, BLANKS), min_size=1, max_size=3))
REPLY = st.tuples(
    st.just("reply"),
    st.lists(st.one_of(SIZES, BLANKS), max_size=2),  # text blocks
    st.lists(st.sampled_from(["hand", "mcp", "custom"]), max_size=3),  # tool calls, in parallel
    st.lists(st.one_of(SIZES, BLANKS), min_size=3, max_size=3),  # their outputs
    st.booleans(),  # a message arrives while the tools run
)
INTERRUPT = st.tuples(st.just("interrupt"))
STEPS = st.lists(st.one_of(MESSAGE, REPLY, INTERRUPT), min_size=4, max_size=30)


@dataclass
class Session:
    """What the workflow keeps for the context, driven the way `SessionWorkflow` drives it."""

    budget: int
    log: SessionLog = field(init=False)
    context: SessionContext = field(init=False)
    pending: list[UserMessage] = field(default_factory=list)
    awaiting: list[AgentCustomToolUse] = field(default_factory=list)
    delta_start: int = 0
    fitted_from: int = 0
    """The `delta_start` of the latest model call: what the model had not seen then was not elided."""
    requests: int = 0
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.log = SessionLog(new_id=lambda: f"sevt_{next(self.counter)}", now=lambda: NOW)
        agent = AgentConfig(model="claude-test", context_budget_tokens=self.budget, max_tokens=1024)
        self.context = SessionContext(self.log, agent)

    def message(self, sizes: list[int | str]) -> None:
        blocks = [TextBlock(text=s if isinstance(s, str) else text(s, f"m{self.log.last_position + 1}")) for s in sizes]
        if all(not block.text.strip() for block in blocks):
            blocks.append(TextBlock(text=f"message {self.log.last_position + 1}"))  # what the validator demands
        self.pending.append(self.log.append(UserMessage, processed=False, content=blocks))

    def take_pending(self) -> None:
        for message in self.pending:
            self.log.add_to_conversation(message)
        self.pending.clear()

    def answer_custom(self) -> None:
        """The client answers every open custom call (or, with a message queued, the calls get an error)."""
        for use in self.awaiting:
            if self.pending:
                self.log.answer(use, "No result: the user sent a new message instead.", True)
            else:
                result = self.log.append(
                    UserCustomToolResult, custom_tool_use_id=use.id, content=[TextBlock(text="done")]
                )
                self.log.add_to_conversation(result)
        self.awaiting.clear()

    def model_call(self) -> list[dict[str, Any]]:
        """Fit the context as `ModelTurns.call` does, then build the request as the model activity does."""
        self.take_pending()
        self.requests += 1
        turn = ModelTurnInput(
            session_id="s",
            run_id="r",
            turn=self.requests,
            conversation_length=len(self.log.conversation),
            delta_start=self.delta_start,
            delta=[],
        )
        asyncio.run(self.context.fit(turn, summarise, report=lambda message: None))
        self.fitted_from = self.delta_start
        self.delta_start = len(self.log.conversation)
        return build_messages(view(self.log.conversation, self.context.watermark, self.context.max_block_chars))

    def reply(self, texts: list[int | str], tools: list[str], outputs: list[int | str], queued: bool) -> None:
        content: list[Any] = [
            ModelTextOutput(text=t if isinstance(t, str) else text(t, f"a{self.requests}")) for t in texts
        ]
        content += [
            ModelToolUseOutput(name={"hand": "spew", "mcp": MCP.model_name, "custom": "ask"}[kind], input={"k": i})
            for i, kind in enumerate(tools)
        ]
        result = ModelTurnResult(content=content, usage={}, model="m")
        uses = record_response(
            self.log, result, lambda name: MCP if name == MCP.model_name else None, lambda name: name == "ask"
        )
        if queued:
            self.message([20])
        for use, output in zip(uses, outputs, strict=False):
            if isinstance(use, AgentToolUse | AgentMcpToolUse):
                self.log.answer(use, output if isinstance(output, str) else text(output, f"out{use.position}"), False)
        self.awaiting = [use for use in uses if isinstance(use, AgentCustomToolUse)]
        if self.awaiting:
            self.answer_custom()

    def interrupt(self) -> None:
        """`_finish_interrupt`: open calls get an error result, then messages queued before the interrupt join."""
        for use in self.log.unanswered_tool_uses():
            self.log.answer(use, "Cancelled: the user interrupted this tool call.", True)
        self.awaiting.clear()
        self.take_pending()


async def summarise(turn: ModelTurnInput, summary: str) -> ModelTurnResult:
    """The stand-in model asked for a summary: a short one."""
    assert turn.summarize_through is not None
    return ModelTurnResult(
        content=[ModelTextOutput(text=f"summary through {turn.summarize_through}")], usage={}, model="m"
    )


def check_request(messages: list[dict[str, Any]], session: Session) -> None:
    """The Messages API's rules for `messages`, and corral's: the latest user message is there, whole."""
    assert messages and messages[0]["role"] == "user", "the first message is the user's"
    assert messages[-1]["role"] == "user", "the request ends with the user's turn"
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"], "roles alternate"
    for index, message in enumerate(messages):
        assert message["content"], "no message is empty"
        for block in message["content"]:
            if block["type"] == "text":
                assert block["text"].strip(), f"messages[{index}]: a text block with no text: {block!r}"
            if block["type"] == "tool_result":
                assert all(b["text"].strip() for b in block["content"] if b["type"] == "text"), "a blank tool result"
        kinds = [block["type"] for block in message["content"]]
        if message["role"] == "user":
            assert kinds == sorted(kinds, key=lambda kind: kind != "tool_result"), "tool results come first"
        uses = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
        following = messages[index + 1]["content"] if index + 1 < len(messages) else []
        answers = [block["tool_use_id"] for block in following if block["type"] == "tool_result"]
        if message["role"] == "assistant":
            assert sorted(answers) == sorted(uses), "each tool_use is answered in the next user message, once"
        else:
            previous = messages[index - 1]["content"] if index > 0 else []
            called = [block["id"] for block in previous if block["type"] == "tool_use"]
            mine = [block["tool_use_id"] for block in message["content"] if block["type"] == "tool_result"]
            assert set(mine) <= set(called), "a tool_result answers a tool_use of the message before it"

    latest = [entry for entry in session.log.conversation if isinstance(entry, UserMessage)][-1]
    sent = json.dumps(messages)
    for block in latest.content:
        if isinstance(block, TextBlock) and block.text.strip():
            fits = len(block.text) + 30 <= (session.context.max_block_chars or 0)
            assert (json.dumps(block.text)[1:-1] in sent) if fits else f"position {latest.position}" in sent, (
                "the latest user message is sent (a block too large for the context as a note naming its position)"
            )


def check_budget(messages: list[dict[str, Any]], session: Session) -> None:
    """Within the budget, or nothing left to cut: no large tool result the model has seen is in full, and no turn
    is left that a summary may take. The estimate (from event sizes) is also never below the request's real size."""
    context = session.context
    entries = session.log.conversation
    estimate = session.log.estimate(context.watermark, context._fixed_chars)
    real = (len(json.dumps(messages)) + context._fixed_chars) // CHARS_PER_TOKEN
    assert real <= estimate + 1, f"the estimate ({estimate}) is below the request's size ({real})"
    if estimate > context.budget:
        keep_after = context.unseen(session.fitted_from)
        assert next_watermark(entries, context.watermark, keep_after, session.log.size) is None, "could elide more"
        assert compaction_end(entries) is None, "could summarise more"


QUEUED_WHILE_TOOLS_RAN = [
    ("message", [0]),
    ("message", [0]),
    ("reply", [], ["hand", "hand", "hand"], [0, 0, 0], True),  # a message arrives while the tools run
    ("reply", [], ["hand", "hand", "hand"], [0, 0, 900], True),
    ("reply", [], [], [0, 0, 0], False),
]
"""Found by hypothesis: the summary ended just before the queued message, so it took the tool calls and left their
results (a request the API refuses)."""


@example(steps=QUEUED_WHILE_TOOLS_RAN, budget=1_000).via("a summary that cut tool calls from their results")
@example(steps=[("message", [40]), ("reply", ["\n\n"], ["hand"], [" ", 0, 0], False)], budget=1_000).via(
    "blank text from the model and a blank tool output"
)
@example(steps=[("message", ["", 40])], budget=1_000).via("an empty text block beside a real one")
@settings(max_examples=300, deadline=None)
@given(steps=STEPS, budget=st.sampled_from([1_000, 1_000, 2_500, 8_000]))
def test_every_request_keeps_the_api_rules_the_budget_and_the_latest_message(
    steps: list[tuple[Any, ...]], budget: int
) -> None:
    session = Session(budget)
    for step in steps:
        kind, *args = step
        if kind == "message":
            session.message(*args)
        elif kind == "interrupt":
            session.interrupt()
        elif session.pending or (session.log.conversation and session.log.conversation[-1].type != "agent.message"):
            # The model is called when there is something new for it: a message, or tool results.
            messages = session.model_call()
            event("summarised" if any(e.type == "agent.thread_context_compacted" for e in session.log.events) else "-")
            event("elided" if session.context.watermark else "-")
            check_request(messages, session)
            check_budget(messages, session)
            session.reply(*args)
    # The log itself is never changed: every event is in it, in order, in full.
    assert [event.position for event in session.log.events] == list(range(1, session.log.last_position + 1))


@settings(max_examples=200, deadline=None)
@given(steps=STEPS)
def test_a_summary_stands_for_a_whole_prefix(steps: list[tuple[Any, ...]]) -> None:
    """Reference: the entries the view shows after a summary are exactly those of the conversation positioned after
    its end, in conversation order; and no shown tool result's call is behind the summary."""
    session = Session(1_000)
    for step in steps:
        kind, *args = step
        if kind == "message":
            session.message(*args)
        elif kind == "interrupt":
            session.interrupt()
        else:
            session.take_pending()
            end = compaction_end(session.log.conversation)
            if end is not None:
                compacted = session.log.append(
                    AgentThreadContextCompacted, summary="s", start_position=1, end_position=end
                )
                session.log.add_to_conversation(compacted)
                shown = visible(session.log.conversation)
                rest: list[SessionEvent] = [
                    e for e in session.log.conversation if e.position > end and e.type != compacted.type
                ]
                assert shown == [compacted, *rest]
                calls = {e.id for e in rest if isinstance(e, AgentToolUse | AgentMcpToolUse | AgentCustomToolUse)}
                for entry in rest:
                    answered = getattr(entry, "tool_use_id", None) or getattr(entry, "mcp_tool_use_id", None)
                    answered = answered or getattr(entry, "custom_tool_use_id", None)
                    assert answered is None or answered in calls, "a tool result whose call was summarised away"
            session.reply(*args)
