"""A session's files, skills and memory stores as its workflow keeps them (corral.contract.knowledge): the memory
stores exported for each new container, and after each turn that used the sandbox, what the agent wrote to its
outputs and its writable stores collected (on the sandbox's engine) and committed (on the model workers: outputs
become files of the session's scope, memory changes versions attributed to the session). Workflow code: every
effect is an activity; a failed collect or commit is logged and tried again after the next turn, never a failed
session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.policies import CONTROL_TIMEOUT, ENGINE_SCHEDULE_TO_START, INFRASTRUCTURE_RETRY

with workflow.unsafe.imports_passed_through():
    from corral.contract.agent import AgentConfig
    from corral.contract.carry import KnowledgeCarry
    from corral.contract.knowledge import (
        Collected,
        CommitInput,
        CommitResult,
        ExportInput,
        FileMount,
        FileResourceChange,
        MemoryExport,
        SessionKnowledge,
        with_knowledge_prompt,
    )
    from corral.contract.sandbox import CollectInput, SandboxHandle
    from corral.names import (
        ACTIVITY_COLLECT_KNOWLEDGE,
        ACTIVITY_COMMIT_KNOWLEDGE,
        ACTIVITY_EXPORT_MEMORY,
        NO_FILE_RESOURCES,
        QUERY_OUTPUTS,
        UPDATE_ADD_FILE,
        UPDATE_REMOVE_FILE,
    )

if TYPE_CHECKING:
    from workflows._sandbox import SessionSandbox


def prompted_agent(agent: AgentConfig, knowledge: SessionKnowledge | None) -> AgentConfig:
    """The agent as the model is given it: its system prompt followed by its skills and memory stores."""
    if knowledge is None:
        return agent
    return agent.model_copy(update={"system": with_knowledge_prompt(agent.system, knowledge)})


class KnowledgeSync:
    """One session's knowledge: None for a session without any (every method is then a no-op, and no activity
    runs, so sessions recorded before knowledge existed replay unchanged)."""

    def __init__(self, session_id: str, knowledge: SessionKnowledge | None, model_queue: str) -> None:
        self.session_id = session_id
        self.knowledge = knowledge
        self._model_queue = model_queue
        self.exports: list[MemoryExport] = []
        self.outputs_seen: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        """Output path -> the id of the file it became."""
        self.dirty = False
        """A tool ran in the sandbox since the last collect."""

    def carried(self) -> KnowledgeCarry | None:
        if self.knowledge is None:
            return None
        return KnowledgeCarry(exports=self.exports, outputs_seen=self.outputs_seen, outputs=self.outputs,
                              dirty=self.dirty)  # fmt: skip

    def resume(self, carry: KnowledgeCarry | None) -> None:
        if carry is not None:
            self.exports, self.outputs_seen = carry.exports, carry.outputs_seen
            self.outputs, self.dirty = carry.outputs, carry.dirty

    def serve(self, sandbox: SessionSandbox, refuse_when_closed: Callable[[], None]) -> None:
        """Set this workflow's handlers of file resources (the updates that add and remove one) and of its outputs
        (a query), here rather than as methods of `SessionWorkflow`."""

        def check_add(change: FileResourceChange) -> None:
            refuse_when_closed()
            if change.mount is None or self.knowledge is None:
                raise ApplicationError("this session takes no file resources (it was not started by the API)",
                                       type=NO_FILE_RESOURCES, non_retryable=True)  # fmt: skip

        async def add(change: FileResourceChange) -> None:
            """Mount one more file (the gateway resolved it): placed before the next call in the running container,
            in every container made later; the resource list the API shows is the memo's."""
            assert change.mount is not None
            self.add_file(change.mount)
            sandbox.restock = sandbox.running
            workflow.upsert_memo({"resources": change.resources})

        def check_remove(change: FileResourceChange) -> None:
            refuse_when_closed()
            if self.knowledge is None or all(mount.id != change.resource_id for mount in self.knowledge.files):
                raise ApplicationError(f"no file resource {change.resource_id!r} in this session",
                                       type=NO_FILE_RESOURCES, non_retryable=True)  # fmt: skip

        async def remove(change: FileResourceChange) -> None:
            """Mount the file no more: containers made from now on lack it (the running one keeps it till then)."""
            self.remove_file(change.resource_id)
            workflow.upsert_memo({"resources": change.resources})

        def outputs() -> dict[str, str]:
            """What the agent wrote under `/mnt/session/outputs/`, kept as files: path -> file id."""
            return dict(self.outputs)

        workflow.set_update_handler(UPDATE_ADD_FILE, add, validator=check_add)
        workflow.set_update_handler(UPDATE_REMOVE_FILE, remove, validator=check_remove)
        workflow.set_query_handler(QUERY_OUTPUTS, outputs)

    # ---- into the sandbox ---------------------------------------------------------------------------------------

    async def for_new_container(self, fresh: bool) -> list[MemoryExport]:
        """The stores to place in a container being made: exported anew for a fresh one (its `/mnt` is empty), the
        ones it was given for a running one (placing again adds files; its stores are left as the agent has them)."""
        if self.knowledge is None or not self.knowledge.memory_stores or not fresh:
            return self.exports
        self.exports = await workflow.execute_activity(
            ACTIVITY_EXPORT_MEMORY,
            ExportInput(workspace=self.knowledge.workspace, session_id=self.session_id,
                        memory_store_ids=[store.memory_store_id for store in self.knowledge.memory_stores]),
            task_queue=self._model_queue,
            result_type=list[MemoryExport],
            start_to_close_timeout=CONTROL_TIMEOUT,
            retry_policy=INFRASTRUCTURE_RETRY,
            summary="export memory stores",
        )  # fmt: skip
        return self.exports

    def add_file(self, mount: FileMount) -> None:
        assert self.knowledge is not None
        self.knowledge.files = [*[f for f in self.knowledge.files if f.id != mount.id], mount]

    def remove_file(self, resource_id: str) -> FileMount | None:
        assert self.knowledge is not None
        found = next((mount for mount in self.knowledge.files if mount.id == resource_id), None)
        self.knowledge.files = [mount for mount in self.knowledge.files if mount.id != resource_id]
        return found

    # ---- out of the sandbox -------------------------------------------------------------------------------------

    async def collect(self, handle: SandboxHandle | None) -> None:
        """Keep what the agent wrote since the last collect (a no-op if no tool ran in the sandbox since)."""
        if self.knowledge is None or handle is None or not self.dirty:
            return
        writable = {store.memory_store_id: store.mount_path for store in self.knowledge.memory_stores
                    if store.access == "read_write"}  # fmt: skip
        bases = [export for export in self.exports if export.memory_store_id in writable]
        try:
            collected: Collected = await workflow.execute_activity(
                ACTIVITY_COLLECT_KNOWLEDGE,
                CollectInput(
                    session_id=self.session_id,
                    sandbox=handle,
                    outputs_seen=self.outputs_seen,
                    memory=bases,
                    mounts=writable,
                ),
                task_queue=handle.task_queue,
                result_type=Collected,
                start_to_close_timeout=CONTROL_TIMEOUT,
                schedule_to_start_timeout=ENGINE_SCHEDULE_TO_START,
                retry_policy=INFRASTRUCTURE_RETRY,
                summary="collect outputs and memory",
            )
            self.dirty = False
            if not collected:
                return
            result: CommitResult = await workflow.execute_activity(
                ACTIVITY_COMMIT_KNOWLEDGE,
                CommitInput(
                    workspace=self.knowledge.workspace, session_id=self.session_id, collected=collected, memory=bases
                ),
                task_queue=self._model_queue,
                result_type=CommitResult,
                start_to_close_timeout=CONTROL_TIMEOUT,
                retry_policy=INFRASTRUCTURE_RETRY,
                summary="commit outputs and memory",
            )
        except ActivityError as err:
            self.dirty = True
            workflow.logger.warning("could not keep the outputs and memory of %s: %s", self.session_id, err)
            return
        for output in collected.outputs:
            if output.sha256 is not None:
                self.outputs_seen[output.path] = output.sha256
        self.outputs.update(result.outputs)
        by_store = {store.memory_store_id: store for store in collected.memory}
        for export in self.exports:
            for change in by_store[export.memory_store_id].changed if export.memory_store_id in by_store else []:
                if change.sha256 is None:
                    export.manifest.pop(change.path, None)
                else:
                    export.manifest[change.path] = change.sha256
