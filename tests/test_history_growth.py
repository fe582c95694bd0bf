"""History grows linearly: the bytes each turn adds stay flat over 100 turns (DESIGN.md, invariant 2).

A model turn carries a reference to the log plus only the entries added since the previous turn, never the
transcript, so turn 100 costs what turn 1 cost. This is a ratio of bytes, not a time.
"""

from __future__ import annotations

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
