"""Outcomes: a goal the agent works toward until a grader finds it met (`user.define_outcome`).

After each turn the agent ends while an outcome is pursued, a grader (a separate model call, with its own prompt)
judges the work against the outcome's rubric and logs `span.outcome_evaluation_start`, `…_ongoing` heartbeats and
`…_end` with its verdict. `needs_revision` sends the grader's explanation back to the agent for another cycle; after
`max_iterations` cycles the result is `max_iterations_reached` and the agent takes one acknowledgment turn.

What here is persisted (the session query's `OutcomeEvaluation`, the carry) only gains optional fields.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.contract.events import ModelUsage, SessionEvent, SpanOutcomeEvaluationEnd, UserDefineOutcome

OutcomeResult = Literal[
    "pending", "running", "evaluating", "satisfied", "max_iterations_reached", "failed", "interrupted"
]
"""Where an outcome stands: `pending` before the agent starts on it, `running` while it works or revises,
`evaluating` while the grader judges; the rest are terminal."""
TERMINAL_RESULTS: Final = frozenset({"satisfied", "max_iterations_reached", "failed", "interrupted"})


class OutcomeEvaluation(BaseModel):
    """One outcome as `session.outcome_evaluations[]` shows it."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["outcome_evaluation"] = "outcome_evaluation"
    outcome_id: str
    description: str
    iteration: int = 0
    result: OutcomeResult = "pending"
    explanation: str | None = None
    completed_at: datetime | None = None


class OutcomesCarry(BaseModel):
    """A session's outcomes across a hand-over: every one defined, and where the pursued one is."""

    evaluations: list[OutcomeEvaluation] = Field(default_factory=list)
    active: UserDefineOutcome | None = None
    """The pursued outcome's `user.define_outcome` (None: none is pursued); carried whole, as the archive may hold
    its position."""
    acknowledging: bool = False
    """The pursued outcome reached its last iteration: the turn under way is its acknowledgment, not graded."""
    since_position: int = 0
    """Where the work being graded starts in the log (the outcome's definition, then each revision's start)."""


# ---- the grader ------------------------------------------------------------------------------------------------

GRADER_TOOL: Final = "outcome_verdict"
GRADER_VERDICTS: Final = ("satisfied", "needs_revision", "failed")
GRADER_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "result": {
            "type": "string",
            "enum": list(GRADER_VERDICTS),
            "description": "satisfied: every criterion is met. needs_revision: some criterion is not met and the "
            "agent can fix it. failed: the rubric does not apply to what the agent produced.",
        },
        "explanation": {
            "type": "string",
            "description": "Why, criterion by criterion; for needs_revision, exactly what the agent must change.",
        },
    },
    "required": ["result", "explanation"],
}
GRADER_SYSTEM: Final = (
    "You grade an AI agent's work against a rubric. You see the outcome the agent was asked for, the rubric, a "
    "transcript of the agent's work and the contents of files the rubric names. Judge only by the rubric. Answer by "
    f"calling the {GRADER_TOOL} tool exactly once; write nothing else."
)
GRADER_MAX_TOKENS: Final = 4096
GRADER_ATTEMPTS: Final = 2
"""Grader calls per cycle before the cycle ends as `failed` for want of a verdict (a reply with no verdict)."""
TRANSCRIPT_CHARS: Final = 60_000
"""The most of the agent's work the grader sees (its newest part)."""
FILE_CHARS: Final = 20_000
MAX_FILES: Final = 8
HEARTBEAT_SECONDS: Final = 5.0
"""How often `span.outcome_evaluation_ongoing` is logged while the grader works."""

_WORKSPACE_PATH = re.compile(r"(?<![\w/])(/workspace/[\w.\-/]*[\w\-])")


def files_named(rubric: str) -> list[str]:
    """The workspace files a rubric names (absolute `/workspace/...` paths), in order, at most `MAX_FILES` (pure)."""
    seen: dict[str, None] = {}
    for match in _WORKSPACE_PATH.finditer(rubric):
        if ".." not in match.group(1).split("/"):
            seen.setdefault(match.group(1), None)
    return list(seen)[:MAX_FILES]


GRADER_CYCLE_LINE: Final = "Evaluation cycle {cycle} of {of}."
"""The grader prompt's first line (1-based): the offline model server plays a script's `grader` steps by it."""


def grader_prompt(description: str, rubric: str, transcript: list[str], files: dict[str, str], iteration: int,
                  max_iterations: int) -> str:  # fmt: skip
    """What the grader is asked: the cycle, the outcome, the rubric, the newest transcript lines that fit, the files
    (pure)."""
    kept: list[str] = []
    size = 0
    for line in reversed(transcript):
        if size + len(line) > TRANSCRIPT_CHARS:
            break
        kept.append(line)
        size += len(line)
    work = "\n".join(reversed(kept)) or "(the agent produced nothing)"
    shown = "".join(
        f'<file path="{path}">\n{text[:FILE_CHARS]}{" […]" if len(text) > FILE_CHARS else ""}\n</file>\n'
        for path, text in files.items()
    )
    return (
        GRADER_CYCLE_LINE.format(cycle=iteration + 1, of=max_iterations) + "\n\n"
        f"<outcome>\n{description}\n</outcome>\n\n<rubric>\n{rubric}\n</rubric>\n\n"
        f"<transcript>\n{work}\n</transcript>\n\n{shown}"
        f"Grade the work against the rubric with the {GRADER_TOOL} tool."
    )


class Verdict(BaseModel):
    """The grader's answer, as its tool call gives it."""

    result: Literal["satisfied", "needs_revision", "failed"]
    explanation: str = Field(min_length=1)


class GradeOutcome(BaseModel):
    """What one grading cycle produced (workflow-side; the spans carry it)."""

    result: Literal["satisfied", "needs_revision", "failed"]
    explanation: str
    usage: ModelUsage = Field(default_factory=ModelUsage)


def revision_prompt(iteration: int, explanation: str) -> str:
    """What the agent reads after a `needs_revision` verdict."""
    return (
        f"[The grader evaluated your work (cycle {iteration + 1}): it needs revision.]\n{explanation}\n"
        "Revise the work to meet the outcome's rubric, then end your turn."
    )


def acknowledgment_prompt(max_iterations: int, explanation: str) -> str:
    """What the agent reads when the outcome's last cycle was not met: one turn to acknowledge, no more grading."""
    return (
        f"[The grader evaluated your work {max_iterations} times and the outcome is still not met; no more "
        f"evaluation follows.]\n{explanation}\nSay briefly where the work stands and what is left, then end your turn."
    )


def outcome_text(event: SessionEvent) -> str | None:
    """What the model reads of an outcome's events in the conversation (as the user's), or None for any other."""
    if isinstance(event, UserDefineOutcome):
        return f"[Outcome to achieve]\n{event.description}\n\n[Rubric it is graded by]\n{event.rubric.content}"
    if isinstance(event, SpanOutcomeEvaluationEnd):
        if event.result == "max_iterations_reached":
            return acknowledgment_prompt(event.iteration + 1, event.explanation)
        return revision_prompt(event.iteration, event.explanation)
    return None
