"""One limit on the activities several workers of one process run at once (the model role's shared queue and its
own queue share the SDK's default of 100): a burst on both must not run twice as many turns in one event loop."""

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
    """A fixed number of slots, shared by every worker given this supplier (through `WorkerTuner`).

    The SDK may call `release_slot` and `try_reserve_slot` from its own threads, so the count is guarded by a lock,
    and a waiting `reserve_slot` is handed a slot in its own event loop (where its cancellation happens too)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self._free = slots
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
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
