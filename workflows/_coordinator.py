"""The coordinator's tools, run by the harness itself (corral/contract/coordinator.py has their names and schemas):
spawn a thread, message one, wait for replies (and for workflow runs), consult the advisor, start a workflow run
(workflows/_runs.py). A bad call is an error result the model reads,
never a failed workflow.

Workflow code: no I/O; spawning is a child workflow start, the advisor a model activity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
        START_WORKFLOW_RUN,
        WAIT_FOR_THREADS,
    )
    from corral.contract.events import (
        AgentThreadMessageReceived,
        AgentToolUse,
        ModelUsage,
        SessionEvent,
        WorkflowRunStatusEnded,
    )
    from corral.contract.session import normalize_content
    from corral.contract.threads import SpawnThreadInput
    from corral.names import WORKING_STATUSES
    from workflows._advisor import consult
    from workflows._threads import USER_SENDER, SessionThreads
if TYPE_CHECKING:
    from workflows._inbox import UserInbox
    from workflows._runs import SessionRuns


def _problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _text(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    return value if isinstance(value, str) and value.strip() else None


class CoordinatorTools:
    """Runs a coordinator's tool calls on the session's threads."""

    def __init__(self, threads: SessionThreads, runs: SessionRuns, inbox: UserInbox,
                 conversation: Callable[[], list[SessionEvent]], task_queue: str,
                 spent: Callable[[ModelUsage], None]) -> None:  # fmt: skip
        self._threads, self._runs, self._inbox, self._conversation = threads, runs, inbox, conversation
        self._task_queue, self._spent = task_queue, spent

    def _pending(self) -> list[str]:
        """Who the input queued for the coordinator is from: a thread's id, a workflow run's, or `user`."""
        senders: list[str] = []
        for message in self._inbox.pending:
            if isinstance(message, AgentThreadMessageReceived):
                senders.append(message.from_session_thread_id)
            else:
                senders.append(message.workflow_run_id if isinstance(message, WorkflowRunStatusEnded) else USER_SENDER)
        return senders

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
                sent_to = self._threads.message(thread_id, normalize_content(message))
            except ApplicationError as exc:
                return f"message_thread: {exc.message}", True
            return f"Sent to {sent_to}.", False
        if use.name == WAIT_FOR_THREADS:
            ids = args.get("thread_ids") or []
            if not isinstance(ids, list) or not all(isinstance(tid, str) for tid in ids):
                return "wait_for_threads: `thread_ids` is a list of thread ids.", True
            timeout = args.get("timeout_seconds", DEFAULT_WAIT_SECONDS)
            if not isinstance(timeout, int | float) or not 1 <= timeout <= MAX_WAIT_SECONDS:
                return f"wait_for_threads: `timeout_seconds` is from 1 to {MAX_WAIT_SECONDS}.", True
            return await self._wait(ids, float(timeout)), False
        if use.name == START_WORKFLOW_RUN:
            return await self._runs.start_tool(args)
        if use.name == CONSULT_ADVISOR:
            model = self._threads.advisor_model()
            question = _text(args, "question")
            if model is None or question is None:
                return "consult_advisor: this agent has no advisor, or the question is empty.", True
            text, is_error, usage = await consult(model, question, self._conversation(), self._task_queue)
            self._spent(usage)
            return text, is_error
        return f"Unknown coordinator tool {use.name!r}.", True

    async def _wait(self, thread_ids: list[str], timeout_seconds: float) -> str:
        """Wait until a thread or workflow run of `thread_ids` (every open thread and running run when empty)
        replies (a run: ends) or none of them runs; the tool's result. `self._pending` names the senders of the
        input already queued for the coordinator."""
        threads, runs = self._threads, self._runs.infos
        thread_ids = [threads.named(wanted) for wanted in thread_ids]
        unknown = [tid for tid in thread_ids if tid not in threads.infos and tid not in runs]
        if unknown:
            known = [*threads.infos, *runs]
            return f"Unknown thread ids: {', '.join(unknown)}. Threads and runs: {', '.join(known) or 'none'}."
        targets = thread_ids or [
            *(tid for tid, info in threads.infos.items() if info.archived_at is None and info.workflow_run_id is None),
            *(rid for rid, info in runs.items() if info.status != "ended"),
        ]
        if not targets:
            return "No thread to wait for: spawn one first."
        seen = {tid: threads.replies.get(tid, 0) for tid in targets}

        def status(tid: str) -> str:
            return runs[tid].status if tid in runs else threads.infos[tid].status

        def replied() -> list[str]:
            queued = set(self._pending())
            return [tid for tid in targets if tid in queued or threads.replies.get(tid, 0) > seen[tid]]

        def settled() -> bool:
            stopped = all(status(tid) == "ended" if tid in runs else status(tid) not in WORKING_STATUSES
                          for tid in targets)  # fmt: skip
            return bool(replied()) or stopped or USER_SENDER in self._pending()

        try:
            await workflow.wait_condition(settled, timeout=timeout_seconds)
        except asyncio.TimeoutError:  # noqa: UP041 - the builtin, not temporalio.exceptions.TimeoutError
            running = [tid for tid in targets if status(tid) == "running"]
            return f"No reply after {timeout_seconds:g} s. Still running: {', '.join(running) or 'none'}."
        answered = replied()
        if answered:
            return f"Replies from {', '.join(answered)} follow this result."
        if USER_SENDER in self._pending():
            return "The user sent a message, which follows this result; the threads are still working."
        states = ", ".join(f"{tid} {status(tid)}" for tid in targets)
        return f"No new reply, and no thread waited on is running ({states})."
