"""What a dream reads and writes, as pure functions: a session's log as a transcript the dreaming agent reads, and
the dream session's outputs as the new contents of a store (workflows/dreams.py, activities/dreams.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from corral.contract.dreams import DREAM_OUTPUT_DIR
from corral.contract.events import SessionEvent

MAX_TRANSCRIPT_BLOCK_CHARS = 4000
"""A longer tool input or result is cut in the transcript (its head and a note): dreams learn from what was said."""


def _text(blocks: Iterable[Any]) -> str:
    parts = []
    for block in blocks:
        data = block.model_dump() if hasattr(block, "model_dump") else block
        if isinstance(data, dict) and data.get("type") == "text":
            parts.append(str(data.get("text", "")))
        elif isinstance(data, dict):
            parts.append(f"[{data.get('type', 'block')}]")
    return "\n".join(parts)


def _cut(text: str) -> str:
    if len(text) <= MAX_TRANSCRIPT_BLOCK_CHARS:
        return text
    return f"{text[:MAX_TRANSCRIPT_BLOCK_CHARS]}\n[… {len(text) - MAX_TRANSCRIPT_BLOCK_CHARS} more characters cut]"


def transcript(session_id: str, title: str | None, events: Iterable[SessionEvent]) -> str:
    """A session's log as Markdown: what the user and the agent said, the tools the agent used and what they
    answered (cut when long), and where the session stopped. Thinking, spans and statuses are left out."""
    lines = [f"# Session {session_id}" + (f": {title}" if title else ""), ""]
    for event in events:
        data = event.model_dump(mode="json")
        kind = data.get("type", "")
        if kind == "user.message":
            lines += ["## User", _text(getattr(event, "content", [])), ""]
        elif kind == "agent.message":
            lines += ["## Agent", _text(getattr(event, "content", [])), ""]
        elif kind in ("agent.tool_use", "agent.mcp_tool_use", "agent.custom_tool_use"):
            lines += [f"### Tool call `{data.get('name')}`", "```json", _cut(json.dumps(data.get("input"))), "```", ""]
        elif kind in ("agent.tool_result", "agent.mcp_tool_result", "user.custom_tool_result"):
            error = " (error)" if data.get("is_error") else ""
            lines += [f"### Tool result{error}", "```", _cut(_text(getattr(event, "content", []) or [])), "```", ""]
        elif kind == "session.status_idle":
            reason = (data.get("stop_reason") or {}).get("type")
            if reason and reason != "end_turn":
                lines += [f"_(the session stopped: {reason})_", ""]
    return "\n".join(lines).rstrip() + "\n"


def dreamed_contents(outputs: dict[str, bytes]) -> tuple[dict[str, str], list[str]]:
    """The new store from the dream session's outputs (path under the outputs dir -> bytes): each file under
    `memory/` becomes the memory at its path there; what is not UTF-8 text is left out and said so."""
    contents: dict[str, str] = {}
    skipped: list[str] = []
    prefix = DREAM_OUTPUT_DIR + "/"
    for path, data in sorted(outputs.items()):
        if not path.startswith(prefix):
            continue
        try:
            contents["/" + path[len(prefix) :]] = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(f"{path}: not UTF-8 text")
    return contents, skipped
