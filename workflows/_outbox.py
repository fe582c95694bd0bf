"""Signals a session and its threads send each other, delivered in order per target.

Temporal delivers each signal a workflow sends exactly once, but two signals in flight to one target at once may
arrive in either order; a thread's cross-posted call must reach its session before the idle that lists it. So each
target gets one delivery loop, which sends its next signal when the previous one is acknowledged. A hand-over
waits for every loop to finish (`empty`): what is queued here is not carried.

Workflow code: no I/O, only signal commands.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import FailureError


class Outbox:
    """Per-target queues of (signal name, payload), each drained by its own loop."""

    def __init__(self) -> None:
        self._queues: dict[str, list[tuple[str, Any]]] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}

    def send(self, target: str, signal: str, payload: Any) -> None:
        self._queues.setdefault(target, []).append((signal, payload))
        if target not in self._loops:
            self._loops[target] = asyncio.create_task(self._deliver(target))

    def empty(self) -> bool:
        return not self._loops

    async def drained(self) -> None:
        await workflow.wait_condition(self.empty)

    async def _deliver(self, target: str) -> None:
        queue = self._queues[target]
        try:
            while queue:
                signal, payload = queue[0]
                try:
                    await workflow.get_external_workflow_handle(target).signal(signal, payload)
                except FailureError as err:  # the target has ended (an archived thread): nothing is waiting for it
                    workflow.logger.warning("signal %s to %s not delivered: %s", signal, target, err)
                queue.pop(0)
        finally:
            del self._loops[target]
            if not queue:
                del self._queues[target]
