"""Many hands: a tool call routed to an example hand running in its own worker process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Stack, assert_log_is_whole, texts, unique, wait_for_idle

ROOT = Path(__file__).resolve().parent.parent


async def test_a_tool_call_is_routed_to_the_example_notes_hand(stack: Stack, tmp_path: Path) -> None:
    queue = unique("notes-hand")
    address = stack.client.service_client.config.target_host
    command = [sys.executable, "examples/hands/notes_hand.py", "--task-queue", queue, "--address", address]
    command += ["--db", str(tmp_path / "notes.sqlite")]
    hand = subprocess.Popen(command, cwd=ROOT, stdout=(tmp_path / "hand.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        tools: list[dict[str, Any]] = [
            {
                "type": "hand",
                "name": "save_note",
                "task_queue": queue,
                "description": "Save a note",
                "input_schema": {
                    "type": "object",
                    "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["title", "text"],
                },
            },
            {"type": "hand", "name": "list_notes", "task_queue": queue, "description": "List notes"},
        ]
        model = stack.script(
            [
                {"tool_uses": [{"name": "save_note", "input": {"title": "groceries", "text": "eggs"}}]},
                {"tool_uses": [{"name": "save_note", "input": {"title": "", "text": "x"}}]},
                {"tool_uses": [{"name": "list_notes", "input": {}}]},
                {"text": "noted"},
            ]
        )
        handle = await stack.start(model, message="remember eggs", tools=tools)
        events = await wait_for_idle(handle, within_seconds=60)
        assert_log_is_whole(events)
        assert texts(events, "agent.tool_result") == [
            "saved note 'groceries'",
            "save_note: title must not be empty",
            "groceries: eggs",
        ]
        errors = [e.is_error for e in events if e.type == "agent.tool_result"]
        assert errors == [False, True, False]
    finally:
        hand.send_signal(signal.SIGTERM)
        hand.wait(timeout=20)
