"""`WebhookDeliveryWorkflow`: one webhook event owed to one endpoint, until it lands or is given up.

`corral.webhooks.Webhooks.emit` starts one per (event, endpoint), its id made of both, so an event is owed once per
endpoint whoever emits it again. Its one activity, `deliver_webhook` on the proxy's queue (the proxy alone holds
the signing secret), is one attempt; Temporal's retry policy, made from the delivery's `DeliveryPolicy`, is the
back-off: exponential from `first_retry`, at most `longest_wait` apart, for `give_up_after` in all (26 hours by
default). Every attempt sends the event's id as `webhook-id`, so a receiver that got an attempt whose answer was
lost de-duplicates the next. A worker killed mid-attempt stops heartbeating, and the attempt is tried again within
`HEARTBEAT_TIMEOUT`. When the policy's time is up, `give_up_webhook` records the delivery failed and disables the
endpoint. No I/O here.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from corral.contract.webhooks import GiveUpWebhookInput, WebhookDeliveryInput, WebhookDeliveryResult
    from corral.names import (
        ACTIVITY_DELIVER_WEBHOOK,
        ACTIVITY_GIVE_UP_WEBHOOK,
        WEBHOOK_DELIVERY_WORKFLOW,
    )

ATTEMPT_TIMEOUT = timedelta(minutes=1)
"""One attempt: a lookup, a Vault read and a POST the sender gives 30 s (proxy/webhooks.py)."""
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""An attempt heartbeats while it waits for the receiver: a proxy worker lost mid-attempt is noticed this soon."""
GIVE_UP_TIMEOUT = timedelta(minutes=1)


# No versioning behaviour of its own: a versioned harness worker gives its default (two activities, nothing pinned).
@workflow.defn(name=WEBHOOK_DELIVERY_WORKFLOW)
class WebhookDeliveryWorkflow:
    @workflow.run
    async def run(self, input: WebhookDeliveryInput) -> WebhookDeliveryResult:
        policy = input.policy
        try:
            return await workflow.execute_activity(
                ACTIVITY_DELIVER_WEBHOOK,
                input,
                task_queue=input.proxy_task_queue,
                result_type=WebhookDeliveryResult,
                schedule_to_close_timeout=policy.give_up_after,
                start_to_close_timeout=min(ATTEMPT_TIMEOUT, policy.give_up_after),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=RetryPolicy(
                    initial_interval=policy.first_retry,
                    backoff_coefficient=policy.backoff,
                    maximum_interval=policy.longest_wait,
                    maximum_attempts=0,  # until give_up_after
                ),
                summary=f"deliver {input.event.type} {input.event.id} to {input.endpoint_id}",
            )
        except ActivityError:
            # Only the policy's time running out ends the retries (every failure is retryable): give up.
            pass
        return await workflow.execute_activity(
            ACTIVITY_GIVE_UP_WEBHOOK,
            GiveUpWebhookInput(event=input.event, endpoint_id=input.endpoint_id, give_up_after=policy.give_up_after),
            task_queue=input.proxy_task_queue,
            result_type=WebhookDeliveryResult,
            start_to_close_timeout=GIVE_UP_TIMEOUT,
            retry_policy=RetryPolicy(maximum_interval=timedelta(minutes=5)),  # until the database answers
            summary=f"give up {input.event.id} to {input.endpoint_id}",
        )
