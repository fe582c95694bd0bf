"""`EnvironmentWorkQueue`: the durable work queue of one self-hosted environment (corral.contract.work).

Its items, their states and their leases are this workflow's state, so a gateway or a harness that dies loses
nothing: the next one reads the same queue. Every change is an update whose validator refuses what must not happen
(a stale heartbeat, an ack of an item that is not waiting for one, a second stop), so a refusal leaves no trace.

Time: a lease is judged by `workflow.now()`, the time of the task that judges it. The run's loop sleeps until the
next deadline (a lease's end, an acknowledged item's claim window) and then puts lapsed items back in the queue and
tells their sessions; a heartbeat that comes later than its lease's end finds the item taken back, and a 412.
No I/O here: the sessions are told by signals to their workflows.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.work import (
        CLAIM_WINDOW_SECONDS,
        ENDED_ITEMS_KEPT,
        HEARTBEAT_PRECONDITION_FAILED,
        LIVE_STATES,
        MAX_UPDATES_PER_RUN,
        NO_HEARTBEAT,
        QUERY_WORK_ITEMS,
        QUERY_WORK_QUEUE,
        SIGNAL_POLLED,
        SIGNAL_RELEASE_WORK,
        SIGNAL_REQUEST_WORK,
        SIGNAL_WORK_ENDED,
        UPDATE_ACK_WORK,
        UPDATE_CLAIM_WORK,
        UPDATE_HEARTBEAT_WORK,
        UPDATE_STOP_WORK,
        UPDATE_WORK_METADATA,
        WORK_ALREADY_STOPPED,
        WORK_NOT_FOUND,
        WORK_NOT_QUEUED,
        WORK_QUEUE_WORKFLOW,
        ClaimWork,
        HeartbeatWork,
        StopWork,
        WorkEnded,
        WorkEndReason,
        WorkHeartbeat,
        WorkId,
        WorkItem,
        WorkMetadataChange,
        WorkPolled,
        WorkQueueCarry,
        WorkQueueInput,
        WorkQueueState,
        WorkRequest,
    )
    from corral.names import WORK_ID_PREFIX


@workflow.defn(name=WORK_QUEUE_WORKFLOW)
class EnvironmentWorkQueue:
    """One environment's work items; it runs as long as the environment has sessions to serve."""

    @workflow.init
    def __init__(self, input: WorkQueueInput) -> None:
        self._input = input
        carry = input.carry or WorkQueueCarry(items=[])
        self._items: dict[str, WorkItem] = {item.id: item for item in carry.items}
        self._pollers = dict(carry.pollers)
        self._next_number = carry.next_number
        self._updates = 0
        self._changed = False
        self._ending: list[tuple[WorkItem, WorkEndReason]] = []
        """Items that ended since the loop last told their sessions."""

    @workflow.run
    async def run(self, input: WorkQueueInput) -> None:
        while not self._run_is_long():
            await self._tell_sessions()
            deadline = self._next_deadline()
            self._changed = False
            condition = lambda: self._changed or bool(self._ending) or self._run_is_long()  # noqa: E731
            if deadline is None:
                await workflow.wait_condition(condition)
            else:
                wait = max(deadline - workflow.now(), timedelta(milliseconds=1))
                try:
                    await workflow.wait_condition(condition, timeout=wait)
                except TimeoutError:
                    pass
            self._lapse_leases()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._tell_sessions()
        ended = [item for item in self._items.values() if item.state not in LIVE_STATES]
        kept = {item.id for item in sorted(ended, key=lambda item: item.created_at)[-ENDED_ITEMS_KEPT:]}
        items = [item for item in self._items.values() if item.state in LIVE_STATES or item.id in kept]
        carry = WorkQueueCarry(items=items, pollers=self._pollers, next_number=self._next_number)
        workflow.continue_as_new(WorkQueueInput(environment_id=input.environment_id, workspace=input.workspace,
                                                carry=carry))  # fmt: skip

    def _run_is_long(self) -> bool:
        return self._updates >= MAX_UPDATES_PER_RUN or workflow.info().is_continue_as_new_suggested()

    # ---- time ---------------------------------------------------------------------------------------------------

    def _deadline_of(self, item: WorkItem) -> datetime | None:
        if item.state in ("active", "stopping") and item.lease_expires_at is not None:
            return item.lease_expires_at
        if item.state == "starting" and item.acknowledged_at is not None:
            return item.acknowledged_at + timedelta(seconds=CLAIM_WINDOW_SECONDS)
        return None

    def _next_deadline(self) -> datetime | None:
        deadlines = [d for d in (self._deadline_of(item) for item in self._items.values()) if d is not None]
        return min(deadlines, default=None)

    def _lapse_leases(self) -> None:
        """End what has run out of time. An item acknowledged and never claimed goes back to the queue: its worker
        ran nothing. An item whose lease lapsed stops, and its session is told, so that the session answers the calls
        that worker may have run before any other worker can see them; the session's next call asks for a new item,
        which another worker takes. (Putting the lapsed item itself back would let a new worker read those calls
        unanswered and run them a second time.)"""
        now = workflow.now()
        for item in self._items.values():
            deadline = self._deadline_of(item)
            if deadline is None or deadline > now:
                continue
            if item.state == "starting":
                item.state, item.acknowledged_at, item.delivered_at, item.delivered_to = "queued", None, None, None
            else:
                self._stop(item, "lease_lost" if item.state == "active" else item.end_reason or "stopped")

    async def _tell_sessions(self) -> None:
        """Tell each session whose item ended: the calls it waits on will never be answered by that worker."""
        ending, self._ending = self._ending, []
        for item, reason in ending:
            session = workflow.get_external_workflow_handle(item.session_id)
            try:
                await session.signal(SIGNAL_WORK_ENDED, WorkEnded(work_id=item.id, reason=reason))
            except Exception as exc:  # a session that has ended waits for nothing
                workflow.logger.info("session %s not told that %s ended: %s", item.session_id, item.id, exc)

    def _stop(self, item: WorkItem, reason: WorkEndReason) -> None:
        item.state, item.stopped_at, item.end_reason = "stopped", workflow.now(), reason
        item.last_heartbeat, item.lease_expires_at = "", None
        self._ending.append((item, reason))

    # ---- what sessions and the gateway send ---------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_REQUEST_WORK)
    def request_work(self, request: WorkRequest) -> None:
        """A new item for the session, unless it has one that has not stopped."""
        if self._live_item_of(request.session_id) is not None:
            return
        number, self._next_number = self._next_number, self._next_number + 1
        work_id = f"{WORK_ID_PREFIX}{workflow.uuid4().hex[:24]}{number:04d}"
        self._items[work_id] = WorkItem(
            id=work_id,
            environment_id=self._input.environment_id,
            workspace=self._input.workspace,
            session_id=request.session_id,
            created_at=workflow.now(),
        )
        self._touch()

    @workflow.signal(name=SIGNAL_RELEASE_WORK)
    def release_work(self, request: WorkRequest) -> None:
        """The session ended: its item stops (its worker learns it at the next heartbeat)."""
        item = self._live_item_of(request.session_id)
        if item is not None:
            if item.state == "queued":
                self._stop(item, "session_ended")
            else:
                item.state, item.stop_requested_at, item.end_reason = "stopping", workflow.now(), "session_ended"
            self._touch()

    @workflow.signal(name=SIGNAL_POLLED)
    def polled(self, poll: WorkPolled) -> None:
        self._pollers[poll.worker_id] = workflow.now()
        self._updates += 1

    @workflow.update(name=UPDATE_CLAIM_WORK)
    def claim(self, claim: ClaimWork) -> WorkItem | None:
        """Deliver the oldest claimable item to the polling worker, with a new session token."""
        item = self._claimable(claim.reclaim_older_than_ms, claim.work_id)
        self._pollers[claim.worker_id] = workflow.now()
        self._touch()
        if item is None:
            return None
        item.delivered_at, item.delivered_to = workflow.now(), claim.worker_id
        item.deliveries += 1
        item.token_sha256 = claim.token_sha256
        return item

    @workflow.update(name=UPDATE_ACK_WORK)
    def ack(self, input: WorkId) -> WorkItem:
        """The worker took the delivery: the item leaves the queue and waits for its first heartbeat."""
        item = self._items[input.work_id]
        item.state, item.acknowledged_at = "starting", workflow.now()
        self._touch()
        return item

    @ack.validator
    def _validate_ack(self, input: WorkId) -> None:
        item = self._item(input.work_id)
        if item.state != "queued" or item.delivered_at is None:
            raise ApplicationError(f"work item {item.id} is {item.state}, not delivered and waiting for an "
                                   "acknowledgment", type=WORK_NOT_QUEUED)  # fmt: skip

    @workflow.update(name=UPDATE_HEARTBEAT_WORK)
    def heartbeat(self, beat: HeartbeatWork) -> WorkHeartbeat:
        """Extend (or, with NO_HEARTBEAT, take) the lease; a stopping or stopped item asks its worker to end."""
        item = self._items[beat.work_id]
        self._touch()
        if item.state in ("stopping", "stopped"):
            return WorkHeartbeat(last_heartbeat=item.last_heartbeat, lease_extended=False, state=item.state,
                                 ttl_seconds=item.ttl_seconds)  # fmt: skip
        now = workflow.now()
        if item.state == "queued":  # claimed by a heartbeat without an ack: the heartbeat acknowledges it
            item.acknowledged_at = now
        if item.started_at is None:
            item.started_at = now
        item.state = "active"
        item.latest_heartbeat_at = now
        item.ttl_seconds = beat.ttl_seconds
        item.lease_expires_at = now + timedelta(seconds=beat.ttl_seconds)
        item.last_heartbeat = f"{workflow.uuid4().hex[:16]}"
        return WorkHeartbeat(last_heartbeat=item.last_heartbeat, lease_extended=True, state=item.state,
                             ttl_seconds=item.ttl_seconds)  # fmt: skip

    @heartbeat.validator
    def _validate_heartbeat(self, beat: HeartbeatWork) -> None:
        item = self._item(beat.work_id)
        if item.state in ("stopping", "stopped"):
            return  # not compared: the answer tells the worker to end
        expected = beat.expected_last_heartbeat
        # An active item's lease is live until its end; past it, the item is as good as lapsed (the loop stops it
        # at its next task), and no heartbeat, a claim included, may take it over with its calls unanswered.
        held = item.state == "active" and item.lease_expires_at is not None and item.lease_expires_at > workflow.now()
        if item.state in ("queued", "starting") and expected == NO_HEARTBEAT:
            return
        if held and expected == item.last_heartbeat:
            return
        current = WorkHeartbeat(last_heartbeat=item.last_heartbeat, lease_extended=False, state=item.state,
                                ttl_seconds=item.ttl_seconds)  # fmt: skip
        raise ApplicationError(
            f"work item {item.id}: the heartbeat expected {expected!r}, but the lease is "
            + (f"held with {item.last_heartbeat!r}" if held else "not held (it lapsed, or was never taken)")
            + (": another worker may hold the item" if held or item.state == "active" else ""),
            current.model_dump(mode="json"),
            type=HEARTBEAT_PRECONDITION_FAILED,
        )

    @workflow.update(name=UPDATE_STOP_WORK)
    def stop(self, stop: StopWork) -> WorkItem:
        """Stop the item (`force`), or ask its worker to (`stopping`); an item no worker took stops at once."""
        item = self._items[stop.work_id]
        if stop.force or item.state == "queued":
            self._stop(item, item.end_reason or "stopped")
        else:
            item.state, item.stop_requested_at = "stopping", workflow.now()
        self._touch()
        return item

    @stop.validator
    def _validate_stop(self, stop: StopWork) -> None:
        item = self._item(stop.work_id)
        if item.state == "stopped":
            raise ApplicationError(f"work item {item.id} is already stopped", type=WORK_ALREADY_STOPPED)

    @workflow.update(name=UPDATE_WORK_METADATA)
    def update_metadata(self, change: WorkMetadataChange) -> WorkItem:
        item = self._items[change.work_id]
        for key, value in change.metadata.items():
            if value is None:
                item.metadata.pop(key, None)
            else:
                item.metadata[key] = value
        self._touch()
        return item

    @update_metadata.validator
    def _validate_metadata(self, change: WorkMetadataChange) -> None:
        self._item(change.work_id)

    # ---- reads --------------------------------------------------------------------------------------------------

    @workflow.query(name=QUERY_WORK_ITEMS)
    def items(self) -> list[WorkItem]:
        return sorted(self._items.values(), key=lambda item: (item.created_at, item.id), reverse=True)

    @workflow.query(name=QUERY_WORK_QUEUE)
    def queue(self) -> WorkQueueState:
        queued = [item for item in self._items.values() if item.state == "queued"]
        return WorkQueueState(
            environment_id=self._input.environment_id,
            workspace=self._input.workspace,
            depth=len([item for item in queued if item.delivered_at is None]),
            pending=len([item for item in queued if item.delivered_at is not None]),
            oldest_queued_at=min((item.created_at for item in queued), default=None),
            pollers=dict(self._pollers),
        )

    # ---- helpers ------------------------------------------------------------------------------------------------

    def _item(self, work_id: str) -> WorkItem:
        item = self._items.get(work_id)
        if item is None:
            raise ApplicationError(f"no work item {work_id} in environment {self._input.environment_id}",
                                   type=WORK_NOT_FOUND)  # fmt: skip
        return item

    def _live_item_of(self, session_id: str) -> WorkItem | None:
        return next((i for i in self._items.values() if i.session_id == session_id and i.state in LIVE_STATES), None)

    def _claimable(self, reclaim_older_than_ms: int, work_id: str | None) -> WorkItem | None:
        now = workflow.now()
        redeliver_before = now - timedelta(milliseconds=reclaim_older_than_ms)
        waiting = [
            item
            for item in self._items.values()
            if item.state == "queued"
            and (item.delivered_at is None or item.delivered_at <= redeliver_before)
            and (work_id is None or item.id == work_id)
        ]
        return min(waiting, key=lambda item: (item.created_at, item.id), default=None)

    def _touch(self) -> None:
        self._changed = True
        self._updates += 1


@workflow.defn(name=WORK_QUEUE_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class VersionedEnvironmentWorkQueue(EnvironmentWorkQueue):
    """The queue as a versioned harness runs it (workers/deployment.py): it moves to each new build at its next
    update, as records do, because a long-lived queue pinned to a build would keep that build alive forever. So
    change `EnvironmentWorkQueue` with `workflow.patched` only."""

    @workflow.run
    async def run(self, input: WorkQueueInput) -> None:
        await super().run(input)
