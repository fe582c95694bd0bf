"""A deployment's Temporal Schedule: its id is the deployment's id, and each action starts `DeploymentFireWorkflow`
on the harness queue, with workflow id `fire-<deployment>` (Temporal appends the scheduled time).

Policies, chosen for a job that makes one session per fire:
- overlap ALLOW_ALL: a fire only opens a run (seconds), and each scheduled time has its own run; a fire still
  waiting for a gateway that is down must not make the next one skipped or buffered;
- catch-up window `CATCHUP_WINDOW`: fires missed while the Temporal server itself was down are made up when it is
  back within that window, and skipped beyond it (a nightly job does not run four times at once after an outage);
- no jitter: `upcoming_runs_at` are the times the cron matches, and `scheduled_at` is exactly one of them.

Paused (by hand, or by a failed scheduled fire) or archived deployment: the Schedule is paused, or deleted on
archive (its `last_run_at` is kept in the record first). The Web UI's Schedules page shows the note and the
action's summary: "deployment <name> (<id>): agent <agent id> v<version>".
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.deployments import FireDeploymentInput, fire_workflow_id
from corral.contract.search_attributes import WORKSPACE_KEY
from corral.names import DEPLOYMENT_FIRE_WORKFLOW
from gateway.deployment_shapes import temporal_cron

CATCHUP_WINDOW = timedelta(minutes=10)
MAX_UPCOMING = 5


def summary(deployment_id: str, body: dict[str, Any]) -> str:
    agent = body["agent"]
    return f"deployment {body['name']} ({deployment_id}): agent {agent['id']} v{agent['version']}"


def build_schedule(deployment_id: str, workspace: str, body: dict[str, Any], harness_queue: str,
                   gateway_queue: str, paused: bool) -> Schedule:  # fmt: skip
    cron = body["schedule"]
    fire = FireDeploymentInput(deployment_id=deployment_id, workspace=workspace, gateway_task_queue=gateway_queue)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            DEPLOYMENT_FIRE_WORKFLOW,
            fire,
            id=fire_workflow_id(deployment_id),
            task_queue=harness_queue,
            typed_search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, workspace)]),
            static_summary=summary(deployment_id, body),
        ),
        spec=ScheduleSpec(cron_expressions=[temporal_cron(cron["expression"])], time_zone_name=cron["timezone"]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.ALLOW_ALL, catchup_window=CATCHUP_WINDOW),
        state=ScheduleState(paused=paused, note=_note(body, paused)),
    )


def _note(body: dict[str, Any], paused: bool) -> str:
    cron = body["schedule"]
    reason = body.get("paused_reason") or {}
    why = "" if not paused else f" (paused: {reason.get('type', 'manual')})"
    return f"{body['name']}: {cron['expression']} {cron['timezone']}{why}"


class DeploymentSchedules:
    """Keeps each deployment's Schedule in step with its record."""

    def __init__(self, client: Client, harness_queue: str, gateway_queue: str) -> None:
        self.client = client
        self.harness_queue = harness_queue
        self.gateway_queue = gateway_queue

    async def sync(self, deployment_id: str, workspace: str, body: dict[str, Any]) -> None:
        """Make the Schedule what the body says: made, replaced, paused or removed (no schedule)."""
        if body.get("schedule") is None:
            await self.remove(deployment_id)
            return
        schedule = build_schedule(deployment_id, workspace, body, self.harness_queue, self.gateway_queue,
                                  paused=body.get("status") == "paused")  # fmt: skip
        try:
            await self.client.create_schedule(
                deployment_id, schedule, memo={"deployment_id": deployment_id, "workspace": workspace},
                search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, workspace)]),
            )  # fmt: skip
        except ScheduleAlreadyRunningError:

            def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
                return ScheduleUpdate(schedule=schedule)

            await self.client.get_schedule_handle(deployment_id).update(replace)

    async def remove(self, deployment_id: str) -> None:
        try:
            await self.client.get_schedule_handle(deployment_id).delete()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    async def times(self, deployment_id: str) -> tuple[datetime | None, list[datetime]]:
        """The last scheduled fire's start and the next ones (at most 5), as the Schedule knows them."""
        try:
            description = await self.client.get_schedule_handle(deployment_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None, []
            raise
        recent = description.info.recent_actions
        last = max((action.started_at for action in recent), default=None)
        return last, list(description.info.next_action_times[:MAX_UPCOMING])
