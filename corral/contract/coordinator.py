"""The tools a multi-agent session's primary thread (its coordinator) uses to work with threads and its advisor.

The model sees them as ordinary tools (name, description, input schema); the harness runs them itself, in workflow
code, instead of sending them to a hand (workflows/_threads.py). Their names are reserved in a multi-agent agent:
an agent tool of the same name is refused when the agent is made.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SPAWN_THREAD: Final = "spawn_thread"
MESSAGE_THREAD: Final = "message_thread"
WAIT_FOR_THREADS: Final = "wait_for_threads"
CONSULT_ADVISOR: Final = "consult_advisor"
START_WORKFLOW_RUN: Final = "start_workflow_run"
THREAD_TOOLS: Final = (SPAWN_THREAD, MESSAGE_THREAD, WAIT_FOR_THREADS)
"""The tools of a coordinator that may spawn threads."""
ADVISOR_ROSTER_NAME: Final = "anthropic.advisor"
"""The advisor's name in a coordinator's roster (as upstream)."""
DEFAULT_WAIT_SECONDS: Final = 600
MAX_WAIT_SECONDS: Final = 3600


class InlineAgent(BaseModel):
    """An agent the coordinator defines on the spot: a name, a system prompt and a model (the coordinator's, when
    left out). It has the coordinator's own tools, without the coordinator's."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    system: str | None = Field(default=None, max_length=100_000)
    model: str | None = Field(default=None, min_length=1)


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_MESSAGE = {"type": "string", "description": "What to tell the thread."}
_THREAD = {"type": "string", "description": "The thread's id (sthr_…), or the name of the agent it runs when one open "
           "thread runs it."}  # fmt: skip
_TIMEOUT = {"type": "integer", "minimum": 1, "maximum": 86400, "description": "The whole run's wall-clock limit "
            "(default 1800)."}  # fmt: skip
_INLINE = {"name": {"type": "string"}, "system": {"type": "string"}, "model": {"type": "string"}}
TOOL_SCHEMAS: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    SPAWN_THREAD: (
        "Start a new thread: another agent, with its own context window, that works in parallel with you on the "
        "session's shared tools and workspace. Name a predefined agent (`agent`: its name, its id, or `self`), or "
        "define one (`inline_agent`, when allowed). The thread replies when it finishes its turn; collect replies "
        "with wait_for_threads. Returns the new thread's id.",
        _schema(
            {
                "agent": {"type": "string", "description": "A predefined agent's name or id, or `self`."},
                "inline_agent": {
                    "type": "object",
                    "description": "An agent defined here instead of a predefined one.",
                    "properties": {
                        "name": {"type": "string"},
                        "system": {"type": "string"},
                        "model": {"type": "string"},
                    },
                    "required": ["name"],
                },
                "message": _MESSAGE,
            },
            ["message"],
        ),
    ),
    MESSAGE_THREAD: (
        "Send a message to a thread you spawned. An idle thread starts a new turn; a busy one reads it next.",
        _schema(
            {"thread_id": _THREAD, "message": _MESSAGE},
            ["thread_id", "message"],
        ),
    ),
    WAIT_FOR_THREADS: (
        "Wait until a thread replies (or every thread waited on is idle), then read the replies, which follow this "
        "tool's result as messages from their threads. Waits on every running thread (and workflow run: until it "
        "ends, when its report follows) unless `thread_ids` names some (thread or run ids).",
        _schema(
            {
                "thread_ids": {"type": "array", "items": _THREAD},
                "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS},
            },
            [],
        ),
    ),
    START_WORKFLOW_RUN: (
        "Start a workflow run: a plan of named phases that runs durably in the background. Phases run in order; "
        "the tasks of a phase run at once, each as a thread (a predefined agent by `agent`, or `inline_agent`) on "
        "the session's shared tools and workspace. A phase ends when all its tasks have replied. In a task's "
        "message, {{phase}} stands for every reply of an earlier phase and {{phase.task}} for one. The run's "
        "report (its last phase's replies) reaches you as a message when it ends; wait for it with "
        "wait_for_threads, naming the run's id. Returns the run's id, or what is wrong with the plan.",
        _schema(
            {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "timeout_seconds": _TIMEOUT,
                "phases": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "description": "Letters, digits, _ and -; unique."},
                            "description": {"type": "string"},
                            "tasks": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string", "description": "Unique in its phase."},
                                        "agent": {"type": "string", "description": "A predefined agent or `self`."},
                                        "inline_agent": {
                                            "type": "object",
                                            "properties": _INLINE,
                                            "required": ["name"],
                                        },
                                        "message": {"type": "string"},
                                    },
                                    "required": ["message"],
                                },
                            },
                        },
                        "required": ["name", "tasks"],
                    },
                },
            },
            ["name", "phases"],
        ),
    ),
    CONSULT_ADVISOR: (
        "Ask the advisor, a stronger model, for advice on the task so far. It sees your question and the "
        "conversation's latest messages, and answers in text; it runs no tools.",
        _schema({"question": {"type": "string", "description": "What you want advice on."}}, ["question"]),
    ),
}


class CoordinatorTool(BaseModel):
    """A tool the harness runs itself for a coordinator (resolved, never sent by users)."""

    type: Literal["coordinator"] = "coordinator"
    name: str
    description: str
    input_schema: dict[str, Any]


def coordinator_tools(threads: bool, advisor: bool, runs: bool = False) -> list[CoordinatorTool]:
    """The tools a coordinator gets: the thread tools when it may spawn threads, the advisor's when it has one,
    `start_workflow_run` (and the wait) when it may start workflow runs."""
    names = [*(THREAD_TOOLS if threads else ()), *((CONSULT_ADVISOR,) if advisor else ())]
    if runs:
        names += [*((WAIT_FOR_THREADS,) if not threads else ()), START_WORKFLOW_RUN]
    return [CoordinatorTool(name=name, description=TOOL_SCHEMAS[name][0], input_schema=TOOL_SCHEMAS[name][1])
            for name in names]  # fmt: skip


ADVISOR_SYSTEM: Final = (
    "You are an advisor to an agent that coordinates other agents. You see its question and a transcript of its "
    "latest work. Answer the question directly, with concrete advice; you cannot run tools."
)
TRANSCRIPT_CHARS: Final = 40_000
"""The most of the coordinator's latest conversation the advisor sees (its newest part)."""
ENTRY_CHARS: Final = 2_000


def advisor_prompt(lines: list[str], question: str) -> str:
    """What the advisor is asked: the newest transcript lines that fit, then the question (pure)."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        line = line if len(line) <= ENTRY_CHARS else line[:ENTRY_CHARS] + " […]"
        if size + len(line) > TRANSCRIPT_CHARS:
            break
        kept.append(line)
        size += len(line)
    transcript = "\n".join(reversed(kept)) or "(nothing yet)"
    return f"<transcript>\n{transcript}\n</transcript>\n\nQuestion from the agent: {question}"
