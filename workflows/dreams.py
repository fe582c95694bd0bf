"""`DreamWorkflow`: one dream (corral.contract.dreams). It prepares a session of its own (the transcripts as files,
the store read-only), starts it as a child `SessionWorkflow`, waits for its turn to end, and then writes what the
session wrote under its outputs' `memory/` as the output store, in one transaction. Cancelling stops the session
and writes nothing. The workflow stays open once the dream has ended, at no cost, so the dream can still be
archived; its id is the dream's. No I/O here: every effect is an activity.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from workflows.policies import INFRASTRUCTURE_RETRY

with workflow.unsafe.imports_passed_through():
    from corral.contract.agent import AgentConfig
    from corral.contract.dreams import (
        DREAM_OUTPUT_DIR,
        TERMINAL_DREAM_STATUSES,
        ApplyDreamInput,
        DreamError,
        DreamInput,
        DreamResult,
        DreamState,
        PrepareDreamInput,
    )
    from corral.contract.knowledge import OUTPUTS_DIR, SessionKnowledge
    from corral.contract.sandbox import AgentToolset20260401
    from corral.contract.search_attributes import ARCHIVED_KEY, STATUS_KEY, WORKSPACE_KEY
    from corral.contract.session import SessionInfo, SessionInput
    from corral.names import (
        ACTIVITY_APPLY_DREAM,
        ACTIVITY_AWAIT_IDLE,
        ACTIVITY_PREPARE_DREAM,
        DREAM_WORKFLOW,
        QUERY_DREAM,
        SESSION_ID_PREFIX,
        SESSION_WORKFLOW,
        UPDATE_ARCHIVE_DREAM,
        UPDATE_CANCEL_DREAM,
    )

DREAM_SESSION_TIMEOUT = timedelta(hours=2)
"""The longest a dream's session may work before the dream fails with `timeout`."""
DREAM_SYSTEM = f"""You are dreaming: you reorganise a memory store that agents keep across sessions, using what \
happened in past sessions.

- The transcripts of the sessions are files under /mnt/session/uploads/, one per session.
- The memory store as it is now is under /mnt/memory/ (read-only).
- Write the complete new store under {OUTPUTS_DIR}/{DREAM_OUTPUT_DIR}/: one file per memory, at the path it is to \
have in the store ({OUTPUTS_DIR}/{DREAM_OUTPUT_DIR}/projects/corral.md becomes /projects/corral.md). Whatever you do \
not write there is not in the new store, so copy what is still true, merge duplicates, fix what the sessions proved \
wrong, and add what they taught.
- Memories are short UTF-8 text files (at most 100 KB each). End your turn when the new store is written."""


class _Cancelled(Exception):
    pass


@workflow.defn(name=DREAM_WORKFLOW)
class DreamWorkflow:
    @workflow.init
    def __init__(self, input: DreamInput) -> None:
        self._input = input
        self._state = DreamState()
        self._cancel = False
        self._applying = False
        """The output store is being written: a cancel now would not stop it, so the dream completes."""

    @workflow.run
    async def run(self, input: DreamInput) -> None:
        self._upsert()
        work = asyncio.create_task(self._dream(input))
        await workflow.wait_condition(lambda: self._cancel or work.done())
        if not work.done():
            work.cancel()
        try:
            await work
        except asyncio.CancelledError:
            pass  # the cancel this dream was asked for
        if self._state.status not in TERMINAL_DREAM_STATUSES:
            self._end("canceled")
        await workflow.wait_condition(lambda: self._state.archived_at is not None)
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _dream(self, input: DreamInput) -> None:
        session_id = SESSION_ID_PREFIX + workflow.uuid4().hex[:26]
        self._state.session_id, self._state.status = session_id, "running"
        self._upsert()
        try:
            knowledge: SessionKnowledge = await workflow.execute_activity(
                ACTIVITY_PREPARE_DREAM,
                PrepareDreamInput(
                    dream_id=input.dream_id,
                    workspace=input.workspace,
                    session_id=session_id,
                    session_ids=input.session_ids,
                    memory_store_id=input.memory_store_id,
                ),
                task_queue=input.model_task_queue,
                result_type=SessionKnowledge,
                start_to_close_timeout=timedelta(minutes=10),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["DreamInputGone"]),
                summary="prepare transcripts",
            )
        except ActivityError as err:
            return self._fail("invalid_input", _message(err))
        session = await workflow.start_child_workflow(
            SESSION_WORKFLOW,
            self._session_input(input, knowledge),
            id=session_id,
            task_queue=workflow.info().task_queue,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(WORKSPACE_KEY, input.workspace), SearchAttributePair(STATUS_KEY, "idle")]
            ),
            memo={"title": f"dream {input.dream_id}", "metadata": {"dream_id": input.dream_id}, "resources": []},
            parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
            static_summary=f"the session of dream {input.dream_id}",
        )
        try:
            info: SessionInfo = await workflow.execute_activity(
                ACTIVITY_AWAIT_IDLE,
                session_id,
                task_queue=input.model_task_queue,
                result_type=SessionInfo,
                start_to_close_timeout=DREAM_SESSION_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=60),
                retry_policy=INFRASTRUCTURE_RETRY,
                summary="wait for the dream's session",
            )
            self._state.usage = info.usage
            if info.stop_reason != "end_turn":
                return self._fail("internal_error", f"the dream's session stopped with {info.stop_reason!r}")
            self._applying = True
            result: DreamResult = await workflow.execute_activity(
                ACTIVITY_APPLY_DREAM,
                ApplyDreamInput(
                    dream_id=input.dream_id,
                    workspace=input.workspace,
                    session_id=session_id,
                    memory_store_id=input.memory_store_id,
                    output_behavior=input.output_behavior,
                    name=f"{input.memory_store_name} (dream {input.dream_id})",
                ),
                task_queue=input.model_task_queue,
                result_type=DreamResult,
                start_to_close_timeout=timedelta(minutes=10),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["DreamInputGone"]),
                summary="write the dreamed store",
            )
        except ActivityError as err:
            kind = "timeout" if "timeout" in type(err.cause).__name__.lower() else "internal_error"
            return self._fail(kind, _message(err))
        finally:
            if not session.done():
                session.cancel()  # the session ends (its sandbox released); its log stays readable
            try:
                await session
            except (ChildWorkflowError, asyncio.CancelledError):
                pass  # the session ends cancelled, which is how a dream ends it
        self._state.outputs, self._state.written = [result.memory_store_id], result.written
        self._end("completed")

    def _session_input(self, input: DreamInput, knowledge: SessionKnowledge) -> SessionInput:
        system = DREAM_SYSTEM + (
            f"\n\nInstructions for this dream:\n{input.instructions}" if input.instructions else ""
        )
        stores = ", ".join(store.mount_path for store in knowledge.memory_stores)
        return SessionInput(
            agent=AgentConfig(model=input.model.id, name="dreamer", system=system, tools=[AgentToolset20260401()]),
            title=f"dream {input.dream_id}",
            metadata={"dream_id": input.dream_id},
            knowledge=knowledge,
            message=f"Reorganise the memory store at {stores} using the {len(input.session_ids)} transcript(s) "
            f"under /mnt/session/uploads/. Write the whole new store under {OUTPUTS_DIR}/{DREAM_OUTPUT_DIR}/.",
            model_task_queue=input.model_task_queue,
        )

    def _fail(self, kind: str, message: str) -> None:
        if self._cancel:  # what failed was stopped by the cancel
            return self._end("canceled")
        self._state.error = DreamError(type=kind, message=message)
        self._end("failed")

    def _end(self, status: str) -> None:
        self._state.status = status  # type: ignore[assignment]
        self._state.ended_at = workflow.now()
        self._upsert()

    def _upsert(self) -> None:
        workflow.upsert_search_attributes(
            [
                WORKSPACE_KEY.value_set(self._input.workspace),
                STATUS_KEY.value_set(self._state.status),
                ARCHIVED_KEY.value_set("true" if self._state.archived_at else "false"),
            ]
        )
        state = self._state
        workflow.set_current_details(
            f"**{state.status}** · store `{self._input.memory_store_id}` · {len(self._input.session_ids)} session(s)"
            + (f" · session [{state.session_id}](../{state.session_id})" if state.session_id else "")
            + (f" · wrote {state.written} memories to `{state.outputs[0]}`" if state.outputs else "")
            + (f" · {state.error.type}: {state.error.message}" if state.error else "")
        )

    @workflow.query(name=QUERY_DREAM)
    def dream(self) -> DreamState:
        return self._state

    @workflow.update(name=UPDATE_CANCEL_DREAM)
    def cancel(self) -> DreamState:
        """Stop a pending or running dream (its session stops; nothing is written); a no-op once canceled."""
        if self._state.status not in TERMINAL_DREAM_STATUSES and not self._applying:
            self._cancel = True
        return self._state

    @cancel.validator
    def _check_cancel(self) -> None:
        if self._state.status in ("completed", "failed"):
            raise ApplicationError(f"the dream has {self._state.status}: it cannot be canceled", type="DreamEnded")

    @workflow.update(name=UPDATE_ARCHIVE_DREAM)
    def archive(self) -> DreamState:
        if self._state.archived_at is None:
            self._state.archived_at = workflow.now()
            self._upsert()
        return self._state

    @archive.validator
    def _check_archive(self) -> None:
        if self._state.status not in TERMINAL_DREAM_STATUSES:
            raise ApplicationError("only an ended dream can be archived: cancel it first", type="DreamRunning")


def _message(err: ActivityError | ChildWorkflowError) -> str:
    cause = err.cause
    return getattr(cause, "message", None) or str(cause or err)
