"""The load benchmark's report: throughput, latency against one session alone, the processes' memory and CPU,
the accounting of every event, and what went wrong under load."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench import _server_metrics as server_metrics
from bench._report import markdown_table, percentile

if TYPE_CHECKING:
    from bench._load_clients import Load, Session

FRACTIONS = (0.5, 0.95, 0.99)


def _figures(values: Sequence[float]) -> list[str]:
    return [f"{percentile(values, fraction):.3f}" for fraction in FRACTIONS]


def _ratios(loaded: Sequence[float], alone: Sequence[float]) -> list[str]:
    ratios = []
    for fraction in FRACTIONS:
        base = percentile(alone, fraction)
        ratios.append(f"{percentile(loaded, fraction) / base:.2f}" if loaded and base > 0 else "n/a")
    return ratios


def _latency_rows(load: Load) -> list[list[str]]:
    def ttfts(sessions: Sequence[Session]) -> list[float]:
        return [turn.ttft for session in sessions for turn in session.turns if turn.ttft is not None]

    def latencies(sessions: Sequence[Session], sandbox: bool) -> list[float]:
        return [turn.latency for session in sessions if session.sandbox == sandbox for turn in session.turns]

    rows = []
    measures = [("TTFT, all turns (s)", ttfts(load.baseline), ttfts(load.loaded))]
    for sandbox, label in ((False, "turn latency, calculate sessions (s)"), (True, "turn latency, bash sessions (s)")):
        if any(session.sandbox == sandbox for session in load.loaded):
            measures.append((label, latencies(load.baseline, sandbox), latencies(load.loaded, sandbox)))
    for label, alone, loaded in measures:
        rows.append([label, *_figures(alone), *_figures(loaded), *_ratios(loaded, alone)])
    return rows


def _wait_rows(load: Load) -> list[list[str]]:
    alone, loaded = load.alone_checked.waits, load.checked.waits
    return [
        [queue, *_figures(alone.get(queue, [])), *_figures(waits), *_ratios(waits, alone.get(queue, []))]
        for queue, waits in sorted(loaded.items())
    ]


def _process_rows(load: Load, turns: int) -> list[list[str]]:
    rows = []
    for name in load.processes:
        rss = load.rss.get(name, {})
        cpu = load.cpu.get(name, float("nan"))
        rows.append(
            [
                name,
                f"{rss.get('before', float('nan')):.0f}",
                f"{rss.get('peak', float('nan')):.0f}",
                f"{rss.get('after', float('nan')):.0f}",
                f"{cpu:.1f}",
                f"{1000 * cpu / max(1, turns):.1f}",
            ]
        )
    return rows


def _accounting_rows(load: Load) -> list[list[str]]:
    checked = load.checked
    names = list(dict.fromkeys([*checked.lost, *checked.duplicated]))
    rows = [[name, str(checked.lost[name]), str(checked.duplicated[name])] for name in names]
    rows.append(["**total**", f"**{checked.lost.total()}**", f"**{checked.duplicated.total()}**"])
    return rows


def _went_wrong(load: Load, turns_done: int, expected: int) -> list[str]:
    checked = load.checked
    lines = []
    if turns_done < expected:
        lines.append(f"- {expected - turns_done} of {expected} turns did not complete.")
    problems = [session for session in load.sessions if session.problem]
    for session in problems[:10]:
        lines.append(f"- session {session.id} (#{session.index}, sandbox {session.sandbox}): {session.problem}")
    if len(problems) > 10:
        lines.append(f"- ... and {len(problems) - 10} more sessions with a failed turn")
    no_text = sum(1 for session in load.loaded for turn in session.turns if turn.ttft is None)
    if no_text:
        lines.append(f"- {no_text} turns whose text never came through the stream relay (no TTFT)")
    if load.rpc_errors.seen:
        errors = ", ".join(f"{name} x{count}" for name, count in load.rpc_errors.seen.most_common())
        lines.append(f"- RPC errors the client met (corral.client sends again or asks again): {errors}")
    for name, count in checked.findings.items():
        if count:
            lines.append(f"- histories and logs: {name}: {count}")
    for message, count in checked.messages.most_common(10):
        lines.append(f"  - x{count}: {message[:300]}")
    lines.extend(f"  - {said}" for said in checked.short_markers)
    for name, messages in load.log_lines.items():
        for message, count in messages.most_common(5):
            lines.append(f"- {name} log: x{count} {message}")
    if checked.containers_left:
        lines.append(f"- {checked.containers_left} sandbox containers of this run left after clean-up")
    return lines or ["- nothing: no failed turn, RPC error, task failure, retry or logged warning"]


def _server_section(load: Load, turns: int) -> list[str]:
    """What a turn asks of Temporal: the sessions' history events, and the server's own counters."""
    per = 1 / max(turns, 1)
    history = load.checked.history
    lines = [
        "What a turn asks of Temporal, over the load: from the sessions' histories, and from the dev server's "
        "own metrics (RPCs by operation, store requests, state transitions; the clients' reads of the logs "
        "included, as every reader of a session adds them).",
        "",
        "| per turn, from the histories | count |",
        "| :--- | ---: |",
        *(f"| {name} | {history[name] * per:.1f} |" for name in sorted(history)),
        "",
    ]
    if load.server is not None:
        lines += [server_metrics.table(load.server, turns), ""]
    return lines


def report(load: Load) -> str:
    args = load.args
    expected = args.sessions * args.turns
    turns_done = sum(len(session.turns) for session in load.loaded)
    checked = load.checked
    summary = [
        ["sessions at once (of them with a sandbox)", f"{args.sessions} ({args.sandbox_sessions})"],
        ["turns per session", f"{args.turns}"],
        ["turns done / expected", f"{turns_done} / {expected}"],
        ["wall time of the load", f"{load.wall:.1f} s"],
        ["throughput", f"{turns_done / load.wall:.2f} turns/s, {checked.events / load.wall:.1f} events/s"],
        ["events logged (all sessions)", f"{checked.events}"],
        [
            "machine load average (1 min) when the load began / ended",
            " / ".join(f"{value:.1f}" for value in load.load_average) + f" ({os.cpu_count()} cores)",
        ],
        ["lost / duplicated", f"{checked.lost.total()} / {checked.duplicated.total()}"],
    ]
    kinds = "a `calculate` session, then a `bash` session" if args.sandbox_sessions else "a `calculate` session"
    lines = [
        f"{args.sessions} sessions at once, {args.turns} turns each, back to back. A turn: a user message sent with "
        "the `send_events` update (with a client id), a streamed one-line preamble and one tool call (`calculate` "
        f"on the utility hand; `bash` in the session's own Docker sandbox for {args.sandbox_sessions} sessions, "
        "appending a line to a marker file), then an answer. Model server: first token after "
        f"{args.first_token_latency:g} s, then {args.tokens_per_second:g} tokens/s. Temporal: in-memory dev server; "
        "one process per worker role (harness, model, utility hand, sandbox hand), the model server and the stream "
        "relay in processes of their own, the clients in the benchmark's process.",
        "",
        markdown_table(["measure", "value"], summary),
        "",
        f"Latency, one session alone ({kinds}, {args.turns} turns each, measured in this run before the load) vs "
        "under load. TTFT: message sent -> the turn's first text delta from the stream relay; turn latency: message "
        "sent -> the turn's `session.status_idle` read by the client.",
        "",
        markdown_table(
            ["measure", "alone p50", "p95", "p99", "load p50", "p95", "p99", "load/alone p50", "p95", "p99"],
            _latency_rows(load),
        ),
        "",
        "Where the turns wait: each task's time in its queue (scheduled -> started, from the histories, first "
        "attempts; seconds). The harness and the model worker poll with the SDK's autoscaling poller "
        "(`workers.run.POLLERS`), the hands with the SDK's 5 polls; a harness holds up to `HARNESS_WORKFLOW_SLOTS` "
        "workflow tasks, a model worker runs up to `MODEL_ACTIVITY_SLOTS` turns, a hand up to 100 tasks (the SDK's "
        "default).",
        "",
        markdown_table(
            ["queue", "alone p50", "p95", "p99", "load p50", "p95", "p99", "load/alone p50", "p95", "p99"],
            _wait_rows(load),
        ),
        "",
        f"Processes: RSS in MB before the load, its peak (sampled every second) and after; CPU during the load "
        f"({turns_done} turns).",
        "",
        markdown_table(
            ["process", "RSS before", "peak", "after", "CPU s", "CPU ms per turn"], _process_rows(load, turns_done)
        ),
        "",
        *_server_section(load, turns_done),
        "Every event accounted for (each session's whole log read back; sandbox marker files counted):",
        "",
        markdown_table(["check", "lost", "duplicated"], _accounting_rows(load)),
        "",
        "What went wrong under load:",
        "",
        *_went_wrong(load, turns_done, expected),
    ]
    return "\n".join(lines)


def summary(load: Load) -> dict[str, Any]:
    """The figures `bench.quote` quotes: the run's size, throughput, TTFT alone and under load, what was lost."""
    args = load.args
    ttft_alone = [turn.ttft for session in load.baseline for turn in session.turns if turn.ttft is not None]
    ttft_loaded = [turn.ttft for session in load.loaded for turn in session.turns if turn.ttft is not None]
    turns_done = sum(len(session.turns) for session in load.loaded)
    return {
        "sessions": args.sessions,
        "first_token_latency": args.first_token_latency,
        "tokens_per_second": args.tokens_per_second,
        "cores": os.cpu_count(),
        "sandbox_sessions": args.sandbox_sessions,
        "turns": args.turns,
        "turns_done": turns_done,
        "turns_expected": args.sessions * args.turns,
        "turns_per_second": turns_done / load.wall,
        "ttft_alone_p50": percentile(ttft_alone, 0.5),
        "ttft_alone_p95": percentile(ttft_alone, 0.95),
        "ttft_alone_p99": percentile(ttft_alone, 0.99),
        "ttft_loaded_p50": percentile(ttft_loaded, 0.5),
        "ttft_loaded_p95": percentile(ttft_loaded, 0.95),
        "ttft_loaded_p99": percentile(ttft_loaded, 0.99),
        "wall_seconds": load.wall,
        "load_average_during": list(load.load_average),
        "lost": load.checked.lost.total(),
        "duplicated": load.checked.duplicated.total(),
        "processes": {
            name: {
                "rss_before_mb": load.rss.get(name, {}).get("before"),
                "rss_peak_mb": load.rss.get(name, {}).get("peak"),
                "cpu_ms_per_turn": 1000 * load.cpu[name] / max(1, turns_done) if name in load.cpu else None,
            }
            for name in load.processes
        },
        "history_per_turn": {name: count / max(1, turns_done) for name, count in load.checked.history.items()},
        "server_per_turn": server_metrics.summary(load.server, turns_done) if load.server is not None else None,
        "went_wrong": dict(load.checked.findings),
        "queue_wait_p50": {
            queue: {"alone": percentile(load.alone_checked.waits.get(queue, []), 0.5), "loaded": percentile(waits, 0.5)}
            for queue, waits in sorted(load.checked.waits.items())
        },
    }
