"""What `bench.overload` watches while a level runs, and how it judges the order turns were served in.

A user whose turn waits sees two things: `corral status` (each queue's backlog and its oldest task's age) and the
`waiting` facts of their own session (`GET /v1/sessions/{id}`, `corral status SESSION`). The watcher samples both
the way those do, through the same functions of `corral.queues` (not the CLI process: its start-up would be the
largest cost of a sample), so the report can say what a waiting user saw. Whether turns were served in order is
read afterwards from when each turn was sent and when its first token came (`served_in_order`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.client import Client
from temporalio.service import RPCError

from corral.queues import TaskKind, queue_load, session_waits

WATCHED = 4
"""Sessions per level whose waits are sampled (each sample is a describe per session: kept few, so that watching
adds little load)."""


@dataclass
class WaitSeen:
    """The longest a task of a watched session was seen waiting, with what its queue looked like then."""

    session: int
    role: str | None
    activity_type: str | None
    queue: str
    waited: float
    ahead: int
    backlog: int


@dataclass
class Watch:
    """Queue backlogs and watched sessions' waits, sampled while a level runs."""

    queues: dict[str, TaskKind]
    """The queues sampled each round; a routed queue seen in a session's wait is added."""
    backlog: Counter[str] = field(default_factory=Counter)
    """The largest backlog seen per queue."""
    oldest: dict[str, float] = field(default_factory=dict)
    """The oldest task's age, seconds, the largest seen per queue."""
    waits: dict[tuple[int, float], WaitSeen] = field(default_factory=dict)
    """By (session, when the task was scheduled): one task's longest sampled wait."""
    samples: int = 0
    failed_samples: Counter[str] = field(default_factory=Counter)
    """Samples the server did not answer, by error: under load an answer may be late, and is counted, not hidden."""

    def note_queue(self, queue: str, backlog: int, oldest: float) -> None:
        self.backlog[queue] = max(self.backlog[queue], backlog)
        self.oldest[queue] = max(self.oldest.get(queue, 0.0), oldest)

    def longest(self, count: int) -> list[WaitSeen]:
        """The longest wait of each watched session, longest first, at most `count`."""
        best: dict[int, WaitSeen] = {}
        for seen in self.waits.values():
            if seen.session not in best or seen.waited > best[seen.session].waited:
                best[seen.session] = seen
        return sorted(best.values(), key=lambda seen: -seen.waited)[:count]


async def sample_until(
    client: Client, seen: Watch, watched: Callable[[], Sequence[tuple[int, str]]], stop: asyncio.Event, every: float
) -> None:
    """Sample until `stop`: every queue's load, and the waits of the sessions `watched()` returns (index, id)."""
    while not stop.is_set():
        began = time.monotonic()
        try:
            await _sample(client, seen, watched())
        except RPCError as exc:
            seen.failed_samples[f"{type(exc).__name__}: {exc.status.name if exc.status else exc}"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, every - (time.monotonic() - began)))


async def _sample(client: Client, watch: Watch, sessions: Sequence[tuple[int, str]]) -> None:
    loads = await asyncio.gather(*(queue_load(client, queue, kind) for queue, kind in list(watch.queues.items())))
    for load in loads:
        watch.note_queue(load.queue, load.backlog, load.oldest.total_seconds())
    for index, session_id in sessions:
        description = await client.get_workflow_handle(session_id).describe()
        now = datetime.now(UTC)
        for wait in await session_waits(client, description, now):
            watch.queues.setdefault(wait.queue, wait.kind)
            watch.note_queue(wait.queue, wait.backlog(), wait.oldest(now).total_seconds())
            key = (index, wait.since.timestamp())
            seen = WaitSeen(index, wait.role, wait.activity_type, wait.queue, wait.waited(now).total_seconds(),
                            wait.ahead(now), wait.backlog())  # fmt: skip
            if key not in watch.waits or seen.waited >= watch.waits[key].waited:
                watch.waits[key] = seen
    watch.samples += 1


# ---- order ---------------------------------------------------------------------------------------------------


@dataclass
class Order:
    """How far the order first tokens came in follows the order turns were sent in."""

    slack: float
    """Turns sent closer together than this are not compared (seconds)."""
    pairs: int
    """Pairs of turns waiting at once: the later one sent more than `slack` after the earlier, and before the
    earlier one's first token came."""
    overtaken: int
    """Of those pairs, how many had the later turn's first token first."""
    rank_correlation: float
    """Spearman's: the rank of each turn's sending time against the rank of its first token's (1: the same order)."""

    @property
    def out_of_order(self) -> float:
        return self.overtaken / self.pairs if self.pairs else 0.0


def served_in_order(turns: Sequence[tuple[float, float]], slack: float) -> Order:
    """Each turn as (sent, first token), on one clock. Only turns that waited at the same time are compared: one
    sent after another's first token came could not have been served before it, and counting such pairs would make
    any queue look orderly."""
    ordered = sorted(turns)
    pairs = overtaken = 0
    for i, (sent, first) in enumerate(ordered):
        for later_sent, later_first in ordered[i + 1 :]:
            if later_sent >= first:
                break  # sorted by sending time: every later turn was sent after this one was served
            if later_sent - sent <= slack:
                continue
            pairs += 1
            overtaken += later_first < first
    return Order(slack, pairs, overtaken, _spearman([sent for sent, _ in turns], [first for _, first in turns]))


def _ranks(values: Sequence[float]) -> list[float]:
    """Each value's rank from 1, ties given the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")
