"""Outcome graders on the offline model server: a request is a grader's when it offers the `outcome_verdict` tool
(corral/contract/outcomes.py); a script plays its `grader` steps for such requests, by the evaluation cycle the
prompt names, so that retrying a grader's request plays the same step, as a turn's retry does."""

from __future__ import annotations

import re
from typing import Any

from corral.contract.outcomes import GRADER_CYCLE_LINE, GRADER_TOOL

_CYCLE = re.compile(re.escape(GRADER_CYCLE_LINE).replace(r"\{cycle\}", r"(\d+)").replace(r"\{of\}", r"\d+"))


def is_grader_request(body: dict[str, Any]) -> bool:
    return any(isinstance(tool, dict) and tool.get("name") == GRADER_TOOL for tool in body.get("tools") or [])


def grader_cycle(body: dict[str, Any]) -> int:
    """The 0-based evaluation cycle a grader's request names (0 when it names none)."""
    for message in body.get("messages") or []:
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content or [] if b]
        for text in texts:
            match = _CYCLE.search(str(text))
            if match:
                return int(match.group(1)) - 1
    return 0
