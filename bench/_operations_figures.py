"""The figures `docs/operations.md` sizes a deployment from (section 2), rendered for `bench.quote`, with the
helpers every quoted block uses: a results file's summary and where it came from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench._report import RESULTS_DIR, read_summary


def summary(name: str) -> dict[str, Any]:
    return read_summary(RESULTS_DIR / f"{name}.md")


def measured(name: str) -> bool:
    """Whether the results hold this run (a variant that did not fit a run is left out, not kept old)."""
    return (RESULTS_DIR / f"{name}.md").exists()


def source(name: str) -> str:
    """Where a block's figures come from: the results file and the commit it was measured on."""
    record = summary(name)
    return f"[`bench/results/{name}.md`](RESULTS/{name}.md), commit {record['commit'][:7]}"


DEPLOYED = ("harness worker", "model worker", "utility worker", "sandbox worker", "stream relay", "Temporal dev server")


def _process(name: str) -> dict[str, Any]:
    processes: dict[str, dict[str, Any]] = summary("load")["figures"]["processes"]
    return processes[name]


def ops_load() -> str:
    f = summary("load")["figures"]
    rows = [
        f"| {name}{' (a stand-in, not deployed)' if name not in DEPLOYED else ''} | {p['rss_before_mb']:.0f} "
        f"| {p['rss_peak_mb']:.0f} | {p['cpu_ms_per_turn']:.1f} |"
        for name, p in f["processes"].items()
    ]
    deployed = {name: p["cpu_ms_per_turn"] for name, p in f["processes"].items() if name in DEPLOYED}
    total = sum(deployed.values())
    waits = f["queue_wait_p50"]
    harness = waits.get("workflow task (harness)", {"alone": float("nan"), "loaded": float("nan")})
    activities = [wait["loaded"] for queue, wait in waits.items() if queue != "workflow task (harness)"]
    return "\n".join(
        [
            "",
            f"From {source('load')} (`{summary('load')['command']}`): {f['sessions']} sessions at once, "
            f"{f['turns']} turns each, {f['turns_done']:,} turns in {f['wall_seconds']:.1f} s "
            f"({f['turns_per_second']:.2f} turns/s), {f['lost']} lost and {f['duplicated']} duplicated. A turn is a "
            f"user message, a streamed one-line preamble, one tool call (`calculate`, or `bash` in a sandbox for "
            f"{f['sandbox_sessions']} of the sessions) and an answer; the offline model server gives a first token "
            f"after {f['first_token_latency']:g} s, then {f['tokens_per_second']:g} tokens/s. One process per role, "
            f"all on one {f['cores']}-core machine (load average {f['load_average_during'][0]:.1f} when the load "
            f"began, {f['load_average_during'][-1]:.1f} when it ended).",
            "",
            "| process | RSS before MB | peak MB | CPU ms per turn |",
            "| --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"Summed over the deployed roles, a turn cost about {total:.0f} ms of CPU, "
            f"{deployed.get('Temporal dev server', 0) / total:.0%} of it the Temporal dev server's. Under that load "
            f"the harness's workflow tasks waited {harness['loaded']:.3f} s p50 in their queue, against "
            f"{harness['alone']:.3f} s for one session alone, while activity queues waited "
            f"{min(activities):.3f}-{max(activities):.3f} s p50.",
            "",
        ]
    )


def ops_figures() -> str:
    scale = summary("scale")["figures"]
    more = ""
    if measured("scale-1500"):
        scale_more = summary("scale-1500")["figures"]
        more = f" ({scale_more['harness_kb_per_cached_session']:.0f} KB with {scale_more['parked']:,} parked)"
    ttft_arms = summary("ttft")["figures"]["arms"]
    box, roles, long_run = summary("sandbox")["figures"], summary("recovery")["figures"]["roles"], summary("long")
    lf = long_run["figures"]
    d, x = ttft_arms["decoupled"], ttft_arms["direct"]
    kb = scale["harness_kb_per_cached_session"]
    return "\n".join(
        [
            "",
            "| figure | value | source |",
            "| --- | --- | --- |",
            f"| harness memory per cached session | {kb:.0f} KB{more} "
            f"| `bench/results/scale.md`{', `scale-1500.md`' if more else ''} |",
            f"| {scale['parked']:,} idle sessions | harness "
            f"+{scale['harness_rss_mb']['parked'] - scale['harness_rss_mb']['start']:.0f} MB (the workflow cache), "
            f"model worker +{scale['model_rss_mb']['parked'] - scale['model_rss_mb']['start']:.0f} MB "
            "| `bench/results/scale.md` |",
            f"| CPU per turn with a zero-latency model, {scale['active']} active sessions | harness "
            f"{scale['cpu_ms_per_turn_0_parked']['harness']:.1f} ms, model worker "
            f"{scale['cpu_ms_per_turn_0_parked']['model']:.1f} ms | `bench/results/scale.md` |",
            f"| history bytes per turn, the first and the last {scale['history_window']} of "
            f"{scale['history_turns']} turns | {scale['history_bytes_per_turn_first']:,.0f} and "
            f"{scale['history_bytes_per_turn_last']:,.0f} | `bench/results/scale.md` |",
            f"| what the harness adds to the first token of a new session / of the next message | "
            f"{1000 * (d['p50'] - x['p50']):.0f} ms / {1000 * (d['next_p50'] - x['next_p50']):.0f} ms p50 "
            f"({summary('ttft')['figures']['model_workers']} model workers) | `bench/results/ttft.md` |",
            f"| first sandbox call on `corral up`'s stack (warm pool) / a cold provision (pool off, breakdown) | "
            f"{box['first_ms']:.1f} ms / {box['breakdown']['cold_ms']:.1f} ms p50 | `bench/results/sandbox.md` |",
            f"| `bash true` on a running sandbox, on `corral up`'s stack | {box['execute_ms']:.1f} ms p50 (a raw "
            f"`docker exec`: {box['docker_exec_ms']:.1f} ms) | `bench/results/sandbox.md` |",
            "| from SIGKILL to the session's next event, with a standby of the role | "
            + ", ".join(f"{role} {r['next_event_p50']:.2f} s" for role, r in roles.items())
            + " p50 | `bench/results/recovery.md` |",
            f"| replaying a complete run (what a new harness worker does on picking up a session; the first run "
            f"held {int(lf['first_run_history_events']):,} history events) | {lf['replay_last']:.2f} s | "
            "`bench/results/long.md` |",
            f"| a continue-as-new hand-over | {1000 * lf['hand_over_p50']:.0f} ms p50 | `bench/results/long.md` |",
            "",
        ]
    )


def ops_routing() -> str:
    if not measured("ttft-no-routing"):
        return ""
    routed, unrouted = summary("ttft")["figures"], summary("ttft-no-routing")["figures"]
    return (
        f" (`bench/results/ttft-no-routing.md`: the model activity's set-up took "
        f"{unrouted['model_activity_setup_ms_p50']:.1f} ms p50 unrouted against "
        f"{routed['model_activity_setup_ms_p50']:.1f} ms routed, `bench/results/ttft.md`)"
    )


def ops_relay() -> str:
    relay = _process("stream relay")
    return f"{relay['rss_peak_mb']:.0f} MB peak and {relay['cpu_ms_per_turn']:.1f} ms of CPU"


def ops_harness_memory() -> str:
    f = summary("scale")["figures"]
    kb = f["harness_kb_per_cached_session"]
    full = f["harness_rss_mb"]["start"] + kb * f["workflow_cache"] / 1024
    return (
        f"about {kb:.0f} KB each, at most {f['workflow_cache']:,} per worker by the SDK's default), so "
        f"{f['workflow_cache']:,} active sessions fit in about {full:.0f} MB per harness worker"
    )


def ops_replay() -> str:
    return f"about {summary('long')['figures']['replay_last']:.1f} s for a full one"


def ops_sandbox_worker() -> str:
    worker = _process("sandbox worker")
    return f"{worker['rss_peak_mb']:.0f} MB, {worker['cpu_ms_per_turn']:.1f} ms per turn"


def ops_temporal_share() -> str:
    processes = summary("load")["figures"]["processes"]
    deployed = {name: p["cpu_ms_per_turn"] for name, p in processes.items() if name in DEPLOYED}
    return f"{deployed.get('Temporal dev server', 0) / sum(deployed.values()):.0%}"


OPERATIONS: dict[str, Callable[[], str]] = {
    "ops-load": ops_load,
    "ops-figures": ops_figures,
    "ops-routing": ops_routing,
    "ops-relay": ops_relay,
    "ops-harness-memory": ops_harness_memory,
    "ops-replay": ops_replay,
    "ops-sandbox-worker": ops_sandbox_worker,
    "ops-temporal-share": ops_temporal_share,
}
