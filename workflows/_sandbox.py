"""The session's sandbox as the workflow sees it: data (a handle), provisioned lazily, re-made after it dies,
stopped when the session idles, released when it ends. Workflow code: every effect is an activity.

A sandbox is provisioned on its engine pool's queue (`corral-sandbox`, or `corral-sandbox.<engine>` when the
environment names an engine pool), always that pool's, also when the engine that held it is gone; every later
call goes to the queue of the engine that holds the container (the handle's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

from workflows.policies import (
    CONTROL_TIMEOUT,
    ENGINE_SCHEDULE_TO_START,
    INFRASTRUCTURE_RETRY,
    PROVISION_TIMEOUT,
    SANDBOX_HEARTBEAT_TIMEOUT,
)

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput
    from corral.contract.carry import SandboxCarry
    from corral.contract.errors import SANDBOX_GONE
    from corral.contract.events import AgentToolUse
    from corral.contract.sandbox import Environment, ProvisionInput, RepositoryClone, SandboxHandle, SandboxRef
    from corral.contract.session import SessionInput
    from corral.names import (
        ACTIVITY_EXECUTE,
        ACTIVITY_PROVISION_SANDBOX,
        ACTIVITY_RELEASE_SANDBOX,
        ACTIVITY_STOP_SANDBOX,
        SANDBOX_TASK_QUEUE,
        sandbox_provision_queue,
    )
    from workflows._knowledge import KnowledgeSync
    from workflows._outcomes import failure_message, not_picked_up, tool_failure


EDITING_TOOLS = frozenset({"write", "edit"})
"""File tools that read, change and write a file: one at a time across threads, so that no edit is lost."""


class SessionSandbox:
    """One session's sandbox. Calls run one at a time per lane: the session's own calls in one lane, each thread's
    (multi-agent) in its own, with its own bash shell state, so threads' commands run side by side; the editing
    tools run one at a time across lanes."""

    def __init__(
        self,
        session_id: str,
        environment: Environment,
        repositories: Callable[[], list[RepositoryClone]] = list,
        knowledge: KnowledgeSync | None = None,
    ) -> None:
        self._session_id = session_id
        self._environment = environment
        self._repositories = repositories
        self.knowledge = knowledge or KnowledgeSync(session_id, None, "")
        """The files, skills and memory stores placed in each container (workflows/_knowledge.py)."""
        self.restock = False
        """Files were added since the running container was made: place them before the next call."""
        self._provision_queue = sandbox_provision_queue(environment.engine)
        """`corral-sandbox` for an environment that names no engine pool: the commands of such a session are
        exactly those of the code before engine pools, so its recorded history replays without a patch."""
        self.handle: SandboxHandle | None = None
        self.stopped = False
        self.generation = 0
        self.volume: str | None = None
        """The workspace volume (a warm pool member's is not named after the session): every container mounts it."""
        self._lock = asyncio.Lock()
        """Held to provision and to stop the container."""
        self._lanes: dict[str, asyncio.Lock] = {}
        self._editing = asyncio.Lock()
        self._in_flight = 0

    @classmethod
    def of(
        cls, session_id: str, input: SessionInput, repositories: Callable[[], list[RepositoryClone]]
    ) -> SessionSandbox:
        """A session's own sandbox: its recipe, its repositories, and its files, skills and memory stores."""
        knowledge = KnowledgeSync(session_id, input.knowledge, input.model_task_queue)
        return cls(session_id, input.sandbox_environment(), repositories, knowledge)

    def carried(self) -> SandboxCarry:
        return SandboxCarry(handle=self.handle, stopped=self.stopped, generation=self.generation, volume=self.volume,
                            knowledge=self.knowledge.carried())  # fmt: skip

    def resume(self, carry: SandboxCarry) -> None:
        self.handle, self.stopped, self.generation = carry.handle, carry.stopped, carry.generation
        self.volume = carry.volume or (carry.handle.volume if carry.handle else None)
        self.knowledge.resume(carry.knowledge)

    @property
    def running(self) -> bool:
        return self.handle is not None and not self.stopped

    @property
    def idle_stop_after(self) -> timedelta:
        return timedelta(seconds=self._environment.idle_stop_seconds)

    async def execute(self, use: AgentToolUse, lane: str | None = None) -> tuple[str, bool]:
        """Run a built-in tool in the container, provisioning it first if needed, in `lane` (a thread's id; None:
        the session's own); errors become error results."""
        async with self._lanes.setdefault(lane or "", asyncio.Lock()):
            if use.name not in EDITING_TOOLS:
                return await self._execute(use, lane)
            async with self._editing:
                return await self._execute(use, lane)

    async def _execute(self, use: AgentToolUse, lane: str | None) -> tuple[str, bool]:
        async with self._lock:
            try:
                handle = await self._ensure()
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    raise
                return f"The sandbox could not be started: {self._provision_failure(err)}", True
        self._in_flight += 1
        self.knowledge.dirty = True
        try:
            try:
                output: str = await workflow.execute_activity(
                    ACTIVITY_EXECUTE,
                    ExecuteInput(
                        session_id=self._session_id,
                        tool_use_id=use.id,
                        name=use.name,
                        input=use.input,
                        sandbox=handle,
                        shell=lane,
                    ),
                    task_queue=handle.task_queue,
                    result_type=str,
                    start_to_close_timeout=timedelta(seconds=handle.bash_max_timeout_seconds + 60),
                    schedule_to_start_timeout=ENGINE_SCHEDULE_TO_START,
                    heartbeat_timeout=SANDBOX_HEARTBEAT_TIMEOUT,
                    retry_policy=INFRASTRUCTURE_RETRY,
                    cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"tool {use.name}",
                )
            except ActivityError as err:
                cause = err.cause
                if isinstance(cause, CancelledError):
                    raise
                if isinstance(cause, ApplicationError) and cause.type == SANDBOX_GONE:
                    self._forget(handle)
                    return f"Tool error: {cause.message}", True
                if not_picked_up(err):
                    self._forget(handle)
                    return (
                        "Tool error: no sandbox worker is attached to the engine that held this session's container. "
                        "The next tool call starts a new container (files in /workspace may not be there).",
                        True,
                    )
                return tool_failure(use.name, handle.task_queue, err), True
            return output, False
        finally:
            self._in_flight -= 1

    async def _ensure(self) -> SandboxHandle:
        if self.handle is not None and not self.stopped and not self.restock:
            return self.handle
        self.restock = False
        queue = self.handle.task_queue if self.handle is not None else self._provision_queue
        summary = "restart sandbox" if self.handle is not None else f"provision sandbox (generation {self.generation})"
        try:
            handle = await self._provision(queue, summary)
        except ActivityError as err:
            if self.handle is None or not isinstance(err.cause, TimeoutError):
                raise
            self._forget()  # the engine that held the stopped container is gone: start over in the same pool
            handle = await self._provision(self._provision_queue, f"provision sandbox (generation {self.generation})")
        self.handle, self.stopped, self.volume = handle, False, handle.volume or self.volume
        return handle

    async def _provision(self, task_queue: str, summary: str) -> SandboxHandle:
        knowledge = self.knowledge.knowledge
        memory = await self.knowledge.for_new_container(fresh=self.handle is None or self.stopped)
        handle: SandboxHandle = await workflow.execute_activity(
            ACTIVITY_PROVISION_SANDBOX,
            ProvisionInput(
                session_id=self._session_id,
                environment=self._environment,
                generation=self.generation,
                namespace=workflow.info().namespace,
                repositories=self._repositories(),
                volume=self.volume,
                knowledge=knowledge,
                memory=memory,
            ),
            task_queue=task_queue,
            result_type=SandboxHandle,
            start_to_close_timeout=PROVISION_TIMEOUT,
            # Only the default pool may wait for a worker indefinitely; a named pool with none is a clear error.
            schedule_to_start_timeout=ENGINE_SCHEDULE_TO_START if task_queue != SANDBOX_TASK_QUEUE else None,
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=INFRASTRUCTURE_RETRY,
            summary=summary,
        )
        return handle

    def _provision_failure(self, err: ActivityError) -> str:
        """Why the sandbox could not be provisioned, as the tool result says it: a named engine pool that no worker
        serves is said so by name (the default pool waits for a worker instead)."""
        engine = self._environment.engine
        if engine is not None and not_picked_up(err):
            return (
                f"no sandbox worker serves the engine pool {engine!r} (task queue {self._provision_queue!r}); start "
                f"one with CORRAL_SANDBOX_ENGINE={engine}, or use an environment that names another engine pool"
            )
        return failure_message(err)

    def _forget(self, handle: SandboxHandle | None = None) -> None:
        """The container is gone: the next call makes a new one from the same recipe. A call that ran on an older
        container than the current one (another lane already made a new one) forgets nothing."""
        if handle is not None and handle is not self.handle:
            return
        self.handle, self.stopped = None, False
        self.generation += 1

    async def keep_knowledge(self) -> None:
        """Keep what the agent wrote to its outputs and memory stores, if the container runs (_knowledge.py)."""
        if self.running:
            await self.knowledge.collect(self.handle)

    @property
    def in_use(self) -> bool:
        """A call is running in the container (a thread's, while the session itself idles)."""
        return self._in_flight > 0

    async def stop(self) -> None:
        """Zero compute while idle: stop the container, keep the workspace."""
        if self.handle is None or self.stopped or self.in_use:
            return
        await self.knowledge.collect(self.handle)  # what the agent wrote, before the container's /mnt goes
        async with self._lock:
            try:
                await self._control(ACTIVITY_STOP_SANDBOX, SandboxRef(handle=self.handle), "stop idle sandbox")
            except ActivityError:
                self._forget()
                return
            self.stopped = True

    async def release(self) -> None:
        """The session ended: remove its containers and its workspace volume."""
        if self.handle is None and self.generation == 0:
            return
        handle = self.handle or SandboxHandle(
            session_id=self._session_id,
            container_id="",
            container_name="",
            volume="",
            image="",
            task_queue=self._provision_queue,
            generation=self.generation,
        )
        try:
            await self._control(ACTIVITY_RELEASE_SANDBOX, SandboxRef(handle=handle, remove_volume=True), "release")
        except ActivityError:
            workflow.logger.warning("could not release the sandbox of %s; the reaper will", self._session_id)

    async def _control(self, activity: str, ref: SandboxRef, summary: str) -> None:
        await workflow.execute_activity(
            activity,
            ref,
            task_queue=ref.handle.task_queue,
            start_to_close_timeout=CONTROL_TIMEOUT,
            schedule_to_start_timeout=ENGINE_SCHEDULE_TO_START,
            retry_policy=INFRASTRUCTURE_RETRY,
            summary=summary,
        )
