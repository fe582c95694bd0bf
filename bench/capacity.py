"""Capacity: how many sessions this machine holds, each turning as fast as the model allows, before a turn's time
to first token doubles; corral beside the fastest peer that installs offline (actant), in the same run.

Both arms share one Temporal dev server (in memory) and one offline model server (first token after
`--first-token-latency`, default 0.3 s, then `--tokens-per-second`, default 50), and play the same script: the
load benchmark's turn (`bench.load`), a streamed one-line preamble, one `calculate` tool call, then an answer. A
tool call, because that is the turn an agent runtime exists for (a plain text turn is a model call with a log).

  - corral: the stack `bench.load` starts, each role a process of its own (harness, model worker, utility hand,
    stream relay), built by `workers.roles` as shipped; the clients run in this process and follow each session's
    text through the stream relay;
  - actant (`bench/peers/actant.txt`, in a virtualenv of its own under `.corral/`, made on first use): one process
    holding its worker, its in-memory stores and event publisher, and the clients, as its quickstart runs it (its
    in-memory event source reaches no other process); its `AnthropicProvider` on the model server.

The arms step the concurrency side by side (`--steps`, default 1, 8, 16, 32, 64, 128, 256, up to `--cap`): at each
step N sessions turn back to back for `--step-seconds` (and at least `--min-turns` turns each). The first step, one
session, is the single-session baseline of its arm. An arm stops stepping at the first N whose TTFT p50 is at least
`--threshold` (2) times its baseline; then up to `--refine` (3) bisection steps between the most sessions under the
threshold and the fewest at it narrow that down. The fewest sessions measured at the threshold is the arm's
capacity, reported as N / cores ("sessions per core at 2x latency"). A session's first turn is left out of the TTFT
figures. Every step's log is read back: lost and duplicated messages.

    python -m bench.capacity            # both arms, the default steps
    python -m bench.capacity --quick    # steps 1, 4, 8 of 8 s each: a smoke run (capacity-quick.md)

No goal is asserted: the figures are printed side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._capacity_arms import PeerArm, Step, corral_step
from bench._load_clients import Load, converse, open_session
from bench._load_stack import add_stack_options, corral_stack, register_script
from bench._peers import peer_python
from bench._report import ROOT, add_run_options, begin_run, markdown_table, write_results
from bench.load import script

PEER = "actant"


class Arm:
    """One arm's steps so far, and where it stopped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: list[Step] = []
        self.capacity: int | None = None
        """The fewest sessions measured at the threshold or above."""
        self.below = 1
        """The most sessions measured under the threshold."""
        self.stopped: str | None = None

    @property
    def baseline(self) -> Step:
        return self.steps[0]

    def ratio(self, step: Step, p95: bool = False) -> float:
        return (step.p95 / self.baseline.p95) if p95 else (step.p50 / self.baseline.p50)

    def record(self, step: Step, threshold: float) -> None:
        self.steps.append(step)
        print(
            f"  {self.name:7} {step.sessions:4} sessions: {step.turns} turns, {step.throughput:.1f}/s, TTFT p50 "
            f"{step.p50:.3f}s ({self.ratio(step):.2f}x), p95 {step.p95:.3f}s; lost {step.lost}, dup "
            f"{step.duplicated}, problems {len(step.problems)}",
            flush=True,
        )
        if not step.ttfts:
            self.stopped = f"no TTFT measured at {step.sessions} sessions"
        elif len(self.steps) > 1 and self.ratio(step) >= threshold:
            self.capacity = step.sessions if self.capacity is None else min(self.capacity, step.sessions)
        else:
            self.below = max(self.below, step.sessions)

    def probe(self) -> int | None:
        """The next bisection step: halfway between the most sessions under the threshold and the fewest at it;
        None once they are next to each other (or the arm found no capacity)."""
        if self.capacity is None or self.stopped is not None:
            return None
        middle = (self.below + self.capacity) // 2
        return middle if self.below < middle < self.capacity else None


async def measure(args: argparse.Namespace) -> list[Arm]:
    log_dir = Path(tempfile.mkdtemp(prefix="corral-bench-capacity-"))
    python = None if args.no_peer else peer_python(PEER, ROOT / ".corral")
    arms = [Arm("corral")] + ([] if python is None else [Arm(PEER)])
    async with corral_stack(args, log_dir) as (load, model_url):
        load.scripts[False] = f"capacity-{uuid.uuid4().hex[:8]}"
        await register_script(model_url, load.scripts[False], script(False))
        peer = None
        if python is not None:
            options = ["--address", load.config.address, "--model-url", model_url, "--model"]
            temporal = load.pid("Temporal dev server") if "Temporal dev server" in load.processes else None
            model = f"script:{load.scripts[False]}"
            peer = await PeerArm.start(PEER, python, log_dir / f"{PEER}.log", temporal, *options, model)
        print(f"stack up (logs in {log_dir}); warming up each arm", flush=True)
        try:
            await warm_up(load, peer, args)
            await step_up(load, peer, arms, args)
        finally:
            if peer is not None:
                await peer.stop()
    return arms


async def step_up(load: Load, peer: PeerArm | None, arms: list[Arm], args: argparse.Namespace) -> None:
    """The arms stepped side by side (`args.steps`), each until its threshold, then bisected (`args.refine`); an
    arm that never reached it says so in `stopped`. `bench.overload` finds corral's capacity the same way."""
    for sessions in args.steps:
        for arm in arms:
            if arm.capacity is None and arm.stopped is None:
                await advance(load, peer, arm, sessions, args)
        if all(arm.capacity is not None or arm.stopped is not None for arm in arms):
            break
    for _ in range(args.refine):
        probes = [(arm, arm.probe()) for arm in arms]
        for arm, sessions in probes:
            if sessions is not None:
                await advance(load, peer, arm, sessions, args)
    for arm in arms:
        if arm.capacity is None and arm.stopped is None:
            arm.stopped = f"under {args.threshold:g}x at every step up to {max(s.sessions for s in arm.steps)} sessions"


async def warm_up(load: Load, peer: PeerArm | None, args: argparse.Namespace) -> None:
    """One turn of one session on each arm, not counted: connections, caches and the peer's first import."""
    session = await open_session(load, -2, False)
    await converse(load, session, 1, time.monotonic())
    if peer is not None:
        await peer.step(1, 0, 1, args.turn_timeout)


async def advance(load: Load, peer: PeerArm | None, arm: Arm, sessions: int, args: argparse.Namespace) -> None:
    """One step of the arm, recorded. A peer whose process fails stops its own arm, not the run."""
    if arm.name == "corral":
        arm.record(await corral_step(load, sessions, args.step_seconds, args.min_turns), args.threshold)
        return
    assert peer is not None
    try:
        step = await peer.step(sessions, args.step_seconds, args.min_turns, args.step_seconds + args.turn_timeout)
    except Exception as exc:  # reported with the results, never hidden
        arm.stopped = f"its process failed at {sessions} sessions: {type(exc).__name__}: {exc}"
        print(f"  {arm.name} failed; its log: {peer.log}", flush=True)
        return
    arm.record(step, args.threshold)


# ---- the report -----------------------------------------------------------------------------------------------


def headline(arm: Arm, cores: int) -> str:
    if not arm.steps:
        return f"not measured ({arm.stopped})"
    alone = f"TTFT p50 {arm.baseline.p50:.3f} s alone"
    if arm.capacity is not None:
        return f"**{arm.capacity / cores:g} sessions per core** ({arm.capacity} sessions on {cores} cores; {alone})"
    last = max(step.sessions for step in arm.steps)
    return f"at least {last / cores:g} sessions per core, not reached ({arm.stopped}; {alone})"


def report(arms: list[Arm], args: argparse.Namespace) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"The model server's first token after {args.first_token_latency:g} s, then {args.tokens_per_second:g} "
        f"tokens/s; steps of {args.step_seconds:g} s (at least {args.min_turns} turns per session), then up to "
        f"{args.refine} bisection step{'' if args.refine == 1 else 's'}; capacity: the fewest sessions measured "
        f"with a TTFT p50 at least {args.threshold:g}x the arm's own single session; {cores} cores.",
        "",
    ]
    lines += [f"- {arm.name}: {headline(arm, cores)}" for arm in arms]
    rows = [
        [
            arm.name,
            step.sessions,
            step.turns,
            f"{step.throughput:.1f}",
            f"{step.p50:.3f}",
            f"{step.p95:.3f}",
            f"{arm.ratio(step):.2f}x",
            f"{arm.ratio(step, p95=True):.2f}x",
            f"{step.cpu_ms_per_turn('arm'):.1f}",
            f"{step.cpu_ms_per_turn('temporal'):.1f}",
            step.lost,
            step.duplicated,
            len(step.problems) + step.no_text,
        ]
        for arm in arms
        for step in sorted(arm.steps, key=lambda step: step.sessions)
    ]
    headers = ["arm", "sessions", "turns", "turns/s", "TTFT p50 s", "p95 s", "p50 vs alone", "p95 vs alone"]
    lines += [
        "",
        markdown_table([*headers, "CPU ms/turn", "Temporal CPU ms/turn", "lost", "duplicated", "failed turns"], rows),
    ]
    problems = [
        f"- {arm.name}, {step.sessions} sessions: {p}" for arm in arms for step in arm.steps for p in step.problems
    ]
    if problems:
        lines += ["", "Failed turns (the first 10):", "", *problems[:10]]
    lines += [
        "",
        "TTFT: the message sent -> the turn's first text delta at the client (corral: through the stream relay; "
        "actant: its live `text_delta` event), each session's first turn left out. Lost and duplicated: corral's "
        "from each session's whole log (`bench.load`'s checks), actant's from its stored messages (one user message "
        "per message sent, one tool result and one final answer per turn done). CPU per turn, while the sessions "
        "turned: the arm's own processes (corral: the harness, model and utility workers and the stream relay, its "
        "clients not counted; actant: its one process, clients included), and the Temporal server's; the model "
        "server's is neither's.",
    ]
    return "\n".join(lines)


def summary(arms: list[Arm]) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    figures: dict[str, Any] = {"cores": cores}
    for arm in arms:
        figures[arm.name] = {
            "sessions_at_2x": arm.capacity,
            "sessions_per_core": None if arm.capacity is None else arm.capacity / cores,
            "stopped": arm.stopped,
            "ttft_alone_p50": arm.baseline.p50 if arm.steps else None,
            "steps": [
                {
                    "sessions": step.sessions,
                    "turns": step.turns,
                    "turns_per_second": step.throughput,
                    "ttft_p50": step.p50,
                    "ttft_p95": step.p95,
                    "p50_ratio": arm.ratio(step),
                    "p95_ratio": arm.ratio(step, p95=True),
                    "cpu_ms_per_turn": step.cpu_ms_per_turn("arm"),
                    "temporal_cpu_ms_per_turn": step.cpu_ms_per_turn("temporal"),
                    "lost": step.lost,
                    "duplicated": step.duplicated,
                    "failed_turns": len(step.problems) + step.no_text,
                }
                for step in sorted(arm.steps, key=lambda step: step.sessions)
            ],
        }
    return figures


def add_step_options(parser: argparse.ArgumentParser, steps: str, step_seconds: float, refine: int) -> None:
    """How the capacity is stepped to: `--steps`, `--step-seconds`, `--min-turns`, `--refine`, `--threshold`, with
    the caller's defaults (`bench.overload` steps to corral's capacity the same way, in less time)."""
    parser.add_argument("--steps", default=steps, help=f"sessions per step, from 1 (default {steps})")
    parser.add_argument(
        "--step-seconds", type=float, default=step_seconds, help=f"each step's time budget (default {step_seconds:g})"
    )
    parser.add_argument("--min-turns", type=int, default=3, help="turns each session does at least (default 3)")
    parser.add_argument(
        "--refine", type=int, default=refine, help=f"bisection steps after the steps (default {refine})"
    )
    parser.add_argument("--threshold", type=float, default=2.0, help="TTFT p50 over alone that ends (default 2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_options(parser, "1,8,16,32,64,128,256", step_seconds=30.0, refine=3)
    parser.add_argument("--cap", type=int, default=256, help="most sessions a step may have (default 256)")
    add_stack_options(parser)
    parser.add_argument("--no-peer", action="store_true", help="corral's arm only")
    parser.add_argument("--output", default="capacity", help="results file name in bench/results/ (default capacity)")
    parser.add_argument("--quick", action="store_true", help="steps 1, 4, 8 of 8 s each, 1 bisection: a smoke run")
    add_run_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.step_seconds, args.min_turns, args.refine = "1,4,8", 8.0, 2, 1
        args.output = "capacity-quick" if args.output == "capacity" else args.output  # keep the full run's results
    try:
        steps = sorted({int(part) for part in args.steps.split(",")})
    except ValueError:
        parser.error(f"--steps takes whole numbers separated by commas, not {args.steps!r}")
    if (
        steps[0] != 1
        or args.min_turns < 2
        or args.step_seconds < 0
        or args.refine < 0
        or args.cap < 1
        or args.threshold <= 1
    ):
        parser.error(
            "--steps must start at 1 (the baseline); --min-turns at least 2; --cap at least 1; --threshold above 1"
        )
    args.steps = [n for n in steps if n <= args.cap]
    begin_run(args.allow_dirty)
    arms = asyncio.run(measure(args))
    body = report(arms, args)
    print()
    print(body)
    path = write_results(args.output, "Capacity: sessions per core at 2x latency", body, summary=summary(arms))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
