"""Prompt caching as the offline model server accounts for it, honestly enough to measure a harness by.

A request's prompt is read as a sequence of blocks: each tool definition, the system prompt, then every content
block of every message, in order. A block carrying `cache_control` is a breakpoint. A cache read is the longest
prefix of this request, ending at or before its last breakpoint, that equals a prefix an earlier request wrote
(every earlier request writes the prefix up to each of its breakpoints). What this request writes beyond the read
is the cache creation. The rest of the prompt is `input_tokens`, as the real API reports it. Tokens are counted
like `estimate_input_tokens`: four characters a token, over the blocks' JSON without their `cache_control`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [dict(tool) for tool in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        blocks.append({"type": "text", "text": system})
    elif isinstance(system, list):
        blocks.extend(dict(block) for block in system)
    for message in body.get("messages") or []:
        content = message.get("content")
        items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        blocks.extend({"role": message.get("role"), **block} for block in items)
    return blocks


class PromptCache:
    """The prefixes earlier requests wrote, by hash (bounded: the oldest are forgotten first)."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._written: dict[str, None] = {}
        self._max_entries = max_entries
        self._lock = threading.Lock()

    def account(self, body: dict[str, Any], total_tokens: int) -> CacheUsage:
        """Split `total_tokens` of this request into read, written and uncached tokens, and remember its writes."""
        blocks = _blocks(body)
        digest = hashlib.sha256(str(body.get("model")).encode())
        prefixes: list[tuple[str, int, bool]] = []  # (hash, characters so far, is a breakpoint)
        chars = 0
        for block in blocks:
            breakpoint = "cache_control" in block
            plain = {key: value for key, value in block.items() if key != "cache_control"}
            text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
            digest.update(text.encode())
            chars += len(text)
            prefixes.append((digest.copy().hexdigest(), chars, breakpoint))
        last_breakpoint = max((i for i, (_, _, bp) in enumerate(prefixes) if bp), default=-1)
        with self._lock:
            read_chars = max(
                (
                    size
                    for index, (key, size, _) in enumerate(prefixes)
                    if index <= last_breakpoint and key in self._written
                ),
                default=0,
            )
            for key, _, breakpoint in prefixes:
                if breakpoint:
                    self._written[key] = None
            while len(self._written) > self._max_entries:
                self._written.pop(next(iter(self._written)))
        written_chars = prefixes[last_breakpoint][1] - read_chars if last_breakpoint >= 0 else 0
        read, written = read_chars // 4, max(0, written_chars) // 4
        return CacheUsage(max(1, total_tokens - read - written), read, written)
