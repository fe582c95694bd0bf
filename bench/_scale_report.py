"""The scale benchmark's report: the table of what parked sessions cost and what the workers sustain, the summary
`bench.quote` quotes, and the plot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench._report import markdown_table, percentile

if TYPE_CHECKING:
    from bench.scale import ActivePhase, Scale

WORKFLOW_CACHE = 1000  # temporalio's default `max_cached_workflows`, which `harness_worker` keeps


def per_turn(history: list[tuple[int, int, int]], first: int, last: int) -> float:
    """History bytes per turn between two sampled turn counts."""
    sizes = {turns: size for turns, size, _ in history}
    return (sizes[last] - sizes[first]) / (last - first)


def summary(scale: Scale, before: ActivePhase, after: ActivePhase) -> dict[str, Any]:
    """The figures `bench.quote` quotes, from the same values as the report's table."""
    rss = scale.rss
    cached = min(WORKFLOW_CACHE, scale.started)
    turns = max(turns for turns, _, _ in scale.history)
    window = min(10, turns)
    return {
        "parked": scale.args.parked,
        "active": scale.args.active,
        "workflow_cache": WORKFLOW_CACHE,
        "parked_per_second": scale.args.parked / scale.park_seconds,
        "turns_per_second_0_parked": before.turns_per_second,
        "turns_per_second_parked": after.turns_per_second,
        "cpu_ms_per_turn_0_parked": {
            "harness": 1000 * before.cpu[0] / max(1, len(before.latencies)),
            "model": 1000 * before.cpu[1] / max(1, len(before.latencies)),
        },
        "harness_rss_mb": {"start": rss["start"][0], "parked": rss["parked"][0], "end": rss["end"][0]},
        "model_rss_mb": {"start": rss["start"][1], "parked": rss["parked"][1], "end": rss["end"][1]},
        "harness_kb_per_cached_session": (rss["parked"][0] - rss["start"][0]) * 1024 / cached,
        "history_turns": turns,
        "history_window": window,
        "history_bytes_per_turn_first": per_turn(scale.history, 0, window),
        "history_bytes_per_turn_last": per_turn(scale.history, turns - window, turns),
    }


def report(scale: Scale, before: ActivePhase, after: ActivePhase) -> str:
    args = scale.args
    rss = scale.rss
    grown = rss["parked"][0] - rss["start"][0]
    parked = args.parked
    cached = min(WORKFLOW_CACHE, scale.started)
    turns = max(turns for turns, _, _ in scale.history)
    window = min(10, turns)
    first = per_turn(scale.history, 0, window)
    last = per_turn(scale.history, turns - window, turns)
    largest = {turns_done: size for turns_done, _, size in scale.history}
    rows = [
        ["sessions parked (idle, waiting for a message)", f"{parked}"],
        ["parking: sessions started and answered per second", f"{parked / scale.park_seconds:.1f}"],
        [
            f"turns per second, {args.active} active sessions, 0 parked",
            f"{before.turns_per_second:.1f} (turn p50 {1000 * percentile(before.latencies, 0.5):.0f} ms, "
            f"p95 {1000 * percentile(before.latencies, 0.95):.0f} ms)",
        ],
        [
            f"turns per second, {args.active} active sessions, {parked} parked",
            f"{after.turns_per_second:.1f} (turn p50 {1000 * percentile(after.latencies, 0.5):.0f} ms, "
            f"p95 {1000 * percentile(after.latencies, 0.95):.0f} ms); "
            f"{after.turns_per_second / before.turns_per_second:.2f}x of 0 parked",
        ],
        [
            "CPU per turn, harness / model worker (0 parked -> parked)",
            f"{1000 * before.cpu[0] / max(1, len(before.latencies)):.1f} / "
            f"{1000 * before.cpu[1] / max(1, len(before.latencies)):.1f} ms -> "
            f"{1000 * after.cpu[0] / max(1, len(after.latencies)):.1f} / "
            f"{1000 * after.cpu[1] / max(1, len(after.latencies)):.1f} ms",
        ],
        [
            "harness worker RSS: start -> after parking -> after the active phase",
            f"{rss['start'][0]:.0f} -> {rss['parked'][0]:.0f} -> {rss['end'][0]:.0f} MB",
        ],
        [
            f"harness RSS growth per cached session ({cached} cached after parking)",
            f"{grown * 1024 / cached:.0f} KB",
        ],
        [
            "model worker RSS: start -> after parking -> after the active phase",
            f"{rss['start'][1]:.0f} -> {rss['parked'][1]:.0f} -> {rss['end'][1]:.0f} MB",
        ],
        [
            f"history bytes per turn, turns 1-{window} vs {turns - window + 1}-{turns}",
            f"{first:.0f} vs {last:.0f} ({last / first:.2f}x)",
        ],
        [
            f"largest model_turn input after {window} / {turns} turns",
            f"{largest[window]} / {largest[turns]} bytes",
        ],
    ]
    lines = [
        f"Zero-latency model server; harness and model worker in separate processes; {args.active} active sessions "
        f"for {args.active_seconds:g} s per active phase (a client polls the log every 0.1 s); history: one session, "
        f"{turns} turns of a `calculate` call and an answer. The harness caches up to {WORKFLOW_CACHE} workflows "
        "(the SDK default).",
        "",
        markdown_table(["measure", "value"], rows),
        "",
        "Goals: 1,000 parked sessions cost no worker memory growth beyond the workflow cache "
        f"(harness {grown:+.0f} MB for {parked} parked sessions, at most {cached} of them cached; model worker "
        f"{rss['parked'][1] - rss['start'][1]:+.0f} MB); history bytes per turn flat "
        f"({'yes' if last / first < 1.15 else 'no'}: {last / first:.2f}x).",
    ]
    return "\n".join(lines)


def figure(scale: Scale, before: ActivePhase, after: ActivePhase) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory, rate, history) = plt.subplots(1, 3, figsize=(15, 4.3))
    parked = [sample[0] for sample in scale.park_samples]
    memory.plot(parked, [sample[1] for sample in scale.park_samples], marker=".", label="harness worker")
    memory.plot(parked, [sample[2] for sample in scale.park_samples], marker=".", label="model worker")
    if max(parked, default=0) >= 0.8 * WORKFLOW_CACHE:
        memory.axvline(WORKFLOW_CACHE, color="tab:gray", linestyle=":", label="workflow cache size")
    memory.set_xlabel("sessions parked")
    memory.set_ylabel("RSS (MB)")
    memory.set_ylim(bottom=0)
    memory.set_title("worker memory while parking sessions")
    memory.grid(True, alpha=0.3)
    memory.legend()
    for phase, label in ((before, "0 parked"), (after, f"{after.parked} parked")):
        seconds = int(phase.seconds)
        counts = [0] * seconds
        for ended in phase.turn_ends:
            counts[min(seconds - 1, int(ended))] += 1
        rate.plot(range(seconds), counts, label=f"{label} ({phase.turns_per_second:.1f}/s)")
    rate.set_xlabel("seconds into the active phase")
    rate.set_ylabel("turns per second")
    rate.set_ylim(bottom=0)
    rate.set_title(f"{scale.args.active} active sessions")
    rate.grid(True, alpha=0.3)
    rate.legend()
    windows = [
        (later[0], (later[1] - earlier[1]) / (later[0] - earlier[0]))
        for earlier, later in zip(scale.history, scale.history[1:], strict=False)
    ]
    history.plot([turns for turns, _ in windows], [size for _, size in windows], marker="o")
    history.set_xlabel("turns done")
    history.set_ylabel("history bytes per turn (previous window)")
    history.set_ylim(bottom=0)
    history.set_title("history growth per turn")
    history.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
