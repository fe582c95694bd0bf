"""Steps that read the conversation: a step repeated until the user side shows enough of something (a coordinator
waiting for its threads' replies), and text echoed from it (the replies it summarises).

A multi-agent run cannot be scripted by turn count alone: a coordinator's `wait_for_threads` returns when the first
thread replies, so how many waits it takes depends on timing. A step with `repeat_until` is played again on every
request until the conversation has `count` matches of `pattern`; the step after it then answers. Pure logic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RepeatUntil(BaseModel):
    """Play a step again until the conversation's user messages (their text and tool results) hold `count` matches
    of the regular expression `pattern`; it is played at least once."""

    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return pattern

    def met(self, user_text: str) -> bool:
        return len(re.findall(self.pattern, user_text)) >= self.count


def echoed_matches(pattern: str, user_text: str) -> str:
    r"""Every match of `pattern` in the user side's text, one a line (with groups in the pattern: its groups, joined
    by ": ", so `thread \((\w+)\): (.*)` quotes each reply as `name: text`)."""
    lines = []
    for match in re.finditer(pattern, user_text):
        lines.append(": ".join(g for g in match.groups() if g) if match.groups() else match.group(0))
    return "\n".join(lines)


UserText = Callable[[list[dict[str, Any]]], str]


def step_position(
    messages: list[dict[str, Any]], gates: Sequence[RepeatUntil | None], loop: bool, user_text: UserText
) -> int:
    """Which step answers a request whose conversation is `messages`: replay it, one step per assistant message,
    where a step with a gate is played again until the conversation a request brings (its user side's text, as
    `user_text` reads it) meets the gate. Without gates this is the count of assistant messages."""
    position, played = 0, 0

    def advance(seen: list[dict[str, Any]]) -> None:
        nonlocal position, played
        if played == 0:
            return
        index = position % len(gates) if loop else position
        gate = gates[index] if index < len(gates) else None
        if gate is None or gate.met(user_text(seen)):
            position, played = position + 1, 0

    for at, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            advance(messages[:at])
            played += 1
    advance(messages)
    return position
