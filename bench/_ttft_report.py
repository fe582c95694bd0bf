"""The TTFT benchmark's results: the samples it collects, the tables it prints and the plot it draws."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from bench._report import markdown_table, mean, median, percentile

ARMS = ("direct", "coupled", "decoupled")
PEER_ARMS = ("actant",)
"""Peer runtimes measured in the same run (`--no-peers` leaves them out)."""
GOALS = {"reduction_p50": 60.0, "reduction_p95": 90.0, "ratio_p50": 1.10, "ratio_p95": 1.25}


@dataclass(frozen=True)
class SessionSpec:
    index: int
    uses_tool: bool


@dataclass
class Sample:
    arm: str
    spec: SessionSpec
    ttft: float
    script: str = ""
    stamps: dict[str, float] = field(default_factory=dict)
    """Wall-clock times (time.time()) of the steps to the first text, for the breakdown."""
    session_id: str | None = None
    problem: str | None = None
    next_ttft: float = float("nan")
    """The next message's TTFT: a second user message into the same session, once the first turn is over."""
    next_stamps: dict[str, float] = field(default_factory=dict)


# ---- reporting -------------------------------------------------------------------------------------------------

Segment = tuple[str, str, str]
SESSION_SEGMENTS: list[Segment] = [
    ("client sends -> workflow task starts (RPC, start, matching)", "sent", "workflow_task_started"),
    ("workflow task on the harness worker", "workflow_task_started", "activity_scheduled"),
    ("model activity dispatch (matching)", "activity_scheduled", "activity_started"),
    ("model worker: activity start -> model request arrives", "activity_started", "model_request"),
    ("model: first-token latency (server, configured)", "model_request", "model_first_token"),
    ("model worker -> relay (SDK stream, publish)", "model_first_token", "relay"),
    ("relay -> client (SSE)", "relay", "client"),
]
COUPLED_SEGMENTS: list[Segment] = [
    ("sandbox set-up: provision + clone (pet workflow)", "sent", "sandbox_ready"),
    ("client sends -> workflow task starts (RPC, start, matching)", "sandbox_ready", "workflow_task_started"),
    *SESSION_SEGMENTS[1:],
]
NEXT_SEGMENTS: list[Segment] = [
    ("client sends (update) -> workflow task starts (RPC, matching)", "sent", "workflow_task_started"),
    *SESSION_SEGMENTS[1:],
]
DIRECT_SEGMENTS: list[Segment] = [
    ("client -> model request arrives (HTTP)", "sent", "model_request"),
    ("model: first-token latency (server, configured)", "model_request", "model_first_token"),
    ("model -> client (SSE, SDK parse)", "model_first_token", "client"),
]


PEER_SEGMENTS: list[Segment] = [
    ("client sends -> model request arrives (signal-with-start, workflow task, activity)", "sent", "model_request"),
    ("model: first-token latency (server, configured)", "model_request", "model_first_token"),
    ("model -> client (activity's SDK stream, in-memory publisher)", "model_first_token", "client"),
]


def segments_for(arm: str, next_message: bool = False) -> list[Segment]:
    if arm in PEER_ARMS:
        return PEER_SEGMENTS
    if next_message and arm != "direct":
        return NEXT_SEGMENTS
    return {"direct": DIRECT_SEGMENTS, "coupled": COUPLED_SEGMENTS}.get(arm, SESSION_SEGMENTS)


def breakdown(
    samples: list[Sample], arm: str, ftl: float, preamble: bool, next_message: bool = False
) -> list[tuple[str, float, float, float]]:
    """(segment, p50 ms, p95 ms, mean ms) over the samples whose first text came from the first model call (of the
    first message, or of the next one)."""
    usable = []
    segments = segments_for(arm, next_message)
    for sample in samples:
        if sample.problem is not None or (sample.spec.uses_tool and not preamble and not next_message):
            continue
        stamps = dict(sample.next_stamps if next_message else sample.stamps)
        if "model_request" in stamps:
            stamps["model_first_token"] = stamps["model_request"] + ftl
        if all(start in stamps and end in stamps for _, start, end in segments):
            usable.append(stamps)
    rows = []
    for label, start, end in segments:
        spans = [(stamps[end] - stamps[start]) * 1000 for stamps in usable]
        rows.append((label, median(spans), percentile(spans, 0.95), mean(spans)))
    return rows


def ttft_row(arm: str, samples: list[Sample], sandboxes: int | None, next_message: bool = False) -> list[str]:
    def ttft(sample: Sample) -> float:
        return sample.next_ttft if next_message else sample.ttft

    good = [ttft(s) for s in samples if s.problem is None]
    plain = [ttft(s) for s in samples if s.problem is None and not s.spec.uses_tool]
    tools = [ttft(s) for s in samples if s.problem is None and s.spec.uses_tool]
    failed = len(samples) - len(good)
    return [
        arm,
        f"{len(good)}" + (f" ({failed} failed)" if failed else ""),
        f"{percentile(good, 0.5):.3f}",
        f"{percentile(good, 0.95):.3f}",
        f"{percentile(good, 0.99):.3f}",
        f"{mean(good):.3f}",
        f"{median(plain):.3f}",
        f"{median(tools):.3f}",
        "n/a" if sandboxes is None else str(sandboxes),
    ]


def report(args: argparse.Namespace, samples: dict[str, list[Sample]], sandboxes: dict[str, int]) -> str:
    def good(arm: str) -> list[float]:
        return [s.ttft for s in samples[arm] if s.problem is None]

    def good_next(arm: str) -> list[float]:
        return [s.next_ttft for s in samples[arm] if s.problem is None]

    arms = list(samples)
    next_p = {arm: (percentile(good_next(arm), 0.5), percentile(good_next(arm), 0.95)) for arm in arms}
    next_ratio = [next_p["decoupled"][i] / next_p["direct"][i] for i in (0, 1)]
    next_met = [next_ratio[0] <= GOALS["ratio_p50"], next_ratio[1] <= GOALS["ratio_p95"]]

    p = {arm: (percentile(good(arm), 0.5), percentile(good(arm), 0.95)) for arm in arms}
    reduction = [100 * (1 - p["decoupled"][i] / p["coupled"][i]) for i in (0, 1)]
    ratio = [p["decoupled"][i] / p["direct"][i] for i in (0, 1)]
    met = [
        reduction[0] >= GOALS["reduction_p50"],
        reduction[1] >= GOALS["reduction_p95"],
        ratio[0] <= GOALS["ratio_p50"],
        ratio[1] <= GOALS["ratio_p95"],
    ]
    tool_sessions = sum(1 for s in samples["direct"] if s.spec.uses_tool)
    how = "after a one-line preamble" if args.preamble else "as a bare tool call: their first text follows the tool"
    lines = [
        f"Model server: first token after {args.first_token_latency} s, then {args.tokens_per_second:g} tokens/s. "
        f"{args.sessions} sessions per arm, {args.concurrency} at a time (a random 0-{args.max_pause:g} s pause "
        f"before each), in {args.rounds} round(s) that alternate "
        f"the arms; {tool_sessions} of them call `bash` in their first turn "
        f"({how}). "
        f"First message: {args.first_message}; the next message {args.think:g} s after the first turn is over, with "
        "the `send_events` update. Temporal: in-memory dev server; workers: "
        + (
            "one process (harness + model + sandbox)."
            if args.one_process
            else f"one process per role (harness, {args.model_workers} x model, sandbox)."
        )
        + (
            " Model turns routed to the worker that served the session's previous turn (its own queue)."
            if args.model_routing
            else " No routing (`--no-model-routing`): every turn on the shared model queue."
        ),
        "",
        "TTFT in seconds (client sends the first message -> first text delta at the client):",
        "",
        markdown_table(
            ["arm", "sessions", "p50", "p95", "p99", "mean", "p50 no tool", "p50 tool", "sandboxes made"],
            [ttft_row(arm, samples[arm], sandboxes.get(arm)) for arm in arms],
        ),
        "",
        markdown_table(
            ["comparison", "p50", "p95", "goal p50", "goal p95", "met (p50 / p95)"],
            [
                [
                    "decoupled vs coupled: TTFT reduction",
                    f"{reduction[0]:.1f}%",
                    f"{reduction[1]:.1f}%",
                    f">= {GOALS['reduction_p50']:.0f}%",
                    f">= {GOALS['reduction_p95']:.0f}%",
                    f"{_yes(met[0])} / {_yes(met[1])}",
                ],
                [
                    "decoupled / direct: TTFT ratio",
                    f"{ratio[0]:.2f}",
                    f"{ratio[1]:.2f}",
                    f"<= {GOALS['ratio_p50']:.2f}",
                    f"<= {GOALS['ratio_p95']:.2f}",
                    f"{_yes(met[2])} / {_yes(met[3])}",
                ],
            ],
        ),
        "",
        f"The harness adds {1000 * (p['decoupled'][0] - p['direct'][0]):.0f} ms at p50 and "
        f"{1000 * (p['decoupled'][1] - p['direct'][1]):.0f} ms at p95 to the model's own first token.",
        "",
        "Next-message TTFT in seconds (client sends the second message -> its first text delta at the client):",
        "",
        markdown_table(
            ["arm", "sessions", "p50", "p95", "p99", "mean", "p50 no tool", "p50 tool", "sandboxes made"],
            [ttft_row(arm, samples[arm], sandboxes.get(arm), next_message=True) for arm in arms],
        ),
        "",
        markdown_table(
            ["comparison", "p50", "p95", "goal p50", "goal p95", "met (p50 / p95)"],
            [
                [
                    "new session: decoupled / direct",
                    f"{ratio[0]:.2f}",
                    f"{ratio[1]:.2f}",
                    f"<= {GOALS['ratio_p50']:.2f}",
                    f"<= {GOALS['ratio_p95']:.2f}",
                    f"{_yes(met[2])} / {_yes(met[3])}",
                ],
                [
                    "next message: decoupled / direct",
                    f"{next_ratio[0]:.2f}",
                    f"{next_ratio[1]:.2f}",
                    f"<= {GOALS['ratio_p50']:.2f}",
                    f"<= {GOALS['ratio_p95']:.2f}",
                    f"{_yes(next_met[0])} / {_yes(next_met[1])}",
                ],
            ],
        ),
        "",
        f"On the next message the harness adds {1000 * (next_p['decoupled'][0] - next_p['direct'][0]):.0f} ms at "
        f"p50 and {1000 * (next_p['decoupled'][1] - next_p['direct'][1]):.0f} ms at p95.",
    ]
    for peer in (arm for arm in arms if arm in PEER_ARMS):
        lines += ["", *peer_comparison(peer, p, next_p)]
    peers = [arm for arm in arms if arm in PEER_ARMS]
    tables = [(arm, False) for arm in ("decoupled", "direct", "coupled", *peers)] + [
        (arm, True) for arm in ("decoupled", "direct", *peers)
    ]
    for arm, next_message in tables:
        rows = breakdown(samples[arm], arm, args.first_token_latency, args.preamble, next_message)
        total = sum(row[3] for row in rows) or 1.0
        which = f"{arm} arm, " + (
            "the next message (ms)" if next_message else "the first message (ms; the first model call's text)"
        )
        lines += [
            "",
            f"Where the time goes, {which}:",
            "",
            markdown_table(
                ["step", "p50 ms", "p95 ms", "mean ms", "share of mean"],
                [
                    [label, f"{p50:.1f}", f"{p95:.1f}", f"{avg:.1f}", f"{100 * avg / total:.0f}%"]
                    for label, p50, p95, avg in rows
                ],
            ),
        ]
    problems = [s for arm in arms for s in samples[arm] if s.problem]
    if problems:
        lines += ["", f"{len(problems)} sessions had problems (left out of the figures):"]
        lines += [f"- {s.arm} #{s.spec.index}: {s.problem}" for s in problems[:10]]
    return "\n".join(lines)


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _gap(ours: float, theirs: float) -> str:
    return f"{1000 * abs(theirs - ours):.0f} ms {'ahead of' if ours < theirs else 'behind'}"


def peer_comparison(peer: str, p: dict[str, tuple[float, float]], next_p: dict[str, tuple[float, float]]) -> list[str]:
    """corral beside a peer measured in the same run: each against the bare call, and which is ahead."""
    rows = []
    for what, q in (("new session", p), ("next message", next_p)):
        for arm in ("decoupled", peer):
            rows.append([f"{what}: {arm} / direct", *(f"{q[arm][i] / q['direct'][i]:.2f}" for i in (0, 1))])
        ahead = [_yes(q["decoupled"][i] < q[peer][i]) for i in (0, 1)]
        rows.append([f"{what}: corral ahead of {peer} (p50 / p95)", *ahead])
    return [
        f"Beside {peer}, in the same run: each session a new {peer} thread, in one process holding its worker and "
        "its clients, as its quickstart runs it (its in-memory event source reaches no other process; its `bash` "
        "tool runs in a fresh directory, with no sandbox). Its TTFT: the message sent (signal-with-start of the "
        "thread's workflow) -> the first `text_delta` event at its client.",
        "",
        markdown_table(["comparison", "p50", "p95"], rows),
        "",
        f"A new session's first token: corral {_gap(p['decoupled'][0], p[peer][0])} {peer} at p50 and "
        f"{_gap(p['decoupled'][1], p[peer][1])} at p95.",
    ]


def figure(args: argparse.Namespace, samples: dict[str, list[Sample]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1, 1.2]})
    colors = {"direct": "tab:green", "decoupled": "tab:blue", "coupled": "tab:red", "actant": "tab:purple"}
    for arm in samples:
        values = sorted(s.ttft for s in samples[arm] if s.problem is None)
        if values:
            cdf.step(
                values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=arm, color=colors[arm]
            )
    cdf.set_xscale("log")
    seconds = FuncFormatter(lambda value, _: f"{value:g}")
    cdf.xaxis.set_major_formatter(seconds)
    cdf.xaxis.set_minor_formatter(seconds)
    cdf.tick_params(axis="x", which="minor", labelsize=7)
    cdf.set_xlabel("TTFT (s, log scale)")
    cdf.set_ylabel("share of sessions")
    cdf.set_title(f"TTFT per arm ({args.sessions} sessions each)")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend()
    # Not the coupled arm: beside its sandbox set-up the harness's steps would not show.
    palette = plt.get_cmap("tab20")
    colors_by_step: dict[str, Any] = {}
    barred = [arm for arm in samples if arm != "coupled"]
    for position, arm in enumerate(barred):
        left = 0.0
        for label, _, _, avg in breakdown(samples[arm], arm, args.first_token_latency, args.preamble):
            new = label not in colors_by_step
            color = colors_by_step.setdefault(label, palette(len(colors_by_step) % 20))
            bars.barh(position, avg, left=left, color=color, edgecolor="white", label=label if new else None)
            left += avg
        bars.text(left + 5, position, f"{left:.0f} ms", va="center", fontsize=8)
    bars.set_yticks(range(len(barred)), barred)
    bars.set_xlabel("mean ms to the first text delta (sessions whose first text is the first model call's)")
    bars.set_title("where the time goes")
    bars.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    fig.tight_layout()
    return fig


def summary(args: argparse.Namespace, samples: dict[str, list[Sample]], sandboxes: dict[str, int]) -> dict[str, Any]:
    """The figures `bench.quote` quotes: per arm p50/p95 of the first and the next message, the comparisons, the
    goals, the decoupled arm's model-activity set-up, the peers measured beside corral (`peers`, each an arm of its
    own), and the run's parameters."""
    arms: dict[str, Any] = {}
    for arm in samples:
        good = [s for s in samples[arm] if s.problem is None]
        first, following = [s.ttft for s in good], [s.next_ttft for s in good]
        arms[arm] = {
            "sessions": len(good),
            "failed": len(samples[arm]) - len(good),
            "p50": percentile(first, 0.5),
            "p95": percentile(first, 0.95),
            "next_p50": percentile(following, 0.5),
            "next_p95": percentile(following, 0.95),
            "sandboxes": sandboxes.get(arm),
        }
    setup = {
        label: p50
        for label, p50, _, _ in breakdown(samples["decoupled"], "decoupled", args.first_token_latency, args.preamble)
    }
    return {
        "first_token_latency": args.first_token_latency,
        "tokens_per_second": args.tokens_per_second,
        "sessions_per_arm": args.sessions,
        "concurrency": args.concurrency,
        "model_workers": args.model_workers,
        "model_routing": args.model_routing,
        "repo_mb": args.repo_mb,
        "arms": arms,
        "peers": [arm for arm in samples if arm in PEER_ARMS],
        "goals": GOALS,
        "model_activity_setup_ms_p50": setup.get(SESSION_SEGMENTS[3][0]),
    }
