"""`DeploymentFireWorkflow`: one fire of a deployment, started by its Temporal Schedule (or by a manual run).

All it does is run `open_deployment_run` on the gateway's queue, which makes the run's session and records the run
(corral.contract.deployments). The workflow is what makes a fire durable: the Schedule starts it once per scheduled
time (its id is `fire-<deployment>` plus that time), and the activity is retried until the gateway answers, so a
gateway or worker that dies mid-fire costs a retry, never the run. No I/O here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from corral.contract.deployments import (
        SCHEDULED_START_TIME,
        TRIGGER_SCHEDULE,
        DeploymentRunResult,
        FireDeploymentInput,
        OpenDeploymentRunInput,
        scheduled_run_id,
    )
    from corral.names import ACTIVITY_OPEN_DEPLOYMENT_RUN, DEPLOYMENT_FIRE_WORKFLOW

OPEN_TIMEOUT = timedelta(minutes=1)
"""One session created (reads of a few records, a workflow start, one update): seconds, even under load. Also how
long a fire waits before it retries on another gateway when the one running it died."""
OPEN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1))
"""Until the gateway answers (no attempt limit: the activity records `unknown_error` itself past its own limit)."""
SCHEDULED_AT = SearchAttributeKey.for_datetime(SCHEDULED_START_TIME)


# No versioning behaviour of its own: a versioned harness worker gives its default (one activity, nothing pinned).
@workflow.defn(name=DEPLOYMENT_FIRE_WORKFLOW)
class DeploymentFireWorkflow:
    @workflow.run
    async def run(self, input: FireDeploymentInput) -> DeploymentRunResult:
        scheduled_at: datetime | None = None
        if input.trigger == TRIGGER_SCHEDULE:
            # The time the Schedule's spec matched (before jitter): the run's key, the same on every retry.
            scheduled_at = workflow.info().typed_search_attributes.get(SCHEDULED_AT) or workflow.now()
        run_id = input.run_id or scheduled_run_id(input.deployment_id, scheduled_at or workflow.now())
        opening = OpenDeploymentRunInput(deployment_id=input.deployment_id, workspace=input.workspace,
                                         run_id=run_id, trigger=input.trigger, scheduled_at=scheduled_at)  # fmt: skip
        return await workflow.execute_activity(
            ACTIVITY_OPEN_DEPLOYMENT_RUN,
            opening,
            task_queue=input.gateway_task_queue,
            result_type=DeploymentRunResult,
            start_to_close_timeout=OPEN_TIMEOUT,
            retry_policy=OPEN_RETRY,
            summary=f"open run {run_id} of {input.deployment_id}",
        )
