"""The bench-only workflow of `bench/sandbox.py` (in its own module: the workflow sandbox imports it by name).

Each update answers with how long its activities took as the harness sees them: from the workflow task that
scheduled the first one to the workflow task that saw the last one's result (`workflow.now()`, the server's clock),
which is what a session's `agent.tool_use` to `agent.tool_result` spans."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput
    from corral.contract.sandbox import Environment, ProvisionInput, SandboxHandle
    from corral.names import ACTIVITY_EXECUTE, ACTIVITY_PROVISION_SANDBOX, SANDBOX_TASK_QUEUE


@workflow.defn(name="SandboxBenchWorkflow")
class SandboxBenchWorkflow:
    """A bench-only harness: each update is one or two sandbox activities."""

    def __init__(self) -> None:
        self.done = False
        self.handle: SandboxHandle | None = None

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update
    async def provision(self, session_id: str, environment: Environment) -> float:
        started = workflow.now()
        await self._provision(session_id, environment)
        return (workflow.now() - started).total_seconds()

    @workflow.update
    async def first_call(self, session_id: str, environment: Environment) -> list[float]:
        """Provision, then `bash true`: a session's first tool call; [its seconds, those of the provision]."""
        started = workflow.now()
        await self._provision(session_id, environment)
        provisioned = workflow.now()
        await self._bash("true")
        return [(workflow.now() - started).total_seconds(), (provisioned - started).total_seconds()]

    @workflow.update
    async def bash(self, command: str) -> float:
        started = workflow.now()
        await self._bash(command)
        return (workflow.now() - started).total_seconds()

    @workflow.query
    def sandbox(self) -> SandboxHandle | None:
        return self.handle

    async def _provision(self, session_id: str, environment: Environment) -> None:
        self.handle = await workflow.execute_activity(
            ACTIVITY_PROVISION_SANDBOX,
            ProvisionInput(session_id=session_id, environment=environment, generation=0),
            task_queue=SANDBOX_TASK_QUEUE,
            result_type=SandboxHandle,
            start_to_close_timeout=timedelta(minutes=5),
        )

    async def _bash(self, command: str) -> str:
        assert self.handle is not None
        output: str = await workflow.execute_activity(
            ACTIVITY_EXECUTE,
            ExecuteInput(
                session_id=self.handle.session_id,
                tool_use_id=str(workflow.uuid4()),
                name="bash",
                input={"command": command},
                sandbox=self.handle,
            ),
            task_queue=self.handle.task_queue,
            result_type=str,
            start_to_close_timeout=timedelta(minutes=1),
        )
        return output

    @workflow.signal
    def finish(self) -> None:
        self.done = True
