"""`bench.overload`'s figures per level, its markdown report and its JSON summary (what `bench.quote` renders)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench._capacity_arms import Step
from bench._load_accounting import ROUTED_FALLBACK, Checked
from bench._overload_watch import WATCHED, Order, Watch
from bench._report import markdown_table, percentile
from bench.capacity import Arm

SCHEDULE_TO_START, START_TO_CLOSE, HEARTBEAT = "(SCHEDULE_TO_START)", "(START_TO_CLOSE)", "(HEARTBEAT)"
RETRIED = "started again (attempt > 1)"
SHOWN_WAITS = 3
"""Watched sessions' longest waits shown per level."""


@dataclass
class Level:
    """One level: `factor` x capacity sessions turning at once, and everything read about it."""

    factor: float
    step: Step
    checked: Checked
    watch: Watch
    order: Order
    resent: Counter[str]
    """RPC errors the client met and sent again (`bench._load_clients.RpcErrors`), during this level."""

    @property
    def p99(self) -> float:
        return percentile(self.step.ttfts, 0.99)

    def timed_out(self, kind: str) -> int:
        return sum(
            count for finding, count in self.checked.findings.items() if "timed out" in finding and kind in finding
        )

    @property
    def routed_fallbacks(self) -> int:
        return self.checked.findings[ROUTED_FALLBACK]

    @property
    def retried(self) -> int:
        return sum(count for finding, count in self.checked.findings.items() if RETRIED in finding)

    @property
    def failed(self) -> int:
        return len(self.step.problems) + self.step.no_text

    def line(self, arm: Arm) -> str:
        alone = arm.baseline
        return (
            f"{self.step.sessions} sessions: {self.step.turns} turns, {self.step.throughput:.1f}/s, TTFT p50 "
            f"{self.step.p50 / alone.p50:.2f}x alone, p99 {self.p99 / _p99(alone):.2f}x; lost {self.step.lost}, dup "
            f"{self.step.duplicated}, failed {self.failed}, timed out {self.timed_out('')}; out of order "
            f"{100 * self.order.out_of_order:.1f}% of {self.order.pairs} pairs"
        )


def _p99(step: Step) -> float:
    return percentile(step.ttfts, 0.99)


def _queue_waits(checked: Checked) -> dict[str, dict[str, float]]:
    """Scheduled -> started per queue, from the histories: p50, p99, the longest."""
    return {
        queue: {"p50": percentile(waits, 0.5), "p99": percentile(waits, 0.99), "max": max(waits)}
        for queue, waits in sorted(checked.waits.items())
        if waits
    }


def _user_saw(level: Level) -> list[str]:
    seen = level.watch.longest(SHOWN_WAITS)
    if not seen:
        return ["no watched session was seen waiting for a worker"]
    return [
        f"session {wait.session} waited {wait.waited:.1f} s for a {wait.role or 'any'} worker "
        f"({wait.activity_type or 'the harness next step'}, queue `{wait.queue}`) with about {wait.ahead} task"
        f"{'' if wait.ahead == 1 else 's'} ahead of it, ~{wait.backlog} in that queue"
        for wait in seen
    ]


def report(arm: Arm, capacity: int, found: str, levels: list[Level], args: argparse.Namespace) -> str:
    cores = os.cpu_count() or 1
    alone = arm.baseline
    lines = [
        f"The model server's first token after {args.first_token_latency:g} s, then {args.tokens_per_second:g} "
        f"tokens/s; {cores} cores. Capacity: **{capacity} sessions** ({found}). Alone: TTFT p50 {alone.p50:.3f} s, "
        f"p99 {_p99(alone):.3f} s ({len(alone.ttfts)} turns). At each level every session sends its {args.turns} "
        "turns back to back, all sessions at once.",
        "",
        "Capacity's steps (`bench.capacity`'s stepping, corral's arm only):",
        "",
        markdown_table(
            ["sessions", "turns", "turns/s", "TTFT p50 s", "p50 vs alone", "lost", "duplicated", "failed turns"],
            [
                [
                    s.sessions,
                    s.turns,
                    f"{s.throughput:.1f}",
                    f"{s.p50:.3f}",
                    f"{arm.ratio(s):.2f}x",
                    s.lost,
                    s.duplicated,
                    len(s.problems) + s.no_text,
                ]
                for s in sorted(arm.steps, key=lambda s: s.sessions)
            ],
        ),
        "",
        "The levels:",
        "",
        markdown_table(
            [
                "level",
                "sessions",
                "turns",
                "turns/s",
                "TTFT p50 / p95 / p99 vs alone",
                "lost",
                "duplicated",
                "failed turns",
                "timed out: schedule-to-start (of which routed model turns)",
                "start-to-close",
                "heartbeat",
                "activities retried",
                "out of order (pairs)",
                "rank correlation",
            ],
            [
                [
                    f"{level.factor:g}x",
                    level.step.sessions,
                    level.step.turns,
                    f"{level.step.throughput:.1f}",
                    f"{level.step.p50 / alone.p50:.2f}x / {level.step.p95 / alone.p95:.2f}x / "
                    f"{level.p99 / _p99(alone):.2f}x",
                    level.step.lost,
                    level.step.duplicated,
                    level.failed,
                    f"{level.timed_out(SCHEDULE_TO_START)} ({level.routed_fallbacks})",
                    level.timed_out(START_TO_CLOSE),
                    level.timed_out(HEARTBEAT),
                    level.retried,
                    f"{100 * level.order.out_of_order:.1f}% ({level.order.pairs})",
                    f"{level.order.rank_correlation:.3f}",
                ]
                for level in levels
            ],
        ),
    ]
    for level in levels:
        waits = _queue_waits(level.checked)
        lines += ["", f"### {level.factor:g}x: {level.step.sessions} sessions", ""]
        lines += [f"- what a waiting user saw ({level.watch.samples} samples): " + "; ".join(_user_saw(level)) + "."]
        queues = [f"`{q}` {level.watch.backlog[q]} (oldest {level.watch.oldest.get(q, 0.0):.1f} s)"
                  for q in sorted(level.watch.queues)]  # fmt: skip
        lines += [f"- `corral status`'s largest backlog per queue: {', '.join(queues)}."]
        lines += [
            "- scheduled -> started, from the histories, p50 / p99 / longest: "
            + ", ".join(f"{q} {w['p50']:.2f} / {w['p99']:.2f} / {w['max']:.2f} s" for q, w in waits.items())
            + "."
        ]
        if level.resent or level.watch.failed_samples:
            lines += [f"- sent again by the client: {dict(level.resent)}; samples unanswered: "
                      f"{dict(level.watch.failed_samples)}."]  # fmt: skip
        if level.step.problems:
            lines += [f"- failed turns (the first 5): {'; '.join(level.step.problems[:5])}."]
        went_wrong = {k: v for k, v in level.checked.findings.items() if v}
        if went_wrong:
            lines += [f"- in the histories: {went_wrong}."]
    lines += [
        "",
        "TTFT: the message sent -> the turn's first text delta through the stream relay, each session's first turn "
        "left out (as in `bench.capacity`); alone: capacity's first step, one session, in the same run. Out of "
        f"order: of the pairs of turns that waited at once (the later sent before the earlier's first token, and "
        f"more than {levels[0].order.slack if levels else 0:.3f} s after it: one alone-TTFT p50), the share whose "
        "later turn got its first token first; rank correlation: Spearman's, between when each turn (every turn) "
        "was sent and when its first token came. What a waiting user saw: sampled every "
        f"{args.sample_every:g} s with `corral.queues` (the functions `corral status` and the API's `waiting` use), "
        f"for {WATCHED} sessions per level (the first opened, the last, and evenly between); its figures are "
        "Temporal's approximate counts.",
    ]
    return "\n".join(lines)


def summary(arm: Arm, capacity: int, found: str, levels: list[Level], args: argparse.Namespace) -> dict[str, Any]:
    alone = arm.baseline
    return {
        "cores": os.cpu_count() or 1,
        "capacity": capacity,
        "capacity_found": found,
        "turns_per_session": args.turns,
        "first_token_latency": args.first_token_latency,
        "alone": {"ttft_p50": alone.p50, "ttft_p95": alone.p95, "ttft_p99": _p99(alone), "turns": len(alone.ttfts)},
        "capacity_steps": [
            {"sessions": s.sessions, "turns_per_second": s.throughput, "p50_ratio": arm.ratio(s)}
            for s in sorted(arm.steps, key=lambda s: s.sessions)
        ],
        "levels": [
            {
                "factor": level.factor,
                "sessions": level.step.sessions,
                "turns": level.step.turns,
                "turns_per_second": level.step.throughput,
                "ttft_p50_ratio": level.step.p50 / alone.p50,
                "ttft_p95_ratio": level.step.p95 / alone.p95,
                "ttft_p99_ratio": level.p99 / _p99(alone),
                "ttft_p50": level.step.p50,
                "ttft_p99": level.p99,
                "lost": level.step.lost,
                "duplicated": level.step.duplicated,
                "failed_turns": level.failed,
                "schedule_to_start_timeouts": level.timed_out(SCHEDULE_TO_START),
                "routed_model_turns_sent_on": level.routed_fallbacks,
                "start_to_close_timeouts": level.timed_out(START_TO_CLOSE),
                "heartbeat_timeouts": level.timed_out(HEARTBEAT),
                "activities_retried": level.retried,
                "sent_again": sum(level.resent.values()),
                "queue_max_backlog": dict(level.watch.backlog),
                "queue_max_oldest_seconds": level.watch.oldest,
                "queue_waits": _queue_waits(level.checked),
                "longest_waits_seen": [vars(wait) for wait in level.watch.longest(SHOWN_WAITS)],
                "out_of_order_share": level.order.out_of_order,
                "order_pairs": level.order.pairs,
                "order_slack_seconds": level.order.slack,
                "rank_correlation": level.order.rank_correlation,
            }
            for level in levels
        ],
    }
