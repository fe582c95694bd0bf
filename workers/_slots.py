"""One limit on the activities several workers of one process run at once (the model role's shared queue and its
own queue draw on one pool): a burst on both must not run twice as many turns in one event loop. And admission by
the process's own pace: a process that is behind takes no new task until it has caught up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)

BUSY_CHECK_SECONDS = 0.05
"""How often a reservation held back by `max_busy` looks again (only while the process is behind)."""
BUSY_GIVE_UP_SECONDS = 10.0
"""A task held longer than this (the server's workflow task timeout) holds no admission back: the server has timed it
out already, so waiting for it saves nothing, and a task that never returned would stop the process for good."""


class _Permit(SlotPermit):
    """A slot, and when a task started using it (None until the SDK marks it used)."""

    def __init__(self) -> None:
        super().__init__()
        self.used_since: float | None = None


class SharedSlots(CustomSlotSupplier):
    """A fixed number of slots, shared by every worker given this supplier (through `WorkerTuner`); with `max_lag`,
    a slot is reserved only while the event loop runs a callback within `max_lag` seconds of its being scheduled.

    The pace check is what keeps a full process working: every turn it runs streams deltas through this one loop,
    and a loop that takes on more than it can go round in time sends its turns' heartbeats late, until the server
    times them out and retries them elsewhere (more work, when work is the problem). A slot is reserved before the
    SDK polls for a task, so a turn not admitted stays in the server's queue, in order, where `corral status` shows
    it waiting, and is taken when the loop has caught up (or by another worker).

    With `max_busy`, a slot is reserved only while no task taken has been in this process longer than `max_busy`
    seconds: the harness's guard. A workflow task the server times out (START_TO_CLOSE) is replayed, and one that
    carried an update can then be answered twice, which the server refuses on every later attempt (the SDK core's
    double update acceptance, sdk-rust#888): the session stops. A task not taken waits in the server's queue instead,
    where a sticky one goes on to the shared queue after `STICKY_TIMEOUT`: a replay, not a stopped session.

    The SDK may call `release_slot` and `try_reserve_slot` from its own threads, so the count is guarded by a lock,
    and a waiting `reserve_slot` is handed a slot in its own event loop (where its cancellation happens too)."""

    def __init__(self, slots: int, max_lag: float | None = None, max_busy: float | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if max_lag is not None and max_lag <= 0:
            raise ValueError(f"max_lag must be positive, got {max_lag}")
        if max_busy is not None and max_busy <= 0:
            raise ValueError(f"max_busy must be positive, got {max_busy}")
        self._free = slots
        self._max_lag = max_lag
        self._max_busy = max_busy
        self._used: set[_Permit] = set()
        self.lag = 0.0
        """The loop's lag when a reservation last measured it (seconds)."""
        self.deferred = 0
        """Reservations that waited for the loop to catch up."""
        self._pacing = asyncio.Lock()  # one look at the loop at a time: admissions after a stall come one round apart
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def _caught_up(self) -> None:
        """Return once the loop runs a callback scheduled now within `max_lag`: the time one round of the loop's
        ready work takes, which is what a turn's next delta or heartbeat waits at least. Behind, wait that long
        again before the next look (the round just measured is the loop's own estimate of its backlog)."""
        if self._max_lag is None and self._max_busy is None:
            return
        loop = asyncio.get_running_loop()
        async with self._pacing:
            while self._busy_too_long():
                self.deferred += 1
                await asyncio.sleep(BUSY_CHECK_SECONDS)
            while self._max_lag is not None:
                scheduled = loop.time()
                await asyncio.sleep(0)
                self.lag = loop.time() - scheduled
                if self.lag <= self._max_lag:
                    return
                self.deferred += 1
                await asyncio.sleep(self.lag)

    def _busy_too_long(self) -> bool:
        """A task taken has been in this process longer than `max_busy` (and not past `BUSY_GIVE_UP_SECONDS`)."""
        if self._max_busy is None:
            return False
        now = time.monotonic()
        with self._lock:
            ages = [now - p.used_since for p in self._used if p.used_since is not None]
        return any(self._max_busy < age <= BUSY_GIVE_UP_SECONDS for age in ages)

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        await self._caught_up()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return _Permit()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot just as it was cancelled: give it back
                self.release_slot_now()
            raise
        return _Permit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        if (self._max_lag is not None and self.lag > self._max_lag) or self._busy_too_long():
            return None
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return _Permit()
        return None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        if self._max_busy is not None and isinstance(ctx.permit, _Permit):
            ctx.permit.used_since = time.monotonic()
            with self._lock:
                self._used.add(ctx.permit)

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        if isinstance(ctx.permit, _Permit):
            with self._lock:
                self._used.discard(ctx.permit)
        self.release_slot_now()

    def release_slot_now(self) -> None:
        with self._lock:
            self._free += 1
            loops = {loop for loop, _ in self._waiters}
        for loop in loops:
            loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        """In a waiter's loop: give free slots to the waiters still waiting, oldest first."""
        with self._lock:
            kept: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                if waiter.done():
                    continue  # cancelled meanwhile
                if self._free > 0 and loop is asyncio.get_running_loop():
                    self._free -= 1
                    waiter.set_result(None)
                else:
                    kept.append((loop, waiter))
            self._waiters = kept

    @property
    def free(self) -> int:
        with self._lock:
            return self._free
