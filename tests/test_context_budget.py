"""The session is not the context window: a conversation that outgrows the model's input is elided, never dead.

The offline model server refuses a prompt over a script's `max_input_tokens` with the real API's 400 "prompt is
too long". Proactively, the harness keeps each request under `agent.context_budget_tokens` by eliding older large
tool results; reactively, a 400 elides what can be elided and the request is retried. The log keeps every raw
event either way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from temporalio.client import WorkflowHandle

from corral.client import read_events, send_text
from corral.contract.context import default_budget, estimate_tokens, next_watermark, stub, view
from corral.contract.events import AgentToolResult, AgentToolUse, SessionEvent, TextBlock, UserMessage
from tests.conftest import Stack, stop_reason, texts, wait_for_idle

TURNS = 12
OUTPUT = 3_000
"""Characters each tool call prints: 12 turns print 36,000, about 9,000 tokens, several windows of the model."""
WINDOW = 3_000


def _spewing_model(stack: Stack) -> str:
    steps: list[dict[str, Any]] = [
        {"text": "Looking.", "tool_uses": [{"name": "spew", "input": {"size": OUTPUT, "tag": "out-"}}]},
        {"text": "Seen it."},
    ]
    name = stack.script(steps, loop=True)
    stack.model_server.register(
        name.removeprefix("script:"), {"steps": steps, "loop": True, "max_input_tokens": WINDOW}
    )
    return name


async def _converse(stack: Stack, model: str, **agent: Any) -> tuple[WorkflowHandle, list[Any]]:
    tool = stack.hand_tool("spew", size={"type": "integer"}, tag={"type": "string"})
    handle = await stack.start(model, agent={"model": model, "tools": [tool], **agent})
    after = 0
    for turn in range(1, TURNS + 1):
        await send_text(handle, f"message {turn}")
        events = await wait_for_idle(handle, after=after, within_seconds=60)
        after = events[-1].position
        assert stop_reason(events[-1]).type == "end_turn", f"turn {turn}: {[e.type for e in events]}"
        assert texts(events)[-1] == "Seen it.", f"turn {turn} was not answered"
        asked = stack.requests(model)[-1]["body"]["messages"]
        assert f"message {turn}" in str(asked), f"the model never saw message {turn}"
    return handle, await read_events(handle)


async def test_a_budget_keeps_every_request_under_the_window(stack: Stack) -> None:
    model = _spewing_model(stack)
    handle, events = await _converse(stack, model, context_budget_tokens=2_500)

    assert not [e for e in events if e.type == "session.error"], "no request met the model's limit"
    results = [e for e in events if isinstance(e, AgentToolResult)]
    assert len(results) == TURNS and all(len(_first(r)) == OUTPUT for r in results), "the log keeps all"
    last = stack.requests(model)[-1]["body"]["messages"]
    sent = [b for m in last for b in m["content"] if isinstance(m["content"], list) and b["type"] == "tool_result"]
    elided = [b for b in sent if "elided from the context" in b["content"][0]["text"]]
    assert elided and len(sent[-1]["content"][0]["text"]) == OUTPUT, "old results elided, the newest in full"

    # `corral context` shows the same view: the elided results, the estimate within the budget.
    address = stack.client.service_client.config.target_host
    argv = [sys.executable, "-m", "cli.main", "--address", address, "context", handle.id, "--last", "0"]
    # In a thread: this event loop runs the workers that answer the CLI's query.
    shown = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    summary = " ".join(shown.stdout.split())
    assert "of 2500 tokens" in summary and f"{len(elided)} elided" in summary, summary
    assert summary.count("a stub (elided)") == len(elided) and "agent.tool_result" in summary


async def test_a_prompt_that_is_too_long_is_elided_and_retried(stack: Stack) -> None:
    model = _spewing_model(stack)  # no budget given: the default is the model's whole window (200,000)
    _, events = await _converse(stack, model)

    errors = [e for e in events if e.type == "session.error"]
    assert errors and all("prompt is too long" in e.error.message for e in errors)
    assert all(e.error.retry_status.type == "retrying" for e in errors), "never exhausted, never a dead session"
    assert not [e for e in events if e.type == "session.status_idle" and e.stop_reason.type == "retries_exhausted"]


def test_the_view_elides_old_large_results_and_keeps_pairs() -> None:
    use = AgentToolUse(id="sevt_1", position=1, created_at=_now(), name="spew", input={})
    old = AgentToolResult(id="sevt_2", position=2, created_at=_now(), tool_use_id="sevt_1", content=[_text(5000)])
    ask = UserMessage(id="sevt_3", position=3, created_at=_now(), content=[_text(10)])
    small = AgentToolResult(id="sevt_4", position=4, created_at=_now(), tool_use_id="sevt_x", content=[_text(10)])
    entries: list[SessionEvent] = [use, old, ask, small]
    assert next_watermark(entries, 0, keep_after=5) == 3, "the one large result"
    assert next_watermark(entries, 3, keep_after=5) is None, "small results are never worth eliding"
    assert next_watermark(entries, 0, keep_after=2) is None, "what the model has not seen stays"
    seen = view(entries, 3)
    assert isinstance(seen[1], AgentToolResult) and seen[1].tool_use_id == "sevt_1" and "position 2" in _first(seen[1])
    assert seen[0] is use and seen[3] is small and _first(old) == "x" * 5000, "the log is not changed"
    assert estimate_tokens(entries, 3) < estimate_tokens(entries, 0) / 3
    assert _first(stub(old)).startswith("[elided from the context")
    assert default_budget("claude-sonnet-4-5", 4096) == 185_904


def _first(result: Any) -> str:
    return str(result.content[0].text)


def _text(size: int) -> TextBlock:
    return TextBlock(text="x" * size)


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 1, 1, tzinfo=UTC)


MESSAGES = 40
WORDS = 100
"""40 messages of about 600 characters: some 6,000 tokens, several times the 2,500-token budget."""


def _noting_model(stack: Stack) -> str:
    steps: list[dict[str, Any]] = [{"text": "Noted."}]
    name = stack.script(steps, loop=True)
    stack.model_server.register(
        name.removeprefix("script:"), {"steps": steps, "loop": True, "max_input_tokens": WINDOW}
    )
    return name


async def _talk(stack: Stack, model: str, **agent: Any) -> tuple[WorkflowHandle, list[Any]]:
    handle = await stack.start(model, agent={"model": model, **agent})
    after = 0
    for n in range(1, MESSAGES + 1):
        await send_text(handle, f"note {n}: " + " ".join(f"word{n}x{i}" for i in range(WORDS)))
        events = await wait_for_idle(handle, after=after, within_seconds=60)
        after = events[-1].position
        assert stop_reason(events[-1]).type == "end_turn" and texts(events)[-1] == "Noted.", f"message {n}"
    return handle, await read_events(handle)


async def test_a_long_conversation_is_summarised_and_every_message_answered(stack: Stack) -> None:
    model = _noting_model(stack)
    handle, events = await _talk(stack, model, context_budget_tokens=2_500)

    assert not [e for e in events if e.type == "session.error"], "no request met the model's window"
    summaries = [e for e in events if e.type == "agent.thread_context_compacted"]
    assert len(summaries) >= 2, "the conversation outgrew the budget more than once"
    assert all(s.start_position == 1 for s in summaries)
    assert [s.end_position for s in summaries] == sorted({s.end_position for s in summaries}), "each goes further"
    assert "note 1:" in summaries[0].summary, "the stand-in's summary names what the user asked"
    notes = [e for e in events if e.type == "user.message"]
    assert len(notes) == MESSAGES and all(len(_first(n)) > WORDS * 5 for n in notes), "the log keeps every message"

    view = await handle.query("context_view")
    shown = [entry["type"] for entry in view["entries"]]
    assert shown[0] == "agent.thread_context_compacted" and shown.count("user.message") >= 2
    assert view["estimate_tokens"] <= 2_500
    latest = [e["position"] for e in view["entries"]]
    assert notes[-1].position in latest and notes[0].position not in latest, "recent turns in full, old ones summarised"


async def test_a_prompt_too_long_for_the_model_is_summarised_and_answered(stack: Stack) -> None:
    model = _noting_model(stack)  # the default budget (200,000) believes the prompt fits; the model (3,000) says no
    _, events = await _talk(stack, model)

    errors = [e for e in events if e.type == "session.error"]
    assert errors and all(e.error.retry_status.type == "retrying" for e in errors)
    assert any("prompt is too long" in e.error.message for e in errors)
    assert [e for e in events if e.type == "agent.thread_context_compacted"], "it summarised to go on"
