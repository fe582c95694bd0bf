"""The advisor of a multi-agent session: a model call the coordinator makes mid-turn (`consult_advisor`), a model
activity like any other, on the session's model workers, with its usage counted as the session's.

Workflow code: no I/O; the call is an activity.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ModelTextOutput, ModelTurnInput
    from corral.contract.agent import AgentConfig
    from corral.contract.coordinator import ADVISOR_SYSTEM, advisor_prompt
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolUse,
        AgentMessage,
        AgentThreadMessageReceived,
        AgentToolUse,
        ModelUsage,
        SessionEvent,
        TextBlock,
        UserMessage,
        WorkflowRunStatusEnded,
    )
    from workflows._hands import ModelRoute
    from workflows._outcomes import failure_message

ADVISOR_MAX_TOKENS = 2048


def transcript_lines(conversation: list[SessionEvent]) -> list[str]:
    """The conversation as plain lines (the advisor has no tools, so it may not see tool blocks as such)."""
    lines: list[str] = []
    for entry in conversation:
        text = " ".join(block.text for block in getattr(entry, "content", []) if isinstance(block, TextBlock))
        if isinstance(entry, UserMessage):
            lines.append(f"user: {text}")
        elif isinstance(entry, AgentThreadMessageReceived):
            lines.append(f"thread {entry.from_session_thread_id}: {text}")
        elif isinstance(entry, AgentMessage):
            lines.append(f"agent: {text}")
        elif isinstance(entry, WorkflowRunStatusEnded):
            lines.append(f"workflow run {entry.workflow_run_id} ended ({entry.result.type}): {entry.report or ''}")
        elif isinstance(entry, AgentToolUse | AgentMcpToolUse | AgentCustomToolUse):
            lines.append(f"agent calls {entry.name}: {entry.input}")
        elif text:
            lines.append(f"result: {text}")
    return lines


async def consult(model: str, question: str, conversation: list[SessionEvent],
                  task_queue: str) -> tuple[str, bool, ModelUsage]:  # fmt: skip
    """The advisor's answer (or why there is none, as an error result) and what it cost."""
    info = workflow.info()
    asked = UserMessage(id="advisor_question", position=1, created_at=workflow.now(),
                        content=[TextBlock(text=advisor_prompt(transcript_lines(conversation), question))])  # fmt: skip
    turn = ModelTurnInput(
        session_id=info.workflow_id,
        run_id=f"{info.run_id}/advisor/{workflow.uuid4().hex}",  # its own conversation in the model worker's cache
        turn=0,
        conversation_length=1,
        delta_start=0,
        delta=[asked],
        agent=AgentConfig(model=model, system=ADVISOR_SYSTEM, max_tokens=ADVISOR_MAX_TOKENS),
    )
    try:
        result = await ModelRoute(task_queue).call(turn, f"consult the advisor ({model})")
    except ActivityError as err:
        return f"The advisor could not answer: {failure_message(err)}", True, ModelUsage()
    text = "".join(block.text for block in result.content if isinstance(block, ModelTextOutput))
    return text or "(The advisor gave no answer.)", False, result.usage
