"""A harness change that forgot `workflow.patched`: `SessionWorkflow` whose run starts with a timer no recorded
history has, so no earlier history replays with it. `corral harness check`'s tests catch it; the upgrade tests
deploy it as a next build. The compose upgrade test mounts this file into a container of the corral image (which
holds the project, not its tests) and runs `main()` there as one build of the versioned harness, with the module
importable by name (`PYTHONPATH`): the workflow sandbox re-imports a workflow's module, which it cannot do for
`__main__`."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from corral.contract.session import SessionInput
from corral.names import SESSION_WORKFLOW
from workers.roles import harness_worker
from workers.run import connect_to_temporal, run_until_stopped, run_worker
from workers.settings import HarnessSettings
from workflows import SessionWorkflow
from workflows.records import RecordWorkflow


@workflow.defn(name=SESSION_WORKFLOW)
class TimerFirstSessionWorkflow(SessionWorkflow):
    """An incompatible change: a timer first."""

    @workflow.run
    async def run(self, input: SessionInput) -> None:
        await workflow.sleep(timedelta(milliseconds=1))
        await super().run(input)


async def _serve(settings: HarnessSettings) -> None:
    client = await connect_to_temporal(settings.temporal)
    workflows = (TimerFirstSessionWorkflow, RecordWorkflow)
    await run_until_stopped([harness_worker(client, deployment=settings.deployment, workflows=workflows)])


def main() -> None:
    run_worker("corral-harness-next", HarnessSettings.from_environment, _serve)
