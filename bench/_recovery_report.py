"""The recovery benchmark's results: what a trial records, when the standby is due by corral's own timers (read from
its code), and the table, summary and plot of the report."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bench._report import ROOT, markdown_table, percentile
from workers.run import STICKY_TIMEOUT
from workflows.policies import INFRASTRUCTURE_RETRY, MODEL_HEARTBEAT_TIMEOUT, SANDBOX_HEARTBEAT_TIMEOUT

GOAL_P50, GOAL_P95 = 5.0, 10.0
COMMAND_SECONDS = 2
KILL_AFTER = {"harness": 0.3, "model": 0.3, "sandbox": 0.5}
"""Seconds after the model call (harness, model) or the command (sandbox) started that the kill comes."""
HEARTBEAT = {"model": MODEL_HEARTBEAT_TIMEOUT.total_seconds(), "sandbox": SANDBOX_HEARTBEAT_TIMEOUT.total_seconds()}
STICKY = STICKY_TIMEOUT.total_seconds()
RETRY = (INFRASTRUCTURE_RETRY.initial_interval or timedelta(0)).total_seconds()
GOVERNED_BY = {
    "harness": f"sticky schedule-to-start {STICKY:g} s (STICKY_TIMEOUT), then replay on the standby",
    "model": f"model heartbeat timeout {HEARTBEAT['model']:g} s (MODEL_HEARTBEAT_TIMEOUT); the turn was routed to "
    "the killed worker's own queue, so it falls back to the shared queue at once (no retry wait), the model call "
    "made again",
    "model-unrouted": f"model heartbeat timeout {HEARTBEAT['model']:g} s (MODEL_HEARTBEAT_TIMEOUT), retry after "
    f"{RETRY:g} s on the shared queue, the model call made again",
    "sandbox": f"hand heartbeat timeout {HEARTBEAT['sandbox']:g} s (SANDBOX_HEARTBEAT_TIMEOUT), retry after "
    f"{RETRY:g} s, the command resumed (not re-run)",
}
MODEL_HEARTBEAT_TIMEOUTS = re.compile(r"`model_turn` activity timed out \(HEARTBEAT\): (\d+)")


def resume_due(role: str, control: float, routing: bool = True) -> float:
    """When the standby would start the lost work if Temporal fired each timer exactly when due, in seconds
    after the kill. An activity heartbeats once as it starts and the SDK holds back the next one for 0.8 x the
    timeout, so none reaches the server between the start and the kill: the timeout counts from the start. A
    harness's workflow task is scheduled (to the dead worker's sticky queue) when the model call ends, which is
    when the next event comes in a turn that is not killed."""
    if role == "harness":
        return control + STICKY
    if role == "model" and routing:  # routed to the worker's own queue: no retry there, the workflow falls back
        return HEARTBEAT[role] - KILL_AFTER[role]
    return HEARTBEAT[role] - KILL_AFTER[role] + RETRY


@dataclass
class Trial:
    control: float
    """Seconds from the kill point to the next event in a turn that was not killed."""
    killed: float
    """Seconds from the SIGKILL to the next event."""
    resumed: float
    """Seconds from the SIGKILL to the standby starting the lost work (workflow task or activity attempt)."""


@dataclass
class RoleResult:
    role: str
    routing: bool = True
    trials: list[Trial] = field(default_factory=list)
    turns: int = 0
    lost: int = 0
    duplicated: int = 0
    notes: list[str] = field(default_factory=list)


def late(result: RoleResult) -> float:
    """How much later than due (p50) the standby started the lost work."""
    control = percentile([t.control for t in result.trials], 0.5)
    return percentile([t.resumed for t in result.trials], 0.5) - resume_due(result.role, control, result.routing)


def report(args: argparse.Namespace, results: list[RoleResult]) -> str:
    rows = []
    for result in results:
        killed = [t.killed for t in result.trials]
        control = [t.control for t in result.trials]
        added = [t.killed - t.control for t in result.trials]
        resumed = [t.resumed for t in result.trials]
        p50, p95 = percentile(killed, 0.5), percentile(killed, 0.95)
        met = p50 <= GOAL_P50 and p95 <= GOAL_P95 and result.lost == 0 and result.duplicated == 0
        rows.append(
            [
                result.role,
                str(len(killed)),
                f"{resume_due(result.role, percentile(control, 0.5), result.routing):.2f}",
                f"{percentile(resumed, 0.5):.2f}",
                f"{p50:.2f}",
                f"{p95:.2f}",
                f"{percentile(control, 0.5):.2f}",
                f"{percentile(added, 0.5):.2f}",
                str(result.lost),
                str(result.duplicated),
                "yes" if met else "no",
                GOVERNED_BY["model-unrouted" if result.role == "model" and not result.routing else result.role],
            ]
        )
    lines = [
        f"Each role: {args.kills} SIGKILLs mid-turn with a standby process of the role running; model server first "
        f"token {args.first_token_latency} s, {args.tokens_per_second:g} tokens/s; the sandbox command runs "
        f"{COMMAND_SECONDS} s. Seconds from the kill to the session's next event (its `created_at`), beside the "
        "same moment of a turn that was not killed:",
        "",
        markdown_table(
            [
                "role killed",
                "kills",
                "resume due s",
                "standby resumes p50 s",
                "next event p50 s",
                "p95 s",
                "not killed p50 s",
                "added by the kill p50 s",
                "lost",
                "duplicated",
                f"goal (<= {GOAL_P50:g} s p50, <= {GOAL_P95:g} s p95, 0 lost, 0 dup) met",
                "governed by",
            ],
            rows,
        ),
    ]
    lines += [
        "",
        "`resume due`: when the standby would start the lost work if Temporal fired every timer exactly when due "
        "(activity: heartbeat timeout - kill offset + retry back-off, none for a routed model turn, the last "
        "heartbeat being the one sent as it started; harness: end of the model call + sticky timeout). `standby "
        "resumes`: when it did (the retried activity attempt's start, the fallback's start for a routed model turn, "
        "or the workflow task after the timed-out one). Late by, p50 (the dev server fires timers up to about a "
        "second late): " + ", ".join(f"{r.role} {late(r):.2f} s" for r in results) + ".",
    ]
    notes = [f"- {r.role}: {note}" for r in results for note in r.notes]
    notes += [
        f"- {r.role}: {r.turns} user messages, every one answered once"
        for r in results
        if not r.lost and not r.duplicated
    ]
    if notes:
        lines += ["", *notes]
    if not args.model_routing:
        lines += ["", "Model workers: the shared queue only (`--no-model-routing`), as before routing."]
    lines += load_section(args.load_report)
    return "\n".join(lines)


def summary(args: argparse.Namespace, results: list[RoleResult]) -> dict[str, Any]:
    """The figures `bench.quote` quotes: per role, seconds to the next event after a kill (p50, p95), the same
    without a kill, lost and duplicated events; and the timers read from corral's code."""
    roles = {}
    for result in results:
        killed = [t.killed for t in result.trials]
        roles[result.role] = {
            "kills": len(killed),
            "next_event_p50": percentile(killed, 0.5),
            "next_event_p95": percentile(killed, 0.95),
            "control_p50": percentile([t.control for t in result.trials], 0.5),
            "resumed_p50": percentile([t.resumed for t in result.trials], 0.5),
            "lost": result.lost,
            "duplicated": result.duplicated,
        }
    return {
        "roles": roles,
        "model_routing": args.model_routing,
        "goal_p50": GOAL_P50,
        "goal_p95": GOAL_P95,
        "model_heartbeat_timeout": HEARTBEAT["model"],
        "sandbox_heartbeat_timeout": HEARTBEAT["sandbox"],
        "sticky_timeout": STICKY,
        "retry": RETRY,
    }


def load_section(name: str) -> list[str]:
    """False heartbeat timeouts under the load test's conditions: what `bench.load --output NAME` found in every
    session's history (the model activity's timeouts, by type), quoted from its results file."""
    path = ROOT / "bench" / "results" / f"{name}.md"
    if not path.exists():
        return ["", f"No load results at {path.relative_to(ROOT)}: run `python -m bench.load --output {name}`."]
    text = path.read_text()
    head = [line for line in text.splitlines() if line.startswith(("Commit:", "Command:"))]
    found = [
        line
        for line in text.split("What went wrong under load:", 1)[-1].splitlines()
        if line.startswith("- ") and ("model_turn" in line or "eartbeat" in line)
    ]
    timeouts = sum(int(match) for match in MODEL_HEARTBEAT_TIMEOUTS.findall(text))
    return [
        "",
        f"False heartbeat timeouts under load ({path.relative_to(ROOT)}; {' '.join(head)}): "
        f"**{timeouts}** `model_turn` heartbeat timeouts in every session's history, with no worker killed "
        f"(heartbeat timeout {HEARTBEAT['model']:g} s). What the load run found about the model activity:",
        "",
        *(found or ["- nothing: no `model_turn` timeout, retry or failure"]),
    ]


def figure(results: list[RoleResult]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4.5))
    for index, result in enumerate(results):
        killed = [t.killed for t in result.trials]
        control = [t.control for t in result.trials]
        axis.scatter(
            [index - 0.12] * len(control), control, color="tab:gray", label="not killed" if not index else None
        )
        axis.scatter([index + 0.12] * len(killed), killed, color="tab:red", label="SIGKILL" if not index else None)
    axis.axhline(GOAL_P50, color="tab:orange", linestyle="--", linewidth=1, label=f"goal p50 {GOAL_P50:g} s")
    axis.axhline(GOAL_P95, color="tab:red", linestyle=":", linewidth=1, label=f"goal p95 {GOAL_P95:g} s")
    axis.set_xticks(range(len(results)), [f"{r.role} worker" for r in results])
    axis.set_ylabel("seconds to the session's next event")
    axis.set_ylim(bottom=0)
    axis.set_title("Recovery after SIGKILL mid-turn, standby running")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    return fig
