"""The coordinator's tools, run by the harness itself (corral/contract/coordinator.py has their names and schemas):
spawn a thread, message one, wait for replies, consult the advisor. A bad call is an error result the model reads,
never a failed workflow.

Workflow code: no I/O; spawning is a child workflow start, the advisor a model activity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.coordinator import (
        CONSULT_ADVISOR,
        DEFAULT_WAIT_SECONDS,
        MAX_WAIT_SECONDS,
        MESSAGE_THREAD,
        SPAWN_THREAD,
        WAIT_FOR_THREADS,
    )
    from corral.contract.events import AgentToolUse, ModelUsage, SessionEvent
    from corral.contract.session import normalize_content
    from corral.contract.threads import SpawnThreadInput
    from workflows._advisor import consult
    from workflows._threads import SessionThreads


def _problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _text(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    return value if isinstance(value, str) and value.strip() else None


class CoordinatorTools:
    """Runs a coordinator's tool calls on the session's threads."""

    def __init__(self, threads: SessionThreads, pending: Callable[[], list[str]],
                 conversation: Callable[[], list[SessionEvent]], task_queue: str,
                 spent: Callable[[ModelUsage], None]) -> None:  # fmt: skip
        self._threads, self._pending, self._conversation = threads, pending, conversation
        self._task_queue, self._spent = task_queue, spent

    async def run(self, use: AgentToolUse) -> tuple[str, bool]:
        args = use.input
        if use.name == SPAWN_THREAD:
            try:
                input = SpawnThreadInput.model_validate(args)
                agent = self._threads.check_spawn(input)
            except ValidationError as exc:
                return f"spawn_thread: {_problem(exc)}", True
            except ApplicationError as exc:
                return f"spawn_thread: {exc.message}", True
            info = await self._threads.spawn(agent, normalize_content(input.message))
            return f"Started thread {info.id} running {agent.name}. It replies when it finishes its turn.", False
        if use.name == MESSAGE_THREAD:
            thread_id, message = _text(args, "thread_id"), _text(args, "message")
            if thread_id is None or message is None:
                return "message_thread: give `thread_id` and a non-empty `message`.", True
            try:
                self._threads.message(thread_id, normalize_content(message))
            except ApplicationError as exc:
                return f"message_thread: {exc.message}", True
            return f"Sent to {thread_id}.", False
        if use.name == WAIT_FOR_THREADS:
            ids = args.get("thread_ids") or []
            if not isinstance(ids, list) or not all(isinstance(tid, str) for tid in ids):
                return "wait_for_threads: `thread_ids` is a list of thread ids.", True
            timeout = args.get("timeout_seconds", DEFAULT_WAIT_SECONDS)
            if not isinstance(timeout, int | float) or not 1 <= timeout <= MAX_WAIT_SECONDS:
                return f"wait_for_threads: `timeout_seconds` is from 1 to {MAX_WAIT_SECONDS}.", True
            return await self._threads.wait(ids, float(timeout), self._pending), False
        if use.name == CONSULT_ADVISOR:
            model = self._threads.advisor_model()
            question = _text(args, "question")
            if model is None or question is None:
                return "consult_advisor: this agent has no advisor, or the question is empty.", True
            text, is_error, usage = await consult(model, question, self._conversation(), self._task_queue)
            self._spent(usage)
            return text, is_error
        return f"Unknown coordinator tool {use.name!r}.", True
