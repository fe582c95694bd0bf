"""The figures README.md, bench/README.md and the pages of docs/ quote, generated from the results files' summaries.

Each quoted block sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; this module renders NAME from the
JSON summary at the end of a results file (or, for the timers, from corral's code), so no figure in the READMEs
is typed by hand and none can drift from its file. `tests/test_bench_quote.py` fails when a block differs from
what this module renders.

    python -m bench.quote            # rewrite every block in place
    python -m bench.quote --check    # exit 1 and name the blocks that differ
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from bench._capacity_figures import capacity
from bench._load_figures import under_load
from bench._operations_figures import OPERATIONS, measured, source, summary
from bench._overload_figures import overload
from bench._report import RESULTS_DIR, ROOT, read_summary
from bench._ttft_figures import new_session_line, ttft_block
from workflows.policies import (
    MODEL_HEARTBEAT_TIMEOUT,
    ROUTED_SCHEDULE_TO_START,
    SANDBOX_HEARTBEAT_TIMEOUT,
)

DOCUMENTS = (ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""Every page that may quote a block: a block moves from page to page with its text, and is found wherever it is."""
BLOCK = re.compile(r"(<!-- bench:([\w-]+) -->)(.*?)(<!-- /bench:\2 -->)", re.DOTALL)


def ttft() -> str:
    return ttft_block(summary("ttft")["figures"], source("ttft"))


def ttft_new_session() -> str:
    record = summary("ttft")
    return new_session_line(record["figures"], f"{source('ttft')}, `{record['command']}`")


def ttft_no_routing() -> str:
    if not measured("ttft-no-routing"):
        return ""
    routed, unrouted = summary("ttft")["figures"], summary("ttft-no-routing")["figures"]
    ratio = unrouted["arms"]["decoupled"]["next_p50"] / unrouted["arms"]["direct"]["next_p50"]
    return (
        f": the model activity's set-up took {unrouted['model_activity_setup_ms_p50']:.1f} ms p50 against "
        f"{routed['model_activity_setup_ms_p50']:.1f} ms routed, and the next message's ratio was {ratio:.2f} at "
        f"p50 ({source('ttft-no-routing')}, `{summary('ttft-no-routing')['command']}`)"
    )


def ttft_repo50() -> str:
    if not measured("ttft-repo50"):
        return ""
    arms = summary("ttft-repo50")["figures"]["arms"]
    d, c = arms["decoupled"], arms["coupled"]
    return (
        f" With a {summary('ttft-repo50')['figures']['repo_mb']} MB repository, the coupled p50 is {c['p50']:.1f} s "
        f"and the reductions are {100 * (1 - d['p50'] / c['p50']):.1f}% at p50 and "
        f"{100 * (1 - d['p95'] / c['p95']):.1f}% at p95 ({source('ttft-repo50')}, "
        f"`{summary('ttft-repo50')['command']}`)."
    )


VARIANTS = {
    "ttft-repo50": "the coupled arm clones a 50 MB repository",
    "ttft-no-routing": "every model turn on the shared queue",
    "recovery-no-routing": "the model role killed with every model turn on the shared queue",
    "scale-1500": "more sessions parked than the harness caches",
}


def variants() -> str:
    present = [f"`{name}` ({what})" for name, what in VARIANTS.items() if measured(name)]
    return " " + (", ".join(present) if present else "none in this run") + "."


def _roles(name: str) -> str:
    roles = summary(name)["figures"]["roles"]
    parts = [
        f"{role} {figures['next_event_p50']:.2f} / {figures['next_event_p95']:.2f} s "
        f"({figures['lost']} lost, {figures['duplicated']} duplicated)"
        for role, figures in roles.items()
    ]
    return "; ".join(parts)


def recovery() -> str:
    text = f"Latest result ({source('recovery')}): next event after a SIGKILL at p50 / p95 — {_roles('recovery')}."
    if measured("recovery-no-routing"):
        text += f" Without routing ({source('recovery-no-routing')}): {_roles('recovery-no-routing')}."
    return text


def recovery_timers() -> str:
    """The timers that govern recovery, read from corral's code as the recovery benchmark reads them."""
    from bench._recovery_report import HEARTBEAT, RETRY, STICKY

    return (
        f"the model activity's heartbeat timeout (`MODEL_HEARTBEAT_TIMEOUT` in `workflows/policies.py`, "
        f"{HEARTBEAT['model']:g} s), the sandbox hand's (`SANDBOX_HEARTBEAT_TIMEOUT` in `workflows/policies.py`, "
        f"{HEARTBEAT['sandbox']:g} s), the harness's sticky-queue schedule-to-start timeout (`STICKY_TIMEOUT` in "
        f"`workers/run.py`, {STICKY:g} s) and the retry back-off ({RETRY:g} s, `INFRASTRUCTURE_RETRY`)"
    )


def timers() -> str:
    """How a lost worker is noticed, from the constants corral runs with (docs/sessions.md, "Lost workers")."""
    import inspect

    from activities.model import HEARTBEAT_INTERVAL_SECONDS
    from corral.hands.heartbeat import heartbeating
    from workers.roles import MODEL_HEARTBEAT_THROTTLE
    from workers.run import STICKY_TIMEOUT

    hand_interval = inspect.signature(heartbeating).parameters["interval"].default
    return (
        f"A model turn heartbeats every {HEARTBEAT_INTERVAL_SECONDS:g} s (the SDK sends one every "
        f"{MODEL_HEARTBEAT_THROTTLE.total_seconds():g} s; timeout {MODEL_HEARTBEAT_TIMEOUT.total_seconds():g} s), a "
        f"hand every {hand_interval:g} s (timeout {SANDBOX_HEARTBEAT_TIMEOUT.total_seconds():g} s). Temporal re-runs "
        "the activity on another worker, and workflow tasks leave a dead worker's sticky queue after "
        f"{STICKY_TIMEOUT.total_seconds():g} s"
    )


def routed_timeout() -> str:

    return f"{ROUTED_SCHEDULE_TO_START.total_seconds():g} s"


def _scale_line(name: str) -> str:
    f = summary(name)["figures"]
    return (
        f"{f['parked']:,} sessions parked at {f['parked_per_second']:.0f} sessions/s; {f['active']} active sessions "
        f"do {f['turns_per_second_0_parked']:.0f} turns/s with none parked and {f['turns_per_second_parked']:.0f} "
        f"with {f['parked']:,} parked ({f['turns_per_second_parked'] / f['turns_per_second_0_parked']:.2f}x); "
        f"harness RSS {f['harness_rss_mb']['start']:.0f} → {f['harness_rss_mb']['parked']:.0f} MB "
        f"(~{f['harness_kb_per_cached_session']:.0f} KB per cached session, cache {f['workflow_cache']:,}); model "
        f"worker {f['model_rss_mb']['start']:.0f} → {f['model_rss_mb']['parked']:.0f} MB; history "
        f"{f['history_bytes_per_turn_first']:,.0f} vs {f['history_bytes_per_turn_last']:,.0f} bytes per turn over the "
        f"first and last {f['history_window']} of {f['history_turns']} turns "
        f"({f['history_bytes_per_turn_last'] / f['history_bytes_per_turn_first']:.2f}x)"
    )


def scale() -> str:
    text = f"Latest result ({source('scale')}): {_scale_line('scale')}."
    if measured("scale-1500"):
        text += f" Past the cache ({source('scale-1500')}): {_scale_line('scale-1500')}."
    return text


def sandbox() -> str:
    f = summary("sandbox")["figures"]
    b = f["breakdown"]
    return "\n".join(
        [
            "",
            f"From {source('sandbox')}: {f['sessions']} sessions on `corral up`'s stack, {f['calls_per_session']} "
            "`bash true` calls each, timed from `agent.tool_use` to `agent.tool_result` in the session log, beside "
            "raw Docker in the same run:",
            "",
            "| call | corral p50 | raw Docker p50 | ratio |",
            "| --- | ---: | ---: | ---: |",
            f"| first tool call (warm-pool claim + `bash true`) | {f['first_ms']:.1f} ms | `docker run --rm IMAGE "
            f"true`: {f['docker_run_ms']:.1f} ms | {f['first_ratio']:.2f}x |",
            f"| `bash true` on a running sandbox | {f['execute_ms']:.1f} ms | `docker exec CONTAINER true`: "
            f"{f['docker_exec_ms']:.1f} ms | {f['execute_ratio']:.2f}x |",
            "",
            f"Breakdown (a bench-only workflow on the same sandbox activities, not the product's path): a cold "
            f"provision with the pool off {b['cold_ms']:.1f} ms ({b['cold_ratio']:.2f}x `docker run`); of an "
            f"execute's {b['execute_ms']:.1f} ms, {b['temporal_ms']:.1f} ms are Temporal's and {b['runner_ms']:.1f} ms "
            "the runner's round trip.",
            "",
        ]
    )


def long() -> str:
    f = summary("long")["figures"]
    return (
        f"Latest result ({source('long')}): {int(f['turns']):,} turns, {int(f['events']):,} events in "
        f"{int(f['runs'])} workflow runs; history bytes per turn late vs early "
        f"{f['late_bytes_per_turn'] / f['early_bytes_per_turn']:.2f}x; the largest request "
        f"{int(f['largest_request_tokens']):,} tokens against a budget of {int(f['budget']):,}; cache-read share "
        f"{f['cache_read_share']:.0%}; a 100-event slice at the end {f['slice_end'] / f['slice_start']:.2f}x the "
        "one at the start."
    )


def load() -> str:
    f = summary("load")["figures"]
    return (
        f"Latest result ({source('load')}): {f['sessions']} sessions x {f['turns']} turns ({f['sandbox_sessions']} "
        f"in sandboxes), {f['turns_done']:,} of {f['turns_expected']:,} turns done at {f['turns_per_second']:.1f} "
        f"turns/s; TTFT p50 {f['ttft_alone_p50']:.3f} s alone, {f['ttft_loaded_p50']:.3f} s under load (p95 "
        f"{f['ttft_loaded_p95']:.3f} s); {f['lost']} lost, {f['duplicated']} duplicated."
    )


def reliability() -> str:
    f = summary("reliability")["figures"]
    return (
        f"Latest result ({source('reliability')}): {f['faults']} faults with {f['n']} sessions each, "
        f"{f['tests_passed']} tests passed, {f['tests_failed']} failed; {f['lost']} lost, {f['duplicated']} "
        "duplicated."
    )


def cli_startup() -> str:
    f = summary("cli_startup")["figures"]
    return (
        f"`corral --help` in {f['help_p50']:.2f} s and `corral events` in {f['events_p50']:.2f} s at p50 here, "
        f"against {f['python_p50']:.2f} s for `python -c pass` ({source('cli_startup')})"
    )


def turn_latency() -> str:
    f = summary("turn_latency")["figures"]
    return (
        f"Latest result ({source('turn_latency')}): a whole turn through a session takes {f['ratio_p50']:.2f}x the "
        f"direct model call at p50 and {f['ratio_p95']:.2f}x at p95 ({f['turns']} turns per arm)."
    )


def threads() -> str:
    if not measured("threads"):
        return ""
    f = summary("threads")["figures"]
    return (
        f"Latest result ({source('threads')}): {f['threads']} threads each making {f['calls']} `bash sleep "
        f"{f['seconds']:g}` calls on the session's one sandbox took {f['parallel_p50']:.2f} s at p50; one agent "
        f"making the same {f['threads'] * f['calls']} calls took {f['serial_p50']:.2f} s: **{f['ratio']:.2f}x** "
        f"({f['runs']} runs per arm)."
    )


def workflow_runs() -> str:
    if not measured("runs"):
        return ""
    f = summary("runs")["figures"]
    return (
        f"Latest result ({source('runs')}): a workflow run of one phase of {f['tasks']} tasks, each a `bash sleep "
        f"{f['seconds']:g}` call on the session's one sandbox, took {f['parallel_p50']:.2f} s at p50; one agent "
        f"making the same {f['tasks']} calls in turn took {f['serial_p50']:.2f} s: **{f['ratio']:.2f}x** "
        f"({f['runs']} runs per arm)."
    )


def self_hosted() -> str:
    if not measured("self_hosted"):
        return ""
    f = summary("self_hosted")["figures"]
    return (
        f"Latest result ({source('self_hosted')}): a later `bash true` call took "
        f"{f['later_self_hosted_p50'] * 1000:.1f} ms at p50 through the self-hosted worker against "
        f"{f['later_docker_p50'] * 1000:.1f} ms on the Docker hand: "
        f"**{f['later_ratio']:.2f}x**; a session's first call, which includes the worker's claim, "
        f"{f['first_self_hosted_p50']:.2f} s against {f['first_docker_p50'] * 1000:.0f} ms ({f['first_ratio']:.1f}x; "
        f"{f['runs']} sessions per arm, {f['calls']} calls each)."
    )


def runs() -> str:
    """Every results file: its command, how long it ran, and the load it ran under."""
    rows = []
    for path in sorted(RESULTS_DIR.glob("*.md")):
        record = read_summary(path)
        rows.append(
            f"| [`{path.name}`](RESULTS/{path.name}) | `{record['command']}` | {record['minutes']:.1f} min | "
            f"{record['load_start'][0]:.1f} / {record['load_end'][0]:.1f} | {record['commit'][:7]} |"
        )
    return "\n".join(
        [
            "",
            "| results file | command (its size) | ran for | load average at start / end (1 min) | commit |",
            "| --- | --- | ---: | ---: | --- |",
            *rows,
            "",
        ]
    )


RENDER: dict[str, Callable[[], str]] = {
    "ttft": ttft,
    "ttft-new-session": ttft_new_session,
    "ttft-no-routing": ttft_no_routing,
    "ttft-repo50": ttft_repo50,
    "recovery": recovery,
    "recovery-timers": recovery_timers,
    "timers": timers,
    "routed-timeout": routed_timeout,
    "variants": variants,
    "scale": scale,
    "sandbox": sandbox,
    "long": long,
    "load": load,
    "under-load": under_load,
    "capacity": capacity,
    "overload": overload,
    "reliability": reliability,
    "cli-startup": cli_startup,
    "turn-latency": turn_latency,
    "threads": threads,
    "workflow-runs": workflow_runs,
    "self-hosted": self_hosted,
    "runs": runs,
    **OPERATIONS,
}


def rewrite(text: str, document: Path) -> str:
    """`text` with every quoted block rendered anew; links to results files made relative to `document`."""
    prefix = {ROOT: "bench/results", ROOT / "bench": "results"}.get(document.parent, "../bench/results")

    def render(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in RENDER:
            raise KeyError(f"{document.name}: no renderer for the block bench:{name} (known: {', '.join(RENDER)})")
        return match.group(1) + RENDER[name]().replace("RESULTS/", prefix + "/") + match.group(4)

    return BLOCK.sub(render, text)


def stale(documents: tuple[Path, ...] = DOCUMENTS) -> list[str]:
    """The blocks whose text differs from what the results files give, as `document: bench:NAME`."""
    found = []
    for document in documents:
        text = document.read_text()
        fresh = rewrite(text, document)
        old = {m.group(2): m.group(3) for m in BLOCK.finditer(text)}
        new = {m.group(2): m.group(3) for m in BLOCK.finditer(fresh)}
        found += [f"{document.relative_to(ROOT)}: bench:{name}" for name in old if old[name] != new[name]]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args()
    if args.check:
        found = stale()
        for line in found:
            print(f"stale: {line}")
        sys.exit(1 if found else 0)
    for document in DOCUMENTS:
        text = document.read_text()
        document.write_text(rewrite(text, document))
    print("quoted blocks rewritten from bench/results/")


if __name__ == "__main__":
    main()
