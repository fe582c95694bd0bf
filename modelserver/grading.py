"""Outcome graders on the offline model server: a request is a grader's when it offers the `outcome_verdict` tool
(corral/contract/outcomes.py); a script plays its `grader` steps for such requests, by the evaluation cycle the
prompt names, so that retrying a grader's request plays the same step, as a turn's retry does.

A script with no `grader` steps answers the grader from its `steps`, in script order (`ScriptOrder`): a grader's
request has one user message, the grader's prompt, and none of the agent's conversation, so its step cannot be
counted from its assistant messages as an agent's is. The grader's turn takes the step after the furthest one the
script played, and the agent's turns skip the steps the grader took: a test writes an outcome down as it happens,
the work, the verdict, the revision, the next verdict. Pure logic.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corral.contract.outcomes import GRADER_CYCLE_LINE, GRADER_TOOL
from modelserver.gates import UserText, step_position

if TYPE_CHECKING:
    from modelserver.scripts import Script

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


@dataclass
class ScriptOrder:
    """How far one script was played: which step answers each request, the grader's taking steps too, and how many
    times each step was played (a step's scripted failures come first)."""

    grader_steps: set[int] = field(default_factory=set)
    """Every step a grader request took: the agent's turns skip them."""
    by_request: dict[str, int] = field(default_factory=dict)
    """The step a grader request (by its content) took last, so that a retry of the same call gets the same step."""
    plays: dict[int, int] = field(default_factory=dict)
    last: int = -1
    """The step the script played last (where a looping script is)."""
    furthest: int = -1
    """The furthest step the script has played (where any other is: an agent's retry of an earlier step does not
    move it back)."""

    def step(self, body: dict[str, Any], script: Script, user_text: UserText) -> int:
        """The step answering a request, an agent's or the grader's; past the end, an index the caller refuses."""
        return self.grader_step(body, script) if is_grader_request(body) else self.agent_step(body, script, user_text)

    def agent_step(self, body: dict[str, Any], script: Script, user_text: UserText) -> int:
        """The step of an agent's request: counted from its assistant messages (gates included) over the steps no
        grader took. Past the end: the count as a step index (the caller refuses it)."""
        agent_steps = [i for i in range(len(script.steps)) if i not in self.grader_steps]
        gates = [script.steps[i].repeat_until for i in agent_steps]
        position = step_position(body.get("messages") or [], gates, script.loop, user_text)
        if position < len(agent_steps):
            return agent_steps[position]
        if script.loop and agent_steps:
            return agent_steps[position % len(agent_steps)]
        return len(script.steps) + position - len(agent_steps)

    def grader_step(self, body: dict[str, Any], script: Script) -> int:
        """The step of a grader's request: the one after the furthest played, or, for the same call again, the step
        it had, unless that step answered without a verdict (then the grader is asking again: the next step)."""
        key = hashlib.sha256(json.dumps([body.get("system"), body.get("messages")], sort_keys=True).encode())
        fingerprint = key.hexdigest()
        earlier = self.by_request.get(fingerprint)
        if earlier is not None and earlier < len(script.steps):
            step = script.steps[earlier]
            failed_last = self.plays.get(earlier, -1) < len(step.fail)
            if failed_last or any(tool.name == GRADER_TOOL for tool in step.tool_uses):
                return earlier
        index = (self.last + 1) % len(script.steps) if script.loop else self.furthest + 1
        self.by_request[fingerprint] = index
        self.grader_steps.add(index)
        return index

    def played(self, key: int) -> int:
        """Count a play of step `key` (a `grader` list's step `i` is `-1 - i`); the plays before it."""
        if key >= 0:
            self.last, self.furthest = key, max(self.furthest, key)
        self.plays[key] = self.plays.get(key, -1) + 1
        return self.plays[key]
