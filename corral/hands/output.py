"""Tool output as the model sees it: long output keeps its first and last 50 KB, with a marker saying how much was
cut in between. One rule for every hand (the sandbox, MCP servers, custom hands), so that no single tool result can
push an activity result, or a model request, past its limits however much a tool prints."""

from __future__ import annotations

OUTPUT_HEAD = 50_000
OUTPUT_TAIL = 50_000


def cut_output(text: str, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> str:
    """`text` if it is at most `head + tail` characters, else its head and tail around a marker."""
    if len(text) <= head + tail:
        return text
    marker = f"[output truncated: {len(text) - head - tail} of {len(text)} characters cut]"
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :]}"
