"""One limit on the activities several workers of one process run at once (the model role's shared queue and its
own queue draw on one pool): a burst on both must not run twice as many turns in one event loop. And admission by
the loop's own pace: a loop that is behind takes no new turn until it has caught up."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)


class SharedSlots(CustomSlotSupplier):
    """A fixed number of slots, shared by every worker given this supplier (through `WorkerTuner`); with `max_lag`,
    a slot is reserved only while the event loop runs a callback within `max_lag` seconds of its being scheduled.

    The pace check is what keeps a full process working: every turn it runs streams deltas through this one loop,
    and a loop that takes on more than it can go round in time sends its turns' heartbeats late, until the server
    times them out and retries them elsewhere (more work, when work is the problem). A slot is reserved before the
    SDK polls for a task, so a turn not admitted stays in the server's queue, in order, where `corral status` shows
    it waiting, and is taken when the loop has caught up (or by another worker).

    The SDK may call `release_slot` and `try_reserve_slot` from its own threads, so the count is guarded by a lock,
    and a waiting `reserve_slot` is handed a slot in its own event loop (where its cancellation happens too)."""

    def __init__(self, slots: int, max_lag: float | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if max_lag is not None and max_lag <= 0:
            raise ValueError(f"max_lag must be positive, got {max_lag}")
        self._free = slots
        self._max_lag = max_lag
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
        if self._max_lag is None:
            return
        loop = asyncio.get_running_loop()
        async with self._pacing:
            while True:
                scheduled = loop.time()
                await asyncio.sleep(0)
                self.lag = loop.time() - scheduled
                if self.lag <= self._max_lag:
                    return
                self.deferred += 1
                await asyncio.sleep(self.lag)

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        await self._caught_up()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return SlotPermit()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot just as it was cancelled: give it back
                self.release_slot_now()
            raise
        return SlotPermit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        if self._max_lag is not None and self.lag > self._max_lag:
            return None
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return SlotPermit()
        return None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        pass

    def release_slot(self, ctx: SlotReleaseContext) -> None:
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
