"""What a session tells its workspace's webhook endpoints: the log events that matter to a user's systems, as
webhook events, handed to the model workers' `emit_webhooks` activity in order.

Only a session whose workspace has an endpoint emits (`SessionInput.webhooks`, turned on by `SIGNAL_WEBHOOKS` for a
session started before its workspace had one): a session that nobody listens to schedules nothing. Threads never
emit: their session's log carries `session.thread_*`, and the session emits those.

Each webhook event's id is made from its log event's id and its type (`keyed_event_id`), so a replay, or an
activity retried after a crash, makes the same events, and `emit` starts each delivery once. Events queued here
are sent by one loop, one activity per burst; a hand-over waits for the loop (`drained`), as for the outbox.

Workflow code: no I/O, only activity commands.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import SessionEvent
    from corral.contract.search_attributes import WORKSPACE_KEY
    from corral.contract.session import SessionInput
    from corral.contract.webhooks import EmitWebhooks, WebhookEvent, keyed_event_id
    from corral.names import ACTIVITY_EMIT_WEBHOOKS, SIGNAL_WEBHOOKS
    from workflows._log import SessionLog

EMIT_TIMEOUT = timedelta(seconds=30)
EMIT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
"""Retried until it lands: an event the session made is owed to the endpoints (a down database waits, not drops)."""


def webhook_types(event: SessionEvent) -> list[str]:
    """The webhook event types a log event makes (none for most)."""
    kind = event.type
    if kind == "session.status_running":
        return ["session.status_run_started", "session.running"]
    if kind == "session.status_idle":
        reason = getattr(event, "stop_reason", None)
        reason_type = getattr(reason, "type", None)
        state = "session.requires_action" if reason_type == "requires_action" else "session.idled"
        return ["session.status_idled", state] + (["session.budget_reached"] if reason_type == "budget_reached" else [])
    return {
        "session.status_rescheduled": ["session.status_rescheduled"],
        "session.status_terminated": ["session.status_terminated"],
        "span.outcome_evaluation_end": ["session.outcome_evaluation_ended"],
        "session.thread_created": ["session.thread_created"],
        "session.thread_status_idle": ["session.thread_idled"],
        "session.thread_status_terminated": ["session.thread_terminated"],
    }.get(kind, [])


class SessionWebhooks:
    """The session's side of webhooks: observes its log (`SessionLog.observer`) and emits what it must."""

    def __init__(self, input: SessionInput, log: SessionLog) -> None:
        self._input = input
        log.observer = self.observe
        workspace = workflow.info().typed_search_attributes.get(WORKSPACE_KEY)
        self._workspace = workspace if input.thread is None else None
        """None: the session emits nothing (a thread, or a session started from a Temporal client, outside any
        workspace)."""
        self._pending: list[WebhookEvent] = []
        self._loop: asyncio.Task[None] | None = None
        workflow.set_signal_handler(SIGNAL_WEBHOOKS, self._turn_on)

    def observe(self, event: SessionEvent) -> None:
        if not self._input.webhooks or self._workspace is None:
            return
        extra = {"session_thread_id": thread} if (thread := getattr(event, "session_thread_id", None)) else {}
        for kind in webhook_types(event):
            self._pending.append(
                WebhookEvent(
                    id=keyed_event_id(f"{event.id}/{kind}"),
                    type=kind,
                    subject_id=workflow.info().workflow_id,
                    workspace=self._workspace,
                    created_at=event.created_at,
                    extra=extra,
                )
            )
        if self._pending and self._loop is None:
            self._loop = asyncio.create_task(self._send())

    def empty(self) -> bool:
        return self._loop is None

    async def drained(self) -> None:
        await workflow.wait_condition(self.empty)

    def _turn_on(self, on: bool = True) -> None:
        self._input.webhooks = on  # on the input, so that a hand-over carries it to the next run

    async def _send(self) -> None:
        try:
            while self._pending:
                batch = list(self._pending)
                emit = EmitWebhooks(events=batch, task_queue=workflow.info().task_queue)
                await workflow.execute_activity(
                    ACTIVITY_EMIT_WEBHOOKS, emit, task_queue=self._input.model_task_queue,
                    start_to_close_timeout=EMIT_TIMEOUT, retry_policy=EMIT_RETRY,
                )  # fmt: skip
                del self._pending[: len(batch)]
        finally:
            self._loop = None
