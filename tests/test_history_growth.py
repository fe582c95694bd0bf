"""History grows linearly: the bytes each turn adds stay flat over 100 turns (docs/invariants.md, invariant 2).

A model turn carries a reference to the log plus only the entries added since the previous turn, never the
transcript, so turn 100 costs what turn 1 cost. This is a ratio of bytes, not a time.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from corral.client import send_text
from tests.conftest import Stack, wait_for_idle

TURNS = 100
WINDOW = 10


async def _history_bytes(handle: WorkflowHandle) -> tuple[int, int]:
    """Total bytes of the history, and the largest `model_turn` activity input in it."""
    history = await handle.fetch_history()
    largest_input = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name == "model_turn":
                largest_input = max(largest_input, attributes.input.ByteSize())
    return sum(event.ByteSize() for event in history.events), largest_input


async def test_history_bytes_per_turn_stay_flat_over_100_turns(stack: Stack) -> None:
    model = stack.script(
        [
            {"text": "Computing.", "tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]},
            {"text": "The answer is 42, as the tool said."},
        ],
        loop=True,
    )
    handle = await stack.start(model, tools=[stack.hand_tool("calculate", expression={"type": "string"})])
    after = 0
    sizes: dict[int, tuple[int, int]] = {0: await _history_bytes(handle)}
    for turn in range(1, TURNS + 1):
        await send_text(handle, f"turn {turn}: what is 6*7?")
        events = await wait_for_idle(handle, after=after)
        after = events[-1].position
        if turn in (WINDOW, TURNS - WINDOW, TURNS):
            sizes[turn] = await _history_bytes(handle)
    first = (sizes[WINDOW][0] - sizes[0][0]) / WINDOW
    last = (sizes[TURNS][0] - sizes[TURNS - WINDOW][0]) / WINDOW
    print(f"\nhistory bytes per turn: turns 1-{WINDOW}: {first:.0f}, turns {TURNS - WINDOW + 1}-{TURNS}: {last:.0f}")
    print(f"largest model_turn input: after {WINDOW} turns {sizes[WINDOW][1]} B, after {TURNS}: {sizes[TURNS][1]} B")
    assert last / first < 1.15, f"history per turn grew from {first:.0f} to {last:.0f} bytes"
    assert sizes[TURNS][1] < 1.15 * sizes[WINDOW][1], "the model turn input grows with the conversation"


PARALLEL_TOOLS = 24
OUTPUT_CHARS = 150_000
"""Cut to 100 KB each (head and tail): 24 of them are 2.4 MB, over Temporal's 2 MB payload limit in one input."""


async def test_tool_output_enters_history_once_however_many_tools_run_in_parallel(stack: Stack) -> None:
    """Each tool result is in history once, as its hand's activity result; the next model turn's input refers to
    it instead of carrying it again, so one turn of many large parallel outputs never meets the payload limit."""
    uses = [{"name": "spew", "input": {"size": OUTPUT_CHARS, "tag": f"call-{n}-"}} for n in range(PARALLEL_TOOLS)]
    steps: list[dict[str, Any]] = [{"text": "Reading everything.", "tool_uses": uses}, {"text": "Read it all."}]
    model = stack.script(steps)
    # 2.4 MB is about 600,000 tokens: a model with a window that large (the point here is history, not the window).
    stack.model_server.register(model.removeprefix("script:"), {"steps": steps, "max_input_tokens": 1_000_000})
    tool = stack.hand_tool("spew", size={"type": "integer"}, tag={"type": "string"})
    handle = await stack.start(model, "print it all", tools=[tool])
    events = await wait_for_idle(handle, within_seconds=120)
    assert [e.type for e in events].count("agent.tool_result") == PARALLEL_TOOLS
    assert events[-2].type == "agent.message", [e.type for e in events[-3:]]

    total, largest_input = await _history_bytes(handle)
    outputs = sum(len(result) for result in _tool_results_sent(stack.requests(model)[-1]))
    print(f"\n{outputs} chars of tool output; history {total} B; largest model_turn input {largest_input} B")
    assert outputs >= PARALLEL_TOOLS * 100_000, "the model got every output in full (as cut for it)"
    assert all(f"call-{n}-" in text for n, text in enumerate(_tool_results_sent(stack.requests(model)[-1])))
    assert largest_input < 20_000, "the model turn's input carries the outputs again"
    assert total < 1.3 * outputs, "tool output entered history more than once"


def _tool_results_sent(request: dict[str, Any]) -> list[str]:
    """The text of every tool_result block in a recorded Messages API request, in order."""
    texts = []
    for message in request["body"]["messages"]:
        content = message["content"]
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_result":
                inner = block.get("content")
                texts.append(inner if isinstance(inner, str) else "".join(part.get("text", "") for part in inner))
    return texts
