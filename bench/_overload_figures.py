"""What corral does past its capacity, as docs/operations.md quotes it (`<!-- bench:overload -->`), from the summary
of the results file `python -m bench.overload` writes; empty until it is measured."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench._operations_figures import measured, source, summary


def _longest(level: dict[str, Any]) -> str:
    waits = level["longest_waits_seen"]
    if not waits:
        return "none seen"
    wait = waits[0]
    return f"{wait['waited']:.1f} s, ~{wait['ahead']} ahead (a {wait['role'] or 'any'} worker)"


def _fullest(level: dict[str, Any]) -> str:
    backlog = max(level["queue_max_backlog"].values(), default=0)
    oldest = max(level["queue_max_oldest_seconds"].values(), default=0.0)
    return f"{backlog} / {oldest:.1f} s"


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("turns completed per second", lambda f: f"{f['turns_per_second']:.1f}"),
    (
        "TTFT vs alone, p50 / p95 / p99",
        lambda f: f"{f['ttft_p50_ratio']:.1f}x / {f['ttft_p95_ratio']:.1f}x / {f['ttft_p99_ratio']:.1f}x",
    ),
    ("lost / duplicated events", lambda f: f"{f['lost']} / {f['duplicated']}"),
    ("turns failed", lambda f: str(f["failed_turns"])),
    (
        "tasks timed out on schedule-to-start (of which routed model turns sent on to the shared queue)",
        lambda f: f"{f['schedule_to_start_timeouts']} ({f['routed_model_turns_sent_on']})",
    ),
    (
        "tasks timed out on start-to-close / on heartbeat / activities retried",
        lambda f: f"{f['start_to_close_timeouts']} / {f['heartbeat_timeouts']} / {f['activities_retried']}",
    ),
    ("`corral status`: largest backlog in a queue / oldest task", _fullest),
    ("a watched session's longest wait, tasks ahead of it", _longest),
    (
        "pairs of turns waiting at once served out of order",
        lambda f: f"{100 * f['out_of_order_share']:.1f}% of {f['order_pairs']:,}",
    ),
)
"""Each row of the quoted table: its name and how a level's figures fill its cell."""


def overload() -> str:
    if not measured("overload"):
        return ""
    record = summary("overload")
    f = record["figures"]
    levels = f["levels"]
    header = " | ".join(f"{level['factor']:g}x: {level['sessions']} sessions" for level in levels)
    table = "\n".join(f"| {name} | {' | '.join(cell(level) for level in levels)} |" for name, cell in ROWS)
    return (
        f"\n\nFrom {source('overload')}, `{record['command']}`: capacity {f['capacity']} sessions on {f['cores']} "
        f"cores ({f['capacity_found']}); at each level every session sends {f['turns_per_session']} turns back to "
        f"back (a preamble, one tool call, an answer), all sessions at once; alone: TTFT p50 "
        f"{f['alone']['ttft_p50']:.2f} s in the same run.\n\n| past capacity | {header} |\n"
        f"| --- |{' ---: |' * len(levels)}\n{table}\n\n"
        f"Out of order: of the pairs of turns waiting at the same time, sent more than one alone-TTFT apart, the "
        f"share whose later turn got its first token first. The backlog and the waits are what `corral status` and "
        f"the API's `waiting` showed, sampled during the run (approximate, as they say).\n"
    )
